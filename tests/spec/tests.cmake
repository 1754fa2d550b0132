# Speculative decoding end to end (three servers, 16 mixed requests each).
find_program(TERN_NODE node)
if(TERN_NODE)
  tern_add_script_test(NAME spec.server_equivalence
    COMMAND ${TERN_NODE} ${CMAKE_SOURCE_DIR}/tests/spec/spec_server.mjs TIMEOUT 600 LABELS no-asan)
endif()
