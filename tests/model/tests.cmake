# The model's layering: nothing outside src/model includes its body or a
# backend table header (the engine, server and CLI see model.h only).
tern_add_script_test(NAME model.layering COMMAND sh tests/model/layering.sh TIMEOUT 60)
