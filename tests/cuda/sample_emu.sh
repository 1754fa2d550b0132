#!/bin/sh
# Runs the sampling kernel's source (src/tensor/cuda/sample.cu, everything
# before its launchers) on the CPU against tests/sample_ref.h - see
# tests/cuda/sample_emu.cpp. Needs a C++ compiler, no GPU and no CUDA.
#   sample_emu.sh BUILD_DIR [CXX]
set -e
DIR=$1; CXX=${2:-c++}
command -v "$CXX" > /dev/null 2>&1 || { echo "SKIP: no C++ compiler ($CXX)"; exit 77; }
mkdir -p "$DIR"
sed -n '1,/^\/\/ ---- launchers ----/p' src/tensor/cuda/sample.cu > "$DIR/sample_body.inc"
grep -q 'sample_rows_kernel' "$DIR/sample_body.inc" || { echo "sample.cu: no kernel before the launchers marker"; exit 1; }
"$CXX" -std=c++17 -O2 -w -I tests/cuda/emu -I "$DIR" -I src -I tests tests/cuda/sample_emu.cpp -o "$DIR/sample_emu" -lpthread
"$DIR/sample_emu" 1000 8
"$DIR/sample_emu" 4099 4
