# Script tests of the grammar front ends (JSON Schema, regex, choice).
# The xgrammar replay re-checks every grammar the JSON-Schema-Test-Suite run
# produced in an outside engine (dialect and acceptance); Node only.
tern_add_script_test(NAME grammar.jsts_xgrammar
  COMMAND sh -c "TERN_JSTS_DUMP=${CMAKE_BINARY_DIR}/jsts_dump.jsonl ${CMAKE_BINARY_DIR}/tests/grammar_test_jsts >/dev/null && node tests/grammar/jsts_xgrammar.cjs ${CMAKE_BINARY_DIR}/jsts_dump.jsonl"
  TIMEOUT 600 LABELS no-asan)
# Keywords and formats against ajv (+ ajv-formats) and the suite's labels.
tern_add_script_test(NAME grammar.schema_ajv COMMAND node tests/grammar/schema_ajv.mjs TIMEOUT 300 LABELS no-asan)

# Grammar core (EBNF, matcher, masks): CLI contract, the MaskBench sample
# (0 invalid accepted), and mask parity with xgrammar on a small subset (the
# full sweep: tests/grammar/xgrammar_parity.mjs, see src/grammar/README.md).
tern_add_script_test(NAME grammar.cli COMMAND sh tests/grammar/grammar_cli.sh TIMEOUT 120)
tern_add_script_test(NAME grammar.maskbench COMMAND sh tests/grammar/maskbench_check.sh TIMEOUT 900 LABELS no-asan)
tern_add_script_test(NAME grammar.maskbench_smoke COMMAND sh tests/grammar/maskbench_check.sh 40 TIMEOUT 600)
tern_add_script_test(NAME grammar.xgrammar_parity
  COMMAND node tests/grammar/xgrammar_parity.mjs --tokenizer ../shared/tokenizers/llama3
          --ebnf-cases tests/grammar/parity/ebnf_cases.json --only json,arith,func,negclass,reps --max-steps 12 --quiet
  TIMEOUT 900 LABELS no-asan)
tern_add_script_test(NAME grammar.xgrammar_quirks COMMAND node tests/grammar/xgrammar_quirks.mjs TIMEOUT 300 LABELS no-asan)
# The Llama-3 mask comparisons (lengths, dead ends, shared token sets) take
# minutes under the sanitizers on a busy 2-core machine.
set_tests_properties(grammar.test_matcher PROPERTIES TIMEOUT 900)
