# The library surface: the public archive exports only the tern_ API of
# include/tern.h, and a program written against that header alone links
# with it and reproduces llama2.c's golden (examples/simple.c).
tern_add_script_test(NAME api.public_symbols COMMAND sh tests/api/public_symbols.sh ${CMAKE_BINARY_DIR}/libtern.a
  TIMEOUT 60)
tern_add_script_test(NAME api.example COMMAND sh tests/api/example.sh TIMEOUT 300)
