#!/bin/bash
# The CUDA backend's check on a machine with an NVIDIA GPU (docs/cuda.md):
# the GEMV micro-benchmark (bench_cuda --gemv: every GEMV kernel on random
# weights of the 8B/1B shapes, no model files), the CUDA-vs-CPU tests
# (tests/cuda/test_cuda.c; the product test covers every GEMV kernel),
# random Llama-shaped fixtures (1B and 8B, bf16 and 4-bit) and bench_cuda
# over them (logits check against the CPU, speed against the roofline,
# a per-kernel profile of one eager decode step).
#
#   bench/cuda_check.sh OUT_DIR
#
# Binaries: BIN=DIR uses a build dir made elsewhere (tern, bench/bench_cuda,
# tools/make_fixture, tests/cuda_test_cuda; LIBS=DIR adds shared libraries
# the machine lacks); else it builds with -DTERN_CUDA=ON into build-cuda-check.
# TOK: a Llama 3 tokenizer folder (default .device/llama3). SHARED: the
# ../shared stand-in holding models/stories260K (default .device/shared).
# SIZES="1b 8b" picks the bench fixtures. GEMV: the kernels the tests and
# the model bench use ("k" or "kb,k4,k8" as TERN_CUDA_GEMV, by name;
# "fastest": the micro-benchmark's fastest at batch 1 on the 8B shapes, per
# kind; default "keep": the built-in defaults, tcu_opts_init). AB="1b":
# sizes also benched with the plain kernel for an A/B at the model level
# (default "": skipped). PDL="1b 8b": sizes benched again with programmatic
# dependent launch flipped (TERN_CUDA_PDL) and the CPU check ("" skips).
# EXTRA="VAR=VAL ...": one more 1b bench per assignment with it set (e.g.
# EXTRA="TERN_CUDA_ATTN_FUSE=0 TERN_CUDA_GEMV=plain").
set -u
OUT=${1:?usage: bench/cuda_check.sh OUT_DIR}
TOK=${TOK:-.device/llama3}
SIZES=${SIZES:-1b 8b}
AB=${AB-}
PDL=${PDL-1b 8b}
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

stamp "gemv micro-benchmark"
timeout 240 "$B/bench/bench_cuda" --gemv > "$OUT/gemv.txt" 2>&1
echo "gemv rc $?"
# the compact GB/s table at T = 1, the decode-step summary and the check line
awk '/^== GB\/s/{p=1} /^== GEMV-only/{p=2} p==1 && ($4 == 1 || $1 == "mdl" || /^==/) {print} p==2 {print}' "$OUT/gemv.txt"
grep -E "NO \(|rror" "$OUT/gemv.txt" | head -20
GEMV=${GEMV:-keep}
if [ "$GEMV" = fastest ]; then
  best() { awk -v k="$1" '$1 == "8b" && $2 == k && $3 == 1 && NF > 6 {b=$NF} END {print b}' "$OUT/gemv.txt"; }
  vb=$(best bf16); v4=$(best q4g64); v8=$(best q8g64)
  GEMV=${vb:-plain},${v4:-plain},${v8:-plain}
fi
if [ "$GEMV" != keep ]; then
  export TERN_CUDA_GEMV=$GEMV
fi
echo "GEMV kernels for the tests and the model bench (bf16,q4,q8): ${TERN_CUDA_GEMV:-built-in default}"

stamp tests
timeout 300 "$B/tests/cuda_test_cuda" > "$OUT/test.log" 2>&1
echo "test rc $?"
grep -E "rel err|OK \]|FAILED|SKIPPED|PASSED|identical|differ|rror" "$OUT/test.log" | grep -v "matmul kind" | head -60
# products: worst relative error per GEMV kernel (every kind, n_in, T)
awk '/matmul kind/ && / gemv / {for (i = 1; i < NF; i++) {if ($i == "gemv") v = $(i + 1); if ($i == "err") e = $(i + 1)}
     if (e + 0 > m[v] + 0) m[v] = e} END {for (v in m) printf "products gemv %s: worst rel err %s\n", v, m[v]}' "$OUT/test.log" | sort

for s in $SIZES; do
  stamp "fixtures $s"
  [ -d "$FX/llama-$s-bf16" ] || "$B/tools/make_fixture" --family llama --preset "$s" --dtype bf16 --tokenizer "$TOK" --out "$FX/llama-$s-bf16" > /dev/null
  [ -d "$FX/llama-$s-q4" ] || "$B/tern" convert "$FX/llama-$s-bf16" "$FX/llama-$s-q4" --bits 4 --group-size 64 2> /dev/null
done
stamp bench
M=""
for s in $SIZES; do M="$M $FX/llama-$s-bf16 $FX/llama-$s-q4"; done
"$B/bench/bench_cuda" --prompt 128 --tokens 66 --check 32 --prefill ${PREFILL:-2048} $M 2>&1 | tee "$OUT/bench.txt"
if [ -n "$AB" ]; then
  stamp "A/B: the plain GEMV on $AB"
  M=""
  for s in $AB; do M="$M $FX/llama-$s-bf16 $FX/llama-$s-q4"; done
  TERN_CUDA_GEMV=plain "$B/bench/bench_cuda" --prompt 128 --tokens 66 --check 0 $M 2>&1 | tee "$OUT/bench-plain.txt"
fi
if [ -n "$PDL" ]; then
  flip=$([ "${TERN_CUDA_PDL:-1}" = 1 ] && echo 0 || echo 1)
  stamp "A/B: TERN_CUDA_PDL=$flip on $PDL"
  M=""
  for s in $PDL; do M="$M $FX/llama-$s-bf16 $FX/llama-$s-q4"; done
  TERN_CUDA_PDL=$flip "$B/bench/bench_cuda" --prompt 128 --tokens 66 --check 32 $M 2>&1 | tee "$OUT/bench-pdl$flip.txt"
fi
for kv in ${EXTRA:-}; do
  stamp "A/B: $kv on 1b"
  env "$kv" "$B/bench/bench_cuda" --prompt 128 --tokens 66 --check 32 "$FX/llama-1b-bf16" "$FX/llama-1b-q4" 2>&1 |
    tee "$OUT/bench-${kv%%=*}.txt"
done
stamp done
