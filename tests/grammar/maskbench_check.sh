#!/bin/sh
# MaskBench development sample with the Llama-3 tokenizer: every schema
# compiles or is refused as unsupported, no invalid instance is accepted,
# and the token-level verdict always equals the byte-level one. Prints the
# summary (with timings, informative only).
set -eu
BIN=${TERN_BIN:-build/tern}
SHARED=${TERN_SHARED:-../shared}
LIMIT=${1:-100000}
OUT=$("$BIN" grammar bench --tokenizer "$SHARED/tokenizers/llama3" --data "$SHARED/data/maskbench-dev" --limit "$LIMIT" | tail -n 1)
echo "$OUT"
echo "$OUT" | python3 -c '
import json, sys
d = json.loads(sys.stdin.read())
assert d["invalid_accepted"] == 0, "invalid instances accepted"
assert d["token_vs_byte_mismatch"] == 0, "token and byte level disagree"
assert d["errors"] == 0, "errors"
assert d["compiled"] + d["unsupported"] + d["failed"] == d["schemas"]
assert d["compiled"] > 0.8 * d["schemas"], "too few schemas compiled"
assert d["valid_accepted"] > 0.8 * d["valid_total"], "too few valid instances accepted"
'
