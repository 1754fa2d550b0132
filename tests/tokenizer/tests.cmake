# Oracle comparisons against Hugging Face tokenizers (npm tokenizers@0.23.2).
# The small sweep also runs under the sanitizers; the 1 MB acceptance sweep
# over every tokenizer is kept out of the ASan run for time.
tern_add_script_test(NAME tokenizer.oracle_small
  COMMAND python3 ${CMAKE_SOURCE_DIR}/tests/tokenizer/oracle_compare.py --bytes 30000 --seed 7
    stories260K=${TERN_SHARED_DIR}/models/stories260K tern-demo=${CMAKE_SOURCE_DIR}/models/tern-demo
    qwen3=${TERN_SHARED_DIR}/tokenizers/qwen3
  TIMEOUT 900)
tern_add_script_test(NAME tokenizer.oracle_1mb
  COMMAND python3 ${CMAKE_SOURCE_DIR}/tests/tokenizer/oracle_compare.py --bytes 1100000
  TIMEOUT 1200 LABELS no-asan)
tern_add_script_test(NAME tokenizer.llama_cpp_vectors
  COMMAND python3 ${CMAKE_SOURCE_DIR}/tests/tokenizer/vectors_check.py)
# Components the shipped tokenizers do not use (Metaspace, Split behaviors,
# WordPiece, Unigram, BertNormalizer, added-token flags, ...).
tern_add_script_test(NAME tokenizer.oracle_synth
  COMMAND python3 ${CMAKE_SOURCE_DIR}/tests/tokenizer/oracle_compare.py --synth --bytes 12000 --seed 11
  TIMEOUT 900 LABELS no-asan)
tern_add_script_test(NAME tokenizer.cli
  COMMAND python3 ${CMAKE_SOURCE_DIR}/tests/tokenizer/cli_check.py)
