#!/bin/bash
# Served throughput of `tern serve` and llama-server on the same GPU and the
# same weights, one server after the other, then the side-by-side table
# (docs/benchmarks.md "Served throughput"):
#
#   bench/serve_compare.sh OUT_DIR TERN_MODEL_DIR GGUF [CLIENTS] [SECONDS]
#
# TERN_MODEL_DIR: a model folder (for a random-weight fixture, the output of
# bench/serve_fixture.py, whose chat_template.jinja llama-server gets too);
# GGUF: the same weights for llama.cpp (tools/gguf_from_tern.py). CLIENTS
# (default 1,8,32,64,128) and SECONDS per client count (default 15) go to
# bench/bench_serve. Environment: TERN, BENCH_SERVE, LLAMA_SERVER (the
# binaries; defaults build/tern, build/bench/bench_serve, llama-server),
# TERN_ARGS / LLAMA_ARGS (extra server flags), DEVICE (tern's, default cuda), ONLY=tern|llama (one server),
# GGUF_READY (a file that appears once the GGUF's conversion has ended, so
# the conversion may run while tern is measured). Each server gets up to 300 s to load.
set -u
out=$1 model=$2 gguf=$3 clients=${4:-1,8,32,64,128} secs=${5:-15}
TERN=${TERN:-build/tern} BENCH_SERVE=${BENCH_SERVE:-build/bench/bench_serve} LLAMA_SERVER=${LLAMA_SERVER:-llama-server}
max=$(echo "$clients" | tr ',' '\n' | sort -n | tail -1)
mkdir -p "$out"
rc=0

# run NAME PORT CMD...: starts the server, measures it, stops it (a server that exits stops the measurement)
run() {
    local name=$1 port=$2
    shift 2
    echo "== $name: $*"
    "$@" > "$out/$name.server.log" 2>&1 &
    local pid=$!
    "$BENCH_SERVE" --url "http://127.0.0.1:$port" --wait 300 --clients "$clients" --duration "$secs" \
        --label "$name" --out "$out/$name" &
    local bpid=$!
    ( while kill -0 "$pid" 2>/dev/null; do sleep 0.5; done; kill "$bpid" 2>/dev/null ) &
    local wpid=$!
    if ! wait "$bpid"; then
        rc=1
        kill -0 "$pid" 2>/dev/null || echo "$name: the server exited (see $out/$name.server.log)" >&2
    fi
    kill "$wpid" 2>/dev/null
    kill "$pid" 2>/dev/null
    for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$pid" 2>/dev/null
    wait "$pid" 2>/dev/null
}

if [ "${ONLY:-tern}" != llama ]; then
    # --max-batch: every client decodes in the same step, as llama-server's -np slots do
    # shellcheck disable=SC2086
    run tern 18571 "$TERN" serve "$model" --host 127.0.0.1 --port 18571 --device "${DEVICE:-cuda}" --max-batch "$max" ${TERN_ARGS:-}
fi
if [ "${ONLY:-llama}" != tern ]; then
    if [ -n "${GGUF_READY:-}" ]; then
        for _ in $(seq 600); do [ -e "$GGUF_READY" ] && break; sleep 0.5; done
    fi
    tpl=()
    [ -e "$model/chat_template.jinja" ] && tpl=(--chat-template-file "$model/chat_template.jinja")
    # -np: a slot per client, each with its own 2048-token KV stream (no -kvu: with one buffer shared by 128
    # slots every step attended over the whole buffer - the first H200 run, docs/benchmarks.md; KVU=1 puts it back)
    kvu=()
    [ "${KVU:-0}" = 1 ] && kvu=(-kvu)
    # shellcheck disable=SC2086
    run llama-server 18572 "$LLAMA_SERVER" -m "$gguf" --host 127.0.0.1 --port 18572 -ngl 99 -fa on -np "$max" \
        "${kvu[@]}" -c $((max * 2048)) "${tpl[@]}" ${LLAMA_ARGS:-}
fi
if [ -z "${ONLY:-}" ]; then
    "$BENCH_SERVE" --compare "$out/tern/serve.json" "$out/llama-server/serve.json" --out "$out" || rc=1
fi
exit $rc
