#!/bin/sh
# MaskBench side by side: tern and xgrammar on the same files, tokenizer and
# machine, one thread each, run one after the other in this script.
# Usage: bench/grammar_bench.sh [TERN_BIN] [TOKENIZER_DIR] [DATA_DIR] [LIMIT]
# Defaults: build/tern, ../shared/tokenizers/llama3, ../shared/data/maskbench-dev, 100.
set -e
cd "$(dirname "$0")/.."
BIN=${1:-build/tern}
TOK=${2:-../shared/tokenizers/llama3}
DATA=${3:-../shared/data/maskbench-dev}
LIMIT=${4:-100}
echo "== tern"
"$BIN" grammar bench --tokenizer "$TOK" --data "$DATA" --limit "$LIMIT" | tail -n 1
echo "== xgrammar (WebAssembly under Node)"
node bench/grammar_xgrammar.mjs --tokenizer "$TOK" --data "$DATA" --limit "$LIMIT"
