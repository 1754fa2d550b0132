#!/usr/bin/env bash
# The main job: serve the default model (models/tern-demo) on loopback.
# Called by `make demo` after dependencies are installed and tern is built.
# Override with TERN_MODEL, TERN_PORT, TERN_HOST.
set -euo pipefail
cd "$(dirname "$0")/.."
model=${TERN_MODEL:-models/tern-demo}
exec build/tern serve "$model" --host "${TERN_HOST:-127.0.0.1}" --port "${TERN_PORT:-8080}"
