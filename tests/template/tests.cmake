# Chat template oracle comparisons (jinja2 configured as transformers does).
# The two random differential tests spawn hundreds of tern processes, so
# they run in the release build only (label no-asan); the sanitizer build
# still runs the chat, snippet and fuzz-corpus checks.
tern_add_script_test(NAME template.oracle_chat
  COMMAND /usr/bin/python3 ${CMAKE_SOURCE_DIR}/tests/template/compare.py --seed 1 --count 60
  TIMEOUT 300)
tern_add_script_test(NAME template.oracle_snippets
  COMMAND /usr/bin/python3 ${CMAKE_SOURCE_DIR}/tests/template/compare_snippets.py
  TIMEOUT 300)
tern_add_script_test(NAME template.oracle_random
  COMMAND /usr/bin/python3 ${CMAKE_SOURCE_DIR}/tests/template/compare_random.py --seed 1 --count 200
  TIMEOUT 300 LABELS no-asan)
tern_add_script_test(NAME template.oracle_exprs
  COMMAND /usr/bin/python3 ${CMAKE_SOURCE_DIR}/tests/template/compare_exprs.py --seed 1 --count 200
  TIMEOUT 300 LABELS no-asan)
tern_add_script_test(NAME template.demo_hf
  COMMAND /usr/bin/python3 ${CMAKE_SOURCE_DIR}/tests/template/demo_hf.py TIMEOUT 120)
# The harmony (gpt-oss-style) fixture on conversations with system, developer, tools, reasoning_effort,
# thinking, tool calls and tool results (the same requests render identically through gpt-oss's own template).
tern_add_script_test(NAME template.oracle_harmony
  COMMAND /usr/bin/python3 ${CMAKE_SOURCE_DIR}/tests/template/compare.py --min-ok 10
    --cases ${CMAKE_SOURCE_DIR}/tests/template/harmony_cases.jsonl ${CMAKE_SOURCE_DIR}/tests/template/templates/harmony
  TIMEOUT 120)
