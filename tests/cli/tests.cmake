tern_add_script_test(NAME cli.run_golden COMMAND python3 ${CMAKE_SOURCE_DIR}/tests/cli/test_run_golden.py TIMEOUT 600)
tern_add_script_test(NAME cli.perplexity COMMAND python3 ${CMAKE_SOURCE_DIR}/tests/cli/test_perplexity.py TIMEOUT 600)
tern_add_script_test(NAME cli.failure_paths COMMAND python3 ${CMAKE_SOURCE_DIR}/tests/cli/test_failure_paths.py TIMEOUT 300)
tern_add_script_test(NAME cli.help COMMAND python3 ${CMAKE_SOURCE_DIR}/tests/cli/test_cli_help.py TIMEOUT 300)
