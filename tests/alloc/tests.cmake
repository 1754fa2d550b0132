# The allocation-failure test replaces malloc and friends in a normal build;
# under a sanitizer (whose runtime owns malloc) the linker's --wrap sends
# tern's own calls to it instead. strdup/strndup are wrapped in both.
if(TERN_SANITIZE OR TERN_FUZZ)
  target_compile_definitions(alloc_test_alloc_fail PRIVATE TERN_ALLOC_WRAP=1)
  target_link_options(alloc_test_alloc_fail PRIVATE
    "-Wl,--wrap=malloc,--wrap=calloc,--wrap=realloc,--wrap=free,--wrap=aligned_alloc,--wrap=posix_memalign")
endif()
target_link_options(alloc_test_alloc_fail PRIVATE "-Wl,--wrap=strdup,--wrap=strndup,--wrap=json_tokener_parse_ex")
set_tests_properties(alloc.test_alloc_fail PROPERTIES TIMEOUT 600)
