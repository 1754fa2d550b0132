# Script tests of the HTTP server; each starts and stops its own
# `tern serve models/tern-demo` on a free loopback port (see lib.mjs).
find_program(TERN_NODE node)
if(TERN_NODE)
  tern_add_script_test(NAME server.openai_conformance
    COMMAND ${TERN_NODE} ${CMAKE_SOURCE_DIR}/tests/server/openai_conformance.mjs TIMEOUT 300)
  tern_add_script_test(NAME server.concurrency
    COMMAND ${TERN_NODE} ${CMAKE_SOURCE_DIR}/tests/server/concurrency.mjs TIMEOUT 300 LABELS no-asan)
  tern_add_script_test(NAME server.http_strict
    COMMAND ${TERN_NODE} ${CMAKE_SOURCE_DIR}/tests/server/http_strict.mjs TIMEOUT 300)
  tern_add_script_test(NAME server.malformed
    COMMAND ${TERN_NODE} ${CMAKE_SOURCE_DIR}/tests/server/malformed.mjs TIMEOUT 300)
  tern_add_script_test(NAME server.shutdown
    COMMAND ${TERN_NODE} ${CMAKE_SOURCE_DIR}/tests/server/shutdown.mjs TIMEOUT 300)
  tern_add_script_test(NAME server.reasoning
    COMMAND ${TERN_NODE} ${CMAKE_SOURCE_DIR}/tests/server/reasoning.mjs TIMEOUT 300)
  tern_add_script_test(NAME server.harmony
    COMMAND ${TERN_NODE} ${CMAKE_SOURCE_DIR}/tests/server/harmony.mjs TIMEOUT 300)
  tern_add_script_test(NAME server.toolcalls
    COMMAND ${TERN_NODE} ${CMAKE_SOURCE_DIR}/tests/server/toolcalls.mjs TIMEOUT 300)
  tern_add_script_test(NAME server.demo_tools
    COMMAND ${TERN_NODE} ${CMAKE_SOURCE_DIR}/tests/server/demo_tools.mjs TIMEOUT 300)
  tern_add_script_test(NAME server.embeddings
    COMMAND ${TERN_NODE} ${CMAKE_SOURCE_DIR}/tests/server/embeddings.mjs TIMEOUT 300)
  tern_add_script_test(NAME server.responses
    COMMAND ${TERN_NODE} ${CMAKE_SOURCE_DIR}/tests/server/responses.mjs TIMEOUT 300)
  tern_add_script_test(NAME server.chat_page
    COMMAND ${TERN_NODE} ${CMAKE_SOURCE_DIR}/tests/server/chat_page.mjs TIMEOUT 300 LABELS no-asan)
  tern_add_script_test(NAME server.pool
    COMMAND ${TERN_NODE} ${CMAKE_SOURCE_DIR}/tests/server/pool.mjs TIMEOUT 300)
  tern_add_script_test(NAME server.lora
    COMMAND ${TERN_NODE} ${CMAKE_SOURCE_DIR}/tests/server/lora.mjs TIMEOUT 300)
  tern_add_script_test(NAME server.kv_disk
    COMMAND ${TERN_NODE} ${CMAKE_SOURCE_DIR}/tests/server/kv_disk.mjs TIMEOUT 1200 LABELS no-asan)
  tern_add_script_test(NAME server.compat
    COMMAND ${TERN_NODE} ${CMAKE_SOURCE_DIR}/tests/server/compat.mjs TIMEOUT 300)
  tern_add_script_test(NAME server.compile_pool
    COMMAND ${TERN_NODE} ${CMAKE_SOURCE_DIR}/tests/server/compile_pool.mjs TIMEOUT 120 LABELS no-asan)
  # bench/bench_serve (the served-throughput load generator) against the demo model: its counts equal the
  # server's /metrics counters to the token, closed streams are cancelled, reports and --compare written.
  tern_add_script_test(NAME server.serve_bench
    COMMAND /usr/bin/python3 ${CMAKE_SOURCE_DIR}/tests/server/serve_bench.py TIMEOUT 300 LABELS no-asan)
  tern_add_script_test(NAME server.access_log
    COMMAND /usr/bin/python3 ${CMAKE_SOURCE_DIR}/tests/server/access_log.py TIMEOUT 300)
  # 64 clients for 30 s: streams, disconnects, cancellations, grammar, malformed bodies; RSS bounded, every
  # request accounted for, healthy and idle after (TERN_SOAK_SECONDS=900 node tests/server/soak.mjs: the long one).
  tern_add_script_test(NAME server.soak
    COMMAND ${TERN_NODE} ${CMAKE_SOURCE_DIR}/tests/server/soak.mjs TIMEOUT 300 LABELS no-asan)
  tern_add_script_test(NAME server.experts
    COMMAND ${TERN_NODE} ${CMAKE_SOURCE_DIR}/tests/server/experts.mjs TIMEOUT 120)
  tern_add_script_test(NAME server.slowloris
    COMMAND ${TERN_NODE} ${CMAKE_SOURCE_DIR}/tests/server/slowloris.mjs TIMEOUT 120 LABELS no-asan)
endif()
