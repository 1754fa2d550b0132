# CUDA: test_cuda.c (CUDA vs CPU on a GPU; skips without one) is picked up
# like every test. Where nvcc exists but this build is CPU-only, a cheap
# check compiles the CUDA sources in a side build dir (label cuda, no-asan).
set_tests_properties(cuda.test_cuda PROPERTIES LABELS "cuda;no-asan" TIMEOUT 600)
find_program(TERN_NVCC nvcc PATHS /usr/local/cuda/bin)
if(TERN_NVCC AND NOT TERN_CUDA)
  tern_add_script_test(NAME cuda.compile
    COMMAND sh ${CMAKE_SOURCE_DIR}/tests/cuda/compile_check.sh ${TERN_NVCC} ${CMAKE_BINARY_DIR}/cuda-compile ${CMAKE_C_COMPILER}
    TIMEOUT 900 LABELS "cuda;no-asan")
  set_tests_properties(cuda.compile PROPERTIES SKIP_RETURN_CODE 77)
endif()
set_tests_properties(cuda.test_cuda_serving PROPERTIES LABELS "cuda;no-asan" TIMEOUT 600)
set_tests_properties(cuda.test_cuda_moe PROPERTIES LABELS "cuda;no-asan" TIMEOUT 600)
# The sampling kernel's source run on the CPU (pthreads for its threads)
# against tests/sample_ref.h: CI checks its logic without a GPU.
find_program(TERN_CXX NAMES c++ g++ clang++)
if(TERN_CXX)
  tern_add_script_test(NAME cuda.sample_emu
    COMMAND sh ${CMAKE_SOURCE_DIR}/tests/cuda/sample_emu.sh ${CMAKE_BINARY_DIR}/sample-emu ${TERN_CXX}
    TIMEOUT 300 LABELS "cuda;no-asan")
  set_tests_properties(cuda.sample_emu PROPERTIES SKIP_RETURN_CODE 77)
endif()
