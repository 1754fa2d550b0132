#!/bin/sh
# The model is opaque outside src/model: no source outside that folder
# includes the model's body (model_int.h) or drives a backend table
# (backend.h, backend_cuda.h) - the engine, server and CLI go through
# model.h. Tests of the model's internals (tests/model, tests/cuda) may read
# the body; tests and benchmarks that compare or wrap backends
# (tests/engine/test_device_sampling.c, bench/bench_cuda.c, bench_decode's
# --profile) may use the table, not the body.
#   layering.sh   (from the repository root)
set -eu
cd "${TERN_ROOT:-.}"
fail=0
body=$(grep -rlE '#include "model/model_int\.h"' src bench tests tools examples 2>/dev/null |
       grep -vE '^(src/model/|tests/model/|tests/cuda/)' || true)
if [ -n "$body" ]; then
    echo "include the model's body (model/model_int.h) outside src/model:"
    printf '%s\n' "$body"
    fail=1
fi
table=$(grep -rlE '#include "model/backend(_cuda)?\.h"' src bench tests tools examples 2>/dev/null |
        grep -vE '^(src/model/|tests/model/|tests/cuda/|tests/engine/test_device_sampling\.c|bench/bench_cuda\.c|bench/bench_decode\.c)' || true)
if [ -n "$table" ]; then
    echo "include a backend table header outside src/model (go through model/model.h):"
    printf '%s\n' "$table"
    fail=1
fi
n=$(ls src/engine/*.c src/engine/*.h | wc -l)
[ "$n" -gt 0 ] || { echo "no engine sources found (run from the repository root)"; exit 1; }
[ "$fail" -eq 0 ] && echo "model layering holds ($n engine files, none reach past model.h)"
exit "$fail"
