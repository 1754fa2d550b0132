#!/bin/sh
# MaskBench side by side: tern and xgrammar on the same files, tokenizer and
# machine, one thread each, run one after the other in this script, then
# one table: compiled / unsupported / failed schemas, valid and invalid
# instances accepted, compile p50/p99, mask avg/p50/p99/max (CPU time).
# Usage: bench/grammar_bench.sh [TERN_BIN] [TOKENIZER_DIR] [DATA_DIR] [LIMIT]
# Defaults: build/tern, ../shared/tokenizers/llama3, ../shared/data/maskbench-dev,
# every file (LIMIT: the first N files in name order).
# xgrammar is web-xgrammar (WebAssembly under Node, from tests/oracle:
# `make oracles`); its times include WASM and JS-copy overheads.
set -e
cd "$(dirname "$0")/.."
BIN=${1:-build/tern}
TOK=${2:-../shared/tokenizers/llama3}
DATA=${3:-../shared/data/maskbench-dev}
LIMIT=${4:-}
OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT
if [ -n "$LIMIT" ]; then
    "$BIN" grammar bench --tokenizer "$TOK" --data "$DATA" --limit "$LIMIT" | tail -n 1 > "$OUT/tern.json"
    node bench/grammar_xgrammar.mjs --tokenizer "$TOK" --data "$DATA" --limit "$LIMIT" | tail -n 1 > "$OUT/xg.json"
else
    "$BIN" grammar bench --tokenizer "$TOK" --data "$DATA" | tail -n 1 > "$OUT/tern.json"
    node bench/grammar_xgrammar.mjs --tokenizer "$TOK" --data "$DATA" | tail -n 1 > "$OUT/xg.json"
fi
python3 - "$OUT/tern.json" "$OUT/xg.json" <<'PY'
import json, sys
t, x = (json.load(open(p)) for p in sys.argv[1:3])
rows = [("schemas", "schemas"), ("compiled", "compiled"), ("unsupported", "unsupported"), ("failed", "failed"),
        ("valid accepted", None), ("invalid accepted", None), ("compile ms p50", "compile_ms_p50"),
        ("compile ms p99", "compile_ms_p99"), ("masks", "masks"), ("mask us avg", "mask_us_avg"),
        ("mask us p50", "mask_us_p50"), ("mask us p99", "mask_us_p99"), ("mask us max", "mask_us_max")]
def cell(d, label, key):
    if key is None:
        k = "valid" if label.startswith("valid") else "invalid"
        return "%s / %s" % (d.get(k + "_accepted", "-"), d.get(k + "_total", "-"))
    return str(d.get(key, "-"))
print("%-18s %16s %16s" % ("", t.get("engine", "tern"), x.get("engine", "xgrammar")))
for label, key in rows:
    print("%-18s %16s %16s" % (label, cell(t, label, key), cell(x, label, key)))
PY
