# Script tests of the grammar front ends (JSON Schema, regex, choice).
# The xgrammar replay re-checks every grammar the JSON-Schema-Test-Suite run
# produced in an outside engine (dialect and acceptance); Node only.
tern_add_script_test(NAME grammar.jsts_xgrammar
  COMMAND sh -c "TERN_JSTS_DUMP=${CMAKE_BINARY_DIR}/jsts_dump.jsonl ${CMAKE_BINARY_DIR}/tests/grammar_test_jsts >/dev/null && node tests/grammar/jsts_xgrammar.cjs ${CMAKE_BINARY_DIR}/jsts_dump.jsonl"
  TIMEOUT 600 LABELS no-asan)
