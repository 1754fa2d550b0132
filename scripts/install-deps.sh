#!/usr/bin/env bash
# Installs the Debian packages tern needs to build and test, only those missing.
# Safe to run repeatedly; needs root (or sudo) on a Debian 12 machine.
set -euo pipefail
pkgs=(build-essential cmake pkg-config clang
      libjson-c-dev libpcre2-dev libutf8proc-dev libmicrohttpd-dev
      libcmocka-dev libxxhash-dev libzstd-dev
      libzmq3-dev python3-zmq python3-msgpack python3-xxhash  # KV events (ZeroMQ) and their subscriber test
      nodejs npm python3-jinja2 chromium
      python3-prometheus-client  # the /metrics exposition parser the server tests check against
      gnuplot-nox fonts-dejavu-core  # tern bench's plots (PNG with readable text, SVG)
      libgtk-3-dev libwebkit2gtk-4.1-dev xvfb xauth)  # tern-desktop and its Xvfb test
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
# node/npm may come from elsewhere than Debian: a working binary is enough.
if command -v node >/dev/null && command -v npm >/dev/null; then
  tmp=(); for p in "${missing[@]}"; do [[ $p == nodejs || $p == npm ]] || tmp+=("$p"); done
  missing=("${tmp[@]+"${tmp[@]}"}")
fi
if ((${#missing[@]})); then
  echo "install-deps: installing ${missing[*]}" >&2
  SUDO=; [ "$(id -u)" = 0 ] || SUDO=sudo
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -q
  $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
fi
