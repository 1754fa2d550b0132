#!/bin/sh
# CI check for machines with nvcc but no GPU: configures a CUDA build dir
# and builds only the CUDA kernels (target tern_cuda), then compiles the host
# glue (src/model/backend_cuda.c) with TERN_CUDA as strict C17.
#   compile_check.sh NVCC BUILD_DIR CC
set -e
NVCC=$1; DIR=$2; CC=${3:-cc}
CUDA_HOME=$(dirname "$(dirname "$NVCC")")
cmake -S . -B "$DIR" -DCMAKE_BUILD_TYPE=Release -DTERN_CUDA=ON -DCMAKE_CUDA_COMPILER="$NVCC" > "$DIR.log" 2>&1 || { cat "$DIR.log"; exit 1; }
cmake --build "$DIR" --target tern_cuda -j2
"$CC" -std=c17 -Wall -Wextra -Wno-unused-parameter -Werror -D_GNU_SOURCE -DTERN_CUDA=1 -Isrc -Iinclude \
  -I"$CUDA_HOME/include" -c src/model/backend_cuda.c -o "$DIR/backend_cuda_check.o"
echo "cuda sources compile"
