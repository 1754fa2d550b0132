#!/bin/bash
# The CUDA backend's check on a machine with an NVIDIA GPU (docs/cuda.md):
# runs the CUDA-vs-CPU tests (tests/cuda/test_cuda.c), makes random
# Llama-shaped fixtures (1B and 8B, bf16 and 4-bit) and runs bench_cuda over
# them (logits check against the CPU + speed against the roofline).
#
#   bench/cuda_check.sh OUT_DIR
#
# Binaries: BIN=DIR uses a build dir made elsewhere (tern, bench/bench_cuda,
# tools/make_fixture, tests/cuda_test_cuda; LIBS=DIR adds shared libraries
# the machine lacks); else it builds with -DTERN_CUDA=ON into build-cuda-check.
# TOK: a Llama 3 tokenizer folder (default .device/llama3). SHARED: the
# ../shared stand-in holding models/stories260K (default .device/shared).
# SIZES="1b 8b" picks the bench fixtures.
set -u
OUT=${1:?usage: bench/cuda_check.sh OUT_DIR}
TOK=${TOK:-.device/llama3}
SIZES=${SIZES:-1b 8b}
FX=${FX:-/tmp/tern-fixtures}
export TERN_SHARED=$(realpath "${SHARED:-.device/shared}")
mkdir -p "$OUT" "$FX"
t0=$(date +%s)
stamp() { echo "== $(( $(date +%s) - t0 ))s: $*"; }

nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.mem,driver_version --format=csv > "$OUT/gpu.txt" 2>&1
cat "$OUT/gpu.txt"
if [ -n "${BIN:-}" ]; then
  B=$(realpath "$BIN")
  cudalib=$(dirname "$(find /usr/local /usr/lib /opt -name 'libcublas.so.13*' 2>/dev/null | head -1)")
  cudart=$(dirname "$(find /usr/local /usr/lib /opt -name 'libcudart.so.13*' 2>/dev/null | head -1)")
  export LD_LIBRARY_PATH=${LIBS:+$(realpath "$LIBS"):}$cudalib:$cudart:${LD_LIBRARY_PATH:-}
  echo "cuda libs: $cudalib $cudart"
  ldd "$B/tern" | grep "not found" && exit 1
else
  B=build-cuda-check
  stamp build
  if ! { cmake -S . -B "$B" -DCMAKE_BUILD_TYPE=Release -DTERN_CUDA=ON &&
         cmake --build "$B" -j 16 --target tern_cli bench_cuda make_fixture cuda_test_cuda; } > "$OUT/build.log" 2>&1; then
    tail -40 "$OUT/build.log"
    exit 1
  fi
  B=$(realpath "$B")
fi
export TERN_BUILD=$B TERN_BIN=$B/tern
stamp tests
timeout 300 "$B/tests/cuda_test_cuda" > "$OUT/test.log" 2>&1
echo "test rc $?"
grep -E "rel err|OK \]|FAILED|SKIPPED|PASSED|identical|differ|rror" "$OUT/test.log" | grep -v "mat [12]:" | head -90

for s in $SIZES; do
  stamp "fixtures $s"
  [ -d "$FX/llama-$s-bf16" ] || "$B/tools/make_fixture" --family llama --preset "$s" --dtype bf16 --tokenizer "$TOK" --out "$FX/llama-$s-bf16" > /dev/null
  [ -d "$FX/llama-$s-q4" ] || "$B/tern" convert "$FX/llama-$s-bf16" "$FX/llama-$s-q4" --bits 4 --group-size 64 2> /dev/null
done
stamp bench
M=""
for s in $SIZES; do M="$M $FX/llama-$s-bf16 $FX/llama-$s-q4"; done
"$B/bench/bench_cuda" --prompt 128 --tokens 66 --check 32 $M 2>&1 | tee "$OUT/bench.txt"
stamp done
