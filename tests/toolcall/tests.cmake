# Tool calls end to end: starts its own `tern serve` on a copy of the demo
# model with a tools template (made in the build dir) and checks forced,
# parallel and auto calls with the official openai client against ajv, alone
# and in mixed batches on a speculating server, plus the 400s (see e2e.mjs).
find_program(TERN_NODE node)
if(TERN_NODE)
  tern_add_script_test(NAME toolcall.e2e
    COMMAND ${TERN_NODE} ${CMAKE_SOURCE_DIR}/tests/toolcall/e2e.mjs TIMEOUT 900 LABELS no-asan)
endif()
