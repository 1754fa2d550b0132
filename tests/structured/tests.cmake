# Structured output end to end: starts its own `tern serve models/tern-demo`
# on a free loopback port and checks 200 mixed grammar requests with the
# official openai client against independent validators (see e2e.mjs).
find_program(TERN_NODE node)
if(TERN_NODE)
  tern_add_script_test(NAME structured.e2e
    COMMAND ${TERN_NODE} ${CMAKE_SOURCE_DIR}/tests/structured/e2e.mjs TIMEOUT 600 LABELS no-asan)
endif()
# Structural tags end to end (free text, triggered tagged segments; see structural.mjs).
if(TERN_NODE)
  tern_add_script_test(NAME structured.structural_tag
    COMMAND ${TERN_NODE} ${CMAKE_SOURCE_DIR}/tests/structured/structural.mjs TIMEOUT 600 LABELS no-asan)
endif()
