#!/usr/bin/env bash
# Installs the Node packages the tests compare against (tests/oracle/package.json,
# pinned by its lock file). Skips the download when they are already present.
set -euo pipefail
cd "$(dirname "$0")/../tests/oracle"
if [ ! -d node_modules ] || [ package-lock.json -nt node_modules ]; then
  npm ci --no-audit --no-fund --loglevel=error
fi
