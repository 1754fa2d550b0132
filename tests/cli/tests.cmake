tern_add_script_test(NAME cli.run_golden COMMAND python3 ${CMAKE_SOURCE_DIR}/tests/cli/test_run_golden.py TIMEOUT 600)
tern_add_script_test(NAME cli.perplexity COMMAND python3 ${CMAKE_SOURCE_DIR}/tests/cli/test_perplexity.py TIMEOUT 600)
tern_add_script_test(NAME cli.failure_paths COMMAND python3 ${CMAKE_SOURCE_DIR}/tests/cli/test_failure_paths.py TIMEOUT 300)
tern_add_script_test(NAME cli.help COMMAND python3 ${CMAKE_SOURCE_DIR}/tests/cli/test_cli_help.py TIMEOUT 300)
tern_add_script_test(NAME cli.chat COMMAND python3 ${CMAKE_SOURCE_DIR}/tests/cli/test_chat.py TIMEOUT 600)
# a few hundred real requests: minutes under ASan on two cores, so the release build runs it
tern_add_script_test(NAME cli.bench COMMAND python3 ${CMAKE_SOURCE_DIR}/tests/cli/test_bench.py TIMEOUT 900 LABELS no-asan)
