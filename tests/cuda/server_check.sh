#!/bin/sh
# Device end-to-end check of the server on a GPU (not part of ctest; see
# server_check.py for what it checks). Runs with prebuilt binaries:
#   TERN_BIN=build-cuda/tern sh tests/cuda/server_check.sh
# Prints PASS/FAIL per feature; exit 0 only when all pass. About a minute.
# TERN_CHECK_NODE=1 also runs the Node server scripts (tests/server,
# tests/spec, tests/structured) against --device cuda where node exists.
# TERN_CHECK_DEVICE=cpu runs everything on the CPU (checks the checker).
cd "$(dirname "$0")/../.." || exit 1
export TERN_ROOT="${TERN_ROOT:-$(pwd)}"
if [ -z "$TERN_BIN" ]; then
  for b in "${TERN_BUILD:+$TERN_BUILD/tern}" build-cuda/tern build/tern; do
    if [ -n "$b" ] && [ -x "$b" ]; then TERN_BIN=$b; break; fi
  done
fi
export TERN_BIN
echo "server_check: $TERN_BIN, device ${TERN_CHECK_DEVICE:-cuda}, $(git log -1 --format=%h 2>/dev/null)"
command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv,noheader
python3 tests/cuda/server_check.py
rc=$?
# the device unit checks of serving (argmax kernel, copy-on-write, greedy
# sampling, KV budget) when the build dir next to the binary has them
UNIT="$(dirname "$TERN_BIN")/tests/cuda_test_cuda_serving"
if [ "${TERN_CHECK_DEVICE:-cuda}" != cpu ] && [ -x "$UNIT" ]; then
  if "$UNIT" > /tmp/tern_server_check_unit.log 2>&1; then
    echo "PASS unit: $UNIT ($(grep -c '\[       OK \]' /tmp/tern_server_check_unit.log) ok, $(grep -c SKIPPED /tmp/tern_server_check_unit.log) skipped lines)"
  else
    echo "FAIL unit: $UNIT"; tail -20 /tmp/tern_server_check_unit.log; rc=1
  fi
  grep -E "rel. error|device|default KV|does not fit" /tmp/tern_server_check_unit.log | head -8
  grep -E "sampling kernel|sample_finish|tcu_sample_rows|edge rows" /tmp/tern_server_check_unit.log | head -16
fi
if [ "$TERN_CHECK_NODE" = 1 ] && command -v node >/dev/null 2>&1; then
  export TERN_SERVE_ARGS="--device ${TERN_CHECK_DEVICE:-cuda}"
  for t in tests/server/concurrency.mjs tests/spec/spec_server.mjs tests/structured/e2e.mjs; do
    if timeout 300 node "$t" > /tmp/tern_server_check_node.log 2>&1; then
      echo "PASS node $t (TERN_SERVE_ARGS=$TERN_SERVE_ARGS)"
    else
      echo "FAIL node $t (TERN_SERVE_ARGS=$TERN_SERVE_ARGS)"; tail -15 /tmp/tern_server_check_node.log; rc=1
    fi
  done
fi
exit $rc
