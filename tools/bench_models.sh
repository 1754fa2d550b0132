#!/bin/sh
# Writes the decode-benchmark models (random weights, real shapes) into a
# git-ignored folder: a ~0.5B Qwen2-shaped (Qwen2.5-0.5B) and a ~1B
# Llama-shaped (Llama-3.2-1B) model in bf16, each also converted to 8-bit
# and 4-bit (group 64) and to FP8 (E4M3, 128x128 block scales) with tern
# convert. About 9 GB in all.
#
#   tools/bench_models.sh [BUILD_DIR] [OUT_DIR]   (defaults: build, build/bench-models)
#   then: BUILD_DIR/bench/bench_decode --prompt 512 OUT_DIR/*
set -e
B=${1:-build}
OUT=${2:-$B/bench-models}
SHARED=${TERN_SHARED:-../shared}
mkdir -p "$OUT"
gen() { # name family preset vocab
    [ -f "$OUT/$1-bf16/config.json" ] || "$B/tools/make_fixture" --family "$2" --preset "$3" --vocab "$4" \
        --dtype bf16 --out "$OUT/$1-bf16" --tokenizer "$SHARED/models/stories260K"
    for bits in 8 4; do
        [ -f "$OUT/$1-q$bits/config.json" ] || "$B/tern" convert "$OUT/$1-bf16" "$OUT/$1-q$bits" --bits $bits
    done
    [ -f "$OUT/$1-fp8/config.json" ] || "$B/tern" convert "$OUT/$1-bf16" "$OUT/$1-fp8" --fp8
}
gen qwen2-0.5b qwen2 0.5b 151936
gen llama-1b llama 1b 128256
ls -d "$OUT"/*
