#!/bin/sh
# Encode throughput of tern's tokenizer next to HF tokenizers (one thread),
# on the generated 1 MB multilingual corpus. Usage (from the repo root,
# after a build): bench/bench_tokenizer.sh [BUILD_DIR] [BYTES]
set -e
BUILD=${1:-build}
BYTES=${2:-1048576}
SHARED=${TERN_SHARED:-../shared}
CORPUS=$(mktemp /tmp/tern_tok_corpus.XXXXXX)
trap 'rm -f "$CORPUS"' EXIT
python3 tests/tokenizer/gen_corpus.py --bytes "$BYTES" > "$CORPUS"
for d in "$SHARED/tokenizers/qwen3" "$SHARED/tokenizers/llama3" "$SHARED/tokenizers/gemma3" \
         "$SHARED/models/stories260K" models/tern-demo; do
    "$BUILD/bench/bench_tokenizer" "$d" "$CORPUS" 3
    RAYON_NUM_THREADS=1 node bench/bench_tokenizer_oracle.js "$d" "$CORPUS" 3
done
