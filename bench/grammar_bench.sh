#!/bin/sh
# MaskBench side by side: tern and xgrammar on the same files, tokenizer and
# machine, one thread each, run one after the other in this script, then
# one table: compiled / unsupported / failed schemas, valid and invalid
# instances accepted, compile p50/p99, mask avg/p50/p99/max (CPU time).
#
# Usage: bench/grammar_bench.sh [--tern BIN] [--tokenizer DIR] [--data DIR]
#                               [--every N] [--limit N] [--budget SEC]
# Defaults: build/tern, ../shared/tokenizers/llama3, ../shared/data/maskbench-dev,
# every file. --every N: every N-th file in name order (a sample spread over
# the corpus's sources); --limit N: the first N of those; --budget SEC:
# xgrammar runs first and starts no new file after SEC seconds of wall time,
# then tern runs on exactly the files xgrammar finished (the table says how
# many), so a loaded machine still gets a side-by-side in bounded time.
# xgrammar is web-xgrammar (WebAssembly under Node, from tests/oracle:
# `make oracles`); its times include WASM and JS-copy overheads.
set -e
cd "$(dirname "$0")/.."
BIN=build/tern
TOK=../shared/tokenizers/llama3
DATA=../shared/data/maskbench-dev
EVERY=1
LIMIT=
BUDGET=
while [ $# -gt 0 ]; do
    case "$1" in
    --tern) BIN=$2; shift 2 ;;
    --tokenizer) TOK=$2; shift 2 ;;
    --data) DATA=$2; shift 2 ;;
    --every) EVERY=$2; shift 2 ;;
    --limit) LIMIT=$2; shift 2 ;;
    --budget) BUDGET=$2; shift 2 ;;
    *) echo "grammar_bench.sh: unknown option $1 (see the usage at the top of the script)" >&2; exit 2 ;;
    esac
done
case "$EVERY" in '' | *[!0-9]* | 0) echo "grammar_bench.sh: --every wants a positive integer" >&2; exit 2 ;; esac
OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT
# the sample: links to every N-th file (name order), the first LIMIT of them
DATA_ABS=$(cd "$DATA" && pwd)
mkdir "$OUT/data"
ls "$DATA_ABS" | grep '\.json$' | LC_ALL=C sort | awk -v n="$EVERY" -v l="${LIMIT:-0}" \
    '(NR - 1) % n == 0 { k++; if (l == 0 || k <= l) print }' | while read -r f; do
    ln -s "$DATA_ABS/$f" "$OUT/data/$f"
done
N=$(ls "$OUT/data" | wc -l)
if [ -n "$BUDGET" ]; then
    node bench/grammar_xgrammar.mjs --tokenizer "$TOK" --data "$OUT/data" --budget "$BUDGET" | tail -n 1 > "$OUT/xg.json"
else
    node bench/grammar_xgrammar.mjs --tokenizer "$TOK" --data "$OUT/data" | tail -n 1 > "$OUT/xg.json"
fi
DONE=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1])).get("files_done", 0))' "$OUT/xg.json")
"$BIN" grammar bench --tokenizer "$TOK" --data "$OUT/data" --limit "$DONE" | tail -n 1 > "$OUT/tern.json"
python3 - "$OUT/tern.json" "$OUT/xg.json" "$N" "$EVERY" <<'PY'
import json, sys
t, x = (json.load(open(p)) for p in sys.argv[1:3])
n, every = int(sys.argv[3]), int(sys.argv[4])
print("files: %d of the %d sampled (every %d-th file)%s" % (x.get("files_done", 0), n, every,
      ", xgrammar's time budget ran out" if x.get("budget_hit") else ""))
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
