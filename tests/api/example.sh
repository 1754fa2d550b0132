#!/bin/sh
# examples/simple.c, linked with nothing but the public libtern.a, against
# llama2.c's greedy golden for stories260K (prompt + 128 tokens + newline,
# byte for byte), and its error path: a missing model folder exits 1
# naming the code from tern.h's table.
set -eu
BUILD=${TERN_BUILD:-build}
SHARED=${TERN_SHARED:-../shared}
EX=$BUILD/examples/simple
MODEL=$SHARED/models/stories260K
GOLD=$MODEL/golden/reference_greedy.json
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
PROMPT=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["runs"][0]["prompt"])' "$GOLD")
"$EX" "$MODEL" "$PROMPT" 128 > "$TMP/out" 2> "$TMP/err"
python3 - "$GOLD" "$TMP/out" <<'PY'
import json, sys
want = json.load(open(sys.argv[1]))["runs"][0]["stdout_128_new_tokens"]
got = open(sys.argv[2], encoding="utf-8").read()
assert got == want, "example output differs from the golden:\n%r\n%r" % (got[:300], want[:300])
PY
grep -q '^128 tokens generated$' "$TMP/err" || { cat "$TMP/err"; exit 1; }
grep -q "read back as \"$PROMPT\"" "$TMP/err" || { cat "$TMP/err"; exit 1; }
if "$EX" "$TMP/no-such-model" x 2> "$TMP/err2" > /dev/null; then
    echo "a missing model folder did not fail"; exit 1
fi
grep -Eq '^error E[A-Z]+ \([a-z/ ]+\): .+' "$TMP/err2" || { cat "$TMP/err2"; exit 1; }
grep -q 'EUNKNOWN\|unknown error' "$TMP/err2" && { cat "$TMP/err2"; exit 1; }
cat "$TMP/err" "$TMP/err2"
echo "example matches the golden"
