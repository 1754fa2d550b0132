# The model's layering: nothing outside src/model includes its body or a
# backend table header (the engine, server and CLI see model.h only).
tern_add_script_test(NAME model.layering COMMAND sh tests/model/layering.sh TIMEOUT 60)
# FP8 checkpoints against this script's own E4M3 codec (both hub layouts,
# tern convert --fp8, load errors)
tern_add_script_test(NAME model.fp8 COMMAND python3 ${CMAKE_SOURCE_DIR}/tests/model/test_fp8.py TIMEOUT 600)
