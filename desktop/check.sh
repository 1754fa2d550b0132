#!/usr/bin/env bash
# tern-desktop under Xvfb, as a person would use it:
# 1. --self-test: the window appears, the chat page loads from the server the
#    app started, a typed message gets an answer, a screenshot is taken; then
#    the server is killed under the app (it must start another), the model
#    picker switches to the other model (the pool loads it and unloads the
#    first, as /v1/models reports), and the window is closed: every server
#    the app started must be gone.
# 2. the app itself is killed (SIGKILL, no cleanup code runs): its server
#    must die with it.
# usage: desktop/check.sh TERN_BIN TERN_DESKTOP_BIN [OUT_DIR]
set -uo pipefail
TERN=$1 APP=$2 OUT=${3:-$(dirname "$APP")/desktop-check}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$OUT"
fails=0 passes=0
check() { if eval "$1"; then echo "ok   $2"; passes=$((passes + 1)); else echo "FAIL $2"; fails=$((fails + 1)); fi; }
gone() { for p in "$@"; do [ -e "/proc/$p" ] && [ "$(cat /proc/$p/stat 2>/dev/null | awk '{print $3}')" != Z ] && return 1; done; return 0; }
command -v xvfb-run >/dev/null || { echo "FAIL xvfb-run missing (scripts/install-deps.sh installs xvfb)"; exit 1; }

rm -f "$OUT/desktop.png"
xvfb-run -a -s "-screen 0 1280x900x24" timeout 300 "$APP" --tern "$TERN" --models "$ROOT/models" \
  --self-test "$OUT/desktop.png" >"$OUT/out.txt" 2>"$OUT/err.txt"
rc=$?
grep -v '^\[tern serve\]' "$OUT/err.txt"
cat "$OUT/out.txt"
check "[ $rc = 0 ]" "self-test exits 0 (got $rc)"
check "grep -Eq '^answer: .{2,}' '$OUT/out.txt'" "a message got an answer"
check "grep -q '^restarted: pid [0-9]* serving tern-demo' '$OUT/out.txt'" "a killed server was restarted"
check "grep -q '^switched: pid [0-9]* serving tern-demo-draft (tern-demo unloaded), page on tern-demo-draft' '$OUT/out.txt'" \
  "the picker loaded the other model and unloaded the first (/v1/models states)"
check "[ \"\$(head -c 8 '$OUT/desktop.png' | od -An -tx1 | tr -d ' \n')\" = 89504e470d0a1a0a ]" "screenshot is a PNG"
check "[ \$(stat -c %s '$OUT/desktop.png') -gt 20000 ]" "screenshot is not blank ($(stat -c %s "$OUT/desktop.png" 2>/dev/null) bytes)"
pids=$(sed -n 's/^tern-desktop: server pid \([0-9]*\):.*/\1/p' "$OUT/err.txt" | tr '\n' ' ')
check "[ \$(echo $pids | wc -w) -eq 2 ]" "two servers were started, the first and its replacement ($(echo $pids))"
check "gone $pids" "closing the window left no tern serve process"

# the app dies without cleaning up: PR_SET_PDEATHSIG takes its server along
xvfb-run -a -s "-screen 0 1280x900x24" "$APP" --tern "$TERN" --models "$ROOT/models" \
  >/dev/null 2>"$OUT/err2.txt" &
wrapper=$!
for _ in $(seq 1 600); do grep -q 'ready at' "$OUT/err2.txt" && break; sleep 0.1; done
pid=$(sed -n 's/^tern-desktop: server pid \([0-9]*\):.*/\1/p' "$OUT/err2.txt" | head -1)
app=$(pgrep -P "$wrapper" -f tern-desktop; for c in $(pgrep -P "$wrapper"); do pgrep -P "$c" -f tern-desktop; done)
app=$(echo $app | awk '{print $1}')
check "[ -n '$pid' ] && [ -n '$app' ]" "second run: server $pid under app $app"
[ -n "$app" ] && kill -9 "$app"
for _ in $(seq 1 50); do gone $pid && break; sleep 0.1; done
check "gone $pid" "a killed app leaves no tern serve process"
wait $wrapper 2>/dev/null
echo "screenshot: $OUT/desktop.png"
echo "$passes passed, $fails failed"
[ $fails = 0 ]
