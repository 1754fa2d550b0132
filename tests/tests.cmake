# Test discovery: tests/<subsystem>/test_*.c each become a cmocka program and
# a ctest entry named <subsystem>.<name>; tests/<subsystem>/tests.cmake may
# add script tests (oracle comparisons). Fuzz entry points tests/fuzz/fuzz_*.c
# are replayed over tests/fuzz/corpus/<name>/ in the normal run.
# TERN_DEVICE=cpu: the CLI's default device (auto) would pick a GPU of a CUDA
# build; tests that want the GPU say so (tests/cuda, TERN_SERVE_ARGS).
pkg_check_modules(CMOCKA REQUIRED IMPORTED_TARGET cmocka)

get_filename_component(TERN_SHARED_DIR ${CMAKE_SOURCE_DIR}/../shared ABSOLUTE)
set(TERN_TEST_ENV
  "TERN_ROOT=${CMAKE_SOURCE_DIR}"
  "TERN_SHARED=${TERN_SHARED_DIR}"
  "TERN_BIN=$<TARGET_FILE:tern_cli>"
  "TERN_BUILD=${CMAKE_BINARY_DIR}"
  "TERN_DEVICE=cpu"
  "ASAN_OPTIONS=detect_leaks=1:abort_on_error=0"
  "UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1")

# tern_add_script_test(NAME name COMMAND cmd... [TIMEOUT s] [LABELS l])
function(tern_add_script_test)
  cmake_parse_arguments(T "" "NAME;TIMEOUT" "COMMAND;LABELS" ${ARGN})
  if(NOT T_TIMEOUT)
    set(T_TIMEOUT 300)
  endif()
  add_test(NAME ${T_NAME} COMMAND ${T_COMMAND} WORKING_DIRECTORY ${CMAKE_SOURCE_DIR})
  set_tests_properties(${T_NAME} PROPERTIES ENVIRONMENT "${TERN_TEST_ENV}" TIMEOUT ${T_TIMEOUT})
  if(T_LABELS)
    set_tests_properties(${T_NAME} PROPERTIES LABELS "${T_LABELS}")
  endif()
endfunction()

file(GLOB TERN_TEST_DIRS LIST_DIRECTORIES true ${CMAKE_SOURCE_DIR}/tests/*)
foreach(d ${TERN_TEST_DIRS})
  if(NOT IS_DIRECTORY ${d})
    continue()
  endif()
  get_filename_component(sub ${d} NAME)
  file(GLOB srcs CONFIGURE_DEPENDS ${d}/test_*.c)
  foreach(f ${srcs})
    get_filename_component(n ${f} NAME_WE)
    set(exe ${sub}_${n})
    add_executable(${exe} ${f})
    target_link_libraries(${exe} PRIVATE tern_internal PkgConfig::CMOCKA)
    target_include_directories(${exe} PRIVATE ${CMAKE_SOURCE_DIR}/tests)
    set_target_properties(${exe} PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/tests)
    add_test(NAME ${sub}.${n} COMMAND ${exe} WORKING_DIRECTORY ${CMAKE_SOURCE_DIR})
    set_tests_properties(${sub}.${n} PROPERTIES ENVIRONMENT "${TERN_TEST_ENV}" TIMEOUT 300)
  endforeach()
  if(EXISTS ${d}/tests.cmake)
    include(${d}/tests.cmake)
  endif()
endforeach()

file(GLOB fuzzers CONFIGURE_DEPENDS ${CMAKE_SOURCE_DIR}/tests/fuzz/fuzz_*.c)
foreach(f ${fuzzers})
  get_filename_component(n ${f} NAME_WE)
  add_executable(${n}_replay ${f} ${CMAKE_SOURCE_DIR}/tests/fuzz/replay.c)
  target_link_libraries(${n}_replay PRIVATE tern_internal)
  target_compile_definitions(${n}_replay PRIVATE "TERN_SOURCE_DIR=\"${CMAKE_SOURCE_DIR}\"")
  set_target_properties(${n}_replay PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/fuzz)
  string(REGEX REPLACE "^fuzz_" "" corpus ${n})
  add_test(NAME fuzz.${corpus} COMMAND ${n}_replay ${CMAKE_SOURCE_DIR}/tests/fuzz/corpus/${corpus}
           WORKING_DIRECTORY ${CMAKE_SOURCE_DIR})
  set_tests_properties(fuzz.${corpus} PROPERTIES ENVIRONMENT "${TERN_TEST_ENV}" TIMEOUT 300)
  if(TERN_FUZZ AND CMAKE_C_COMPILER_ID MATCHES "Clang")
    # the library itself is instrumented (CMakeLists.txt); this adds the driver
    add_executable(${n} ${f})
    target_compile_options(${n} PRIVATE -fsanitize=fuzzer,address,undefined)
    target_link_options(${n} PRIVATE -fsanitize=fuzzer,address,undefined)
    target_link_libraries(${n} PRIVATE tern_internal)
    target_compile_definitions(${n} PRIVATE "TERN_SOURCE_DIR=\"${CMAKE_SOURCE_DIR}\"")
    set_target_properties(${n} PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/fuzz)
  endif()
endforeach()
