# The engine tests run real models through many requests; under ASan on a
# busy machine they need more than the default five minutes (test_kv_budget:
# ~230 s alone on a quiet 2-core machine under ASan).
set_tests_properties(engine.test_engine engine.test_spec engine.test_kv_budget engine.test_device_sampling
  PROPERTIES TIMEOUT 900)
# KV cache events through the server, read with ZeroMQ as a router would
# (Debian's python3 with python3-zmq / -msgpack / -xxhash).
tern_add_script_test(NAME engine.kv_events COMMAND /usr/bin/python3 ${CMAKE_SOURCE_DIR}/tests/engine/test_kv_events.py
  TIMEOUT 300 LABELS no-asan)
