#!/usr/bin/python3
"""Differential test of expression semantics: random expressions over a
fixed set of variables (strings with Unicode, ints, floats, bools, None,
lists, dicts) combining operators, filters, tests, methods, subscripts and
slices, rendered as {{ expr }} by tern and by jinja2 configured as
transformers does. Outputs must match byte for byte, or both must fail.

Usage: compare_exprs.py [--seed N] [--count N]   (needs TERN_BIN)"""
import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from compare_snippets import oracle  # noqa: E402

VARS = {"s": "Héllo, World ", "t": "a,b,,c", "u": "  ünï cödé\n", "n": 7, "m": -3, "f": 2.5, "g": -0.1,
        "z": 0, "b": True, "e": "", "l": [3, 1, 2], "ls": ["b", "A", "c", "a"], "d": {"k": 1, "a": "x"},
        "nn": None, "ps": [{"name": "x", "v": 2}, {"name": "Y", "v": 1}, {"name": "z"}]}
STR_VARS = ["s", "t", "u", "e", "'lit'", "\"q'uote\"", "'ß'"]
NUM_VARS = ["n", "m", "f", "g", "z", "b", "3", "0.5", "-2", "10"]
ANY = list(VARS) + ["undef"]
FILTERS = ["trim", "length", "upper", "lower", "title", "capitalize", "first", "last", "list", "string",
           "int", "float", "abs", "round", "unique | list", "reverse | list", "sort", "tojson", "items | list",
           "default('D')", "default('D', true)", "join('-')", "replace('l', 'L')", "indent(2)", "select | list",
           "reject('odd') | list", "map('string') | list", "dictsort", "sum", "min", "max", "count", "e",
           "tojson(indent=1)", "selectattr('v') | list", "map(attribute='name') | list", "round(1)", "wordcount"]
TESTS = ["defined", "undefined", "none", "string", "number", "integer", "float", "mapping", "iterable",
         "sequence", "boolean", "true", "false", "odd", "even", "divisibleby 2", "eq 7", "in [1, 2, 3]", "lower",
         "upper", "callable", "sameas none", "gt 1", "ne 'x'"]
METHODS = ["strip()", "strip('H ')", "lstrip()", "rstrip('\\n ')", "split()", "split(',')", "split(',', 1)",
           "rsplit(',', 1)", "startswith('H')", "endswith(' ')", "replace(',', ';')", "upper()", "lower()",
           "title()", "capitalize()", "find('l')", "rfind('l')", "count('l')", "splitlines()", "isdigit()",
           "isalpha()", "isspace()", "islower()", "format(1)", "join(['1', '2'])"]
OPS = ["+", "-", "*", "/", "//", "%", "**", "~", "==", "!=", "<", ">", "<=", ">=", "in", "not in", "and", "or"]


def expr(rng, depth):
    r = rng.random()
    if depth <= 0 or r < 0.25:
        return rng.choice(ANY + NUM_VARS + STR_VARS + ["[1, 'a']", "{'x': 1}", "none", "(1, 2)"])
    if r < 0.4:
        return "(%s %s %s)" % (expr(rng, depth - 1), rng.choice(OPS), expr(rng, depth - 1))
    if r < 0.55:
        return "(%s | %s)" % (expr(rng, depth - 1), rng.choice(FILTERS))
    if r < 0.65:
        return "(%s is %s%s)" % (expr(rng, depth - 1), rng.choice(["", "not "]), rng.choice(TESTS))
    if r < 0.75:
        return "%s.%s" % (rng.choice(STR_VARS[:3] + ["d", "l"]) if rng.random() < 0.7 else expr(rng, 0),
                          rng.choice(METHODS))
    if r < 0.85:
        a, b = rng.choice(["", "1", "-1", "-2", "2", "10"]), rng.choice(["", "1", "-1", "3", "-5"])
        step = rng.choice(["", ":-1", ":2", ":-2"])
        return "%s[%s:%s%s]" % (rng.choice(["s", "l", "ls", "u", "t", "e"]), a, b, step)
    if r < 0.9:
        return "%s[%s]" % (rng.choice(["s", "l", "d", "ps", "u"]), rng.choice(["0", "-1", "5", "'k'", "'a'", "1"]))
    if r < 0.95:
        return "(%s if %s else %s)" % (expr(rng, depth - 1), expr(rng, depth - 1), expr(rng, depth - 1))
    return "(not %s)" % expr(rng, depth - 1)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--count", type=int, default=300)
    args = ap.parse_args()
    tern = os.environ.get("TERN_BIN")
    if not tern:
        raise SystemExit("TERN_BIN not set")
    rng = random.Random(args.seed)
    tmp = tempfile.mkdtemp(prefix="tern-tpl-")
    bad = ok = both_err = 0
    try:
        for i in range(args.count):
            src = "{{ %s }}" % expr(rng, 3)
            with open(os.path.join(tmp, "chat_template.jinja"), "w", encoding="utf-8", newline="") as f:
                f.write(src)
            want = oracle(src, VARS)
            p = subprocess.run([tern, "template", tmp, "--jsonl"], capture_output=True, timeout=60,
                               input=(json.dumps(VARS, ensure_ascii=False) + "\n").encode())
            lines = [l for l in p.stdout.decode().split("\n") if l.strip()]
            err = p.stderr.decode(errors="replace")
            if "Sanitizer" in err or "runtime error:" in err:
                got = {"crash": err[-500:]}
            elif p.returncode == 1 and not lines:
                got = {"error": err.strip()}
            else:
                got = json.loads(lines[0]) if len(lines) == 1 else {"crash": p.returncode}
            if "text" in want:
                good = got.get("text") == want["text"]
            else:
                good = "error" in got
                both_err += good
            if good:
                ok += 1
            else:
                bad += 1
                if bad <= 8:
                    print("MISMATCH case %d\n  template: %s\n  oracle: %r\n  tern:   %r" % (i, src, want, got))
    finally:
        shutil.rmtree(tmp)
    print("random expressions: %d, matched %d (%d both errors), mismatched %d" % (args.count, ok, both_err, bad))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
