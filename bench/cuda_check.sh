#!/bin/bash
# The CUDA backend's check on a machine with an NVIDIA GPU (docs/cuda.md):
# builds tern with CUDA, runs the CUDA-vs-CPU tests (ctest -L cuda), makes
# random Llama-shaped fixtures (1B and 8B, bf16 and 4-bit) and runs
# bench_cuda over them (logits check against the CPU + speed vs roofline).
#
#   bench/cuda_check.sh OUT_DIR [TOKENIZER_DIR] [STORIES_DIR]
#
# TOKENIZER_DIR: a Llama 3 tokenizer folder (default .device/llama3);
# STORIES_DIR: ../shared/models/stories260K's tokenizer, copied to
# ../shared/models/stories260K when that is missing (the tests read it).
# SIZES="1b 8b" picks the fixtures; JOBS the build parallelism.
set -u
OUT=${1:?usage: bench/cuda_check.sh OUT_DIR [TOKENIZER_DIR] [STORIES_DIR]}
TOK=${2:-.device/llama3}
STORIES=${3:-.device/stories260K}
SIZES=${SIZES:-1b 8b}
B=${BUILD_DIR:-build-cuda-check}
FX=${FX:-/tmp/tern-fixtures}
mkdir -p "$OUT" "$FX"
t0=$(date +%s)
stamp() { echo "== $(( $(date +%s) - t0 ))s: $*"; }

nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.mem,driver_version --format=csv > "$OUT/gpu.txt" 2>&1
cat "$OUT/gpu.txt"
stamp build
if ! { cmake -S . -B "$B" -DCMAKE_BUILD_TYPE=Release -DTERN_CUDA=ON && cmake --build "$B" -j "${JOBS:-16}" --target tern_cli bench_cuda make_fixture cuda_test_cuda; } > "$OUT/build.log" 2>&1; then
  tail -40 "$OUT/build.log"
  exit 1
fi
if [ ! -f ../shared/models/stories260K/tokenizer.json ] && [ -d "$STORIES" ]; then
  mkdir -p ../shared/models && cp -r "$STORIES" ../shared/models/stories260K
fi
stamp tests
ctest --test-dir "$B" -R '^cuda\.' --output-on-failure -V > "$OUT/test.log" 2>&1
echo "ctest rc $?"
grep -E "rel err|OK \]|FAILED|SKIPPED|PASSED|identical|differ|error" "$OUT/test.log" | grep -v "^.*matmul kind.*mat [12]" | head -70

for s in $SIZES; do
  stamp "fixtures $s"
  [ -d "$FX/llama-$s-bf16" ] || "$B/tools/make_fixture" --family llama --preset "$s" --dtype bf16 --tokenizer "$TOK" --out "$FX/llama-$s-bf16" > /dev/null
  [ -d "$FX/llama-$s-q4" ] || "$B/tern" convert "$FX/llama-$s-bf16" "$FX/llama-$s-q4" --bits 4 --group-size 64 2> /dev/null
done
stamp bench
M=""
for s in $SIZES; do M="$M $FX/llama-$s-bf16 $FX/llama-$s-q4"; done
set -o pipefail
"$B/bench/bench_cuda" --prompt 128 --tokens 66 --check 32 $M 2>&1 | tee "$OUT/bench.txt"
stamp done
