#!/bin/sh
# CI check for machines with nvcc but no GPU: configures a CUDA build dir
# and builds only the CUDA kernels (target tern_cuda), then compiles the host
# glue (src/model/backend_cuda.c) with TERN_CUDA as strict C17.
#   compile_check.sh NVCC BUILD_DIR CC
# The host glue needs the CUDA runtime and cuBLAS / cuBLASLt headers; a toolkit that
# ships nvcc without cuBLAS compiles the kernels only and the test reports
# itself skipped (exit 77), naming what is missing.
set -e
NVCC=$1; DIR=$2; CC=${3:-cc}
CUDA_HOME=$(dirname "$(dirname "$(readlink -f "$NVCC")")")
cmake -S . -B "$DIR" -DCMAKE_BUILD_TYPE=Release -DTERN_CUDA=ON -DCMAKE_CUDA_COMPILER="$NVCC" > "$DIR.log" 2>&1 || { cat "$DIR.log"; exit 1; }
cmake --build "$DIR" --target tern_cuda -j2
echo "cuda kernels compile"

# Directories that may hold a header: the toolkit's include dirs (flat or
# per-target layout), then the system's.
find_header() {
  for d in "$CUDA_HOME/include" "$CUDA_HOME"/targets/*/include /usr/local/cuda/include /usr/include; do
    if [ -f "$d/$1" ]; then echo "$d"; return 0; fi
  done
  return 1
}
RT=$(find_header cuda_runtime.h) || { echo "SKIP host glue: cuda_runtime.h not found under $CUDA_HOME"; exit 77; }
BLAS=$(find_header cublas_v2.h) || { echo "SKIP host glue: cuBLAS headers (cublas_v2.h) not installed with this nvcc"; exit 77; }
"$CC" -std=c17 -Wall -Wextra -Wno-unused-parameter -Werror -D_GNU_SOURCE -DTERN_CUDA=1 -Isrc -Iinclude \
  -I"$RT" -I"$BLAS" -c src/model/backend_cuda.c -o "$DIR/backend_cuda_check.o"
"$CC" -std=c17 -Wall -Wextra -Wno-unused-parameter -Werror -D_GNU_SOURCE -DTERN_CUDA=1 -Isrc -Iinclude \
  -I"$RT" -I"$BLAS" -c src/model/backend_cuda_moe.c -o "$DIR/backend_cuda_moe_check.o"
"$CC" -std=c17 -Wall -Wextra -Wno-unused-parameter -Werror -D_GNU_SOURCE -DTERN_CUDA=1 -Isrc -Iinclude \
  -I"$RT" -I"$BLAS" -c src/model/backend_cuda_lt.c -o "$DIR/backend_cuda_lt_check.o"
echo "cuda host glue compiles"
