#!/bin/sh
# CLI contract of `tern grammar`: exit codes of check (0 accepted, 1
# rejected, 2 bad spec), one masks line per input token with the documented
# fields, and a hash that an independent implementation (Python, over the
# --list ids) reproduces.
set -eu
BIN=${TERN_BIN:-build/tern}
TOK=${TERN_SHARED:-../shared}/tokenizers/llama3
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

printf 'root ::= "{" ws "\\"a\\"" ws ":" ws [0-9]+ ws "}"\nws ::= [ ]*\n' > "$T/g.ebnf"
printf '{"a": 12}' > "$T/ok.txt"
printf '{"a": x}' > "$T/bad.txt"
"$BIN" grammar check --ebnf "$T/g.ebnf" --input "$T/ok.txt" || fail "valid input rejected"
set +e
"$BIN" grammar check --ebnf "$T/g.ebnf" --input "$T/bad.txt"; rc=$?
[ $rc -eq 1 ] || fail "invalid input: exit $rc, want 1"
printf 'root ::= ( "a"' > "$T/broken.ebnf"
"$BIN" grammar check --ebnf "$T/broken.ebnf" --input "$T/ok.txt" 2>"$T/err"; rc=$?
[ $rc -eq 2 ] || fail "broken grammar: exit $rc, want 2"
[ -s "$T/err" ] || fail "no message on stderr"
"$BIN" grammar check --regex '[' --input "$T/ok.txt" 2>/dev/null; rc=$?
[ $rc -eq 2 ] || fail "broken regex: exit $rc, want 2"
"$BIN" grammar check --choice '["{\"a\": 12}", "b"]' --input "$T/ok.txt"; rc=$?
[ $rc -eq 0 ] || fail "choice: exit $rc"
printf '{"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}' > "$T/s.json"
"$BIN" grammar check --schema "$T/s.json" --input "$T/ok.txt"; rc=$?
[ $rc -eq 0 ] || fail "schema: exit $rc"
"$BIN" grammar check --schema "$T/s.json" --any-whitespace=false --input "$T/ok.txt"; rc=$?
[ $rc -eq 1 ] || fail "compact schema accepted spaces: exit $rc"
"$BIN" grammar check --json --input "$T/ok.txt"; rc=$?
[ $rc -eq 0 ] || fail "json: exit $rc"
set -e
"$BIN" grammar compile --ebnf "$T/g.ebnf" | grep -q '^root ::= ' || fail "compile output"

if [ -f "$TOK/tokenizer.json" ]; then
  "$BIN" grammar masks --tokenizer "$TOK" --ebnf "$T/g.ebnf" --input "$T/ok.txt" --list > "$T/masks.jsonl"
  python3 - "$T/masks.jsonl" <<'PY' || fail "masks output"
import json, sys
lines = [json.loads(l) for l in open(sys.argv[1])]
assert len(lines) >= 3, lines
for i, d in enumerate(lines):
    assert d["step"] == i and d["accepted"] is True and isinstance(d["token"], int)
    ids = sorted(d["allowed"])
    assert d["allowed_count"] == len(ids)
    h = 0xcbf29ce484222325
    for t in ids:
        for b in t.to_bytes(4, "little"):
            h = ((h ^ b) * 0x100000001b3) & 0xFFFFFFFFFFFFFFFF
    assert d["allowed_fnv1a64"] == "%016x" % h, (d["allowed_fnv1a64"], "%016x" % h)
    assert d["token"] in ids
PY
fi
echo "grammar cli: ok"
