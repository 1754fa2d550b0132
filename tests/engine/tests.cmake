# The engine tests run real models through many requests; under ASan on a
# busy machine they need more than the default five minutes.
set_tests_properties(engine.test_engine engine.test_spec PROPERTIES TIMEOUT 900)
