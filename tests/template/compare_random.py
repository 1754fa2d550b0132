#!/usr/bin/python3
"""Differential test of whitespace handling and control flow: random
templates assembled from text, newlines, indentation and tags with every
whitespace-control variant ({%- -%}, {%+, {{- -}}, comments, raw blocks,
nested if/for/set), rendered by tern and by jinja2 configured as
transformers does. Seeded, so a failure reproduces.

Usage: compare_random.py [--seed N] [--count N]   (needs TERN_BIN)"""
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

TEXT = ["\n", "\n\n", "  ", "\t", " x ", "y", "\n  ", "  \n", "z\n", " \t\n", "\u00a0", "\r\n"]
OPEN = ["{%", "{%-", "{%+"]
CLOSE = ["%}", "-%}", "+%}"]
VOPEN = ["{{", "{{-", "{{+"]
VCLOSE = ["}}", "-}}"]


def tag(rng, body):
    return rng.choice(OPEN) + rng.choice([" ", "  ", ""]) + body + rng.choice([" ", ""]) + rng.choice(CLOSE)


def block(rng, depth):
    out = []
    for _ in range(rng.randint(1, 5)):
        r = rng.random()
        if r < 0.35:
            out.append(rng.choice(TEXT))
        elif r < 0.5:
            out.append(rng.choice(VOPEN) + " " + rng.choice(["'v'", "i", "loop.index", "a ~ '!'", "n.k"]) + " " + rng.choice(VCLOSE))
        elif r < 0.58:
            out.append(rng.choice(["{#", "{#-"]) + rng.choice([" c ", "\n"]) + rng.choice(["#}", "-#}"]))
        elif r < 0.64:
            out.append(tag(rng, "set a = " + rng.choice(["1", "'s'", "a ~ 2"])))
        elif r < 0.68:
            out.append(tag(rng, "set n.k = " + rng.choice(["n.k + 1", "0"])))
        elif r < 0.7:
            out.append(rng.choice(["{% raw %}", "{%- raw -%}", "{% raw -%}"]) + rng.choice(TEXT) + "{{ r }}" +
                       rng.choice(TEXT) + rng.choice(["{% endraw %}", "{%- endraw %}", "{% endraw -%}"]))
        elif depth < 3 and r < 0.85:
            cond = rng.choice(["true", "false", "i is odd", "a"])
            s = tag(rng, "if " + cond) + block(rng, depth + 1)
            if rng.random() < 0.4:
                s += tag(rng, "else") + block(rng, depth + 1)
            out.append(s + tag(rng, "endif"))
        elif depth < 3:
            s = tag(rng, "for i in " + rng.choice(["range(3)", "[1, 2]", "[]"])) + block(rng, depth + 1)
            if rng.random() < 0.3:
                s += tag(rng, "else") + block(rng, depth + 1)
            out.append(s + tag(rng, "endfor"))
        else:
            out.append(rng.choice(TEXT))
    return "".join(out)


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
    bad = ok = 0
    try:
        for i in range(args.count):
            src = "{% set n = namespace(k=0) %}" + block(rng, 0) + rng.choice(["", "\n", "\n\n", "  \n"])
            with open(os.path.join(tmp, "chat_template.jinja"), "w", encoding="utf-8", newline="") as f:
                f.write(src)
            want = oracle(src, {})
            p = subprocess.run([tern, "template", tmp, "--jsonl"], input=b"{}\n", capture_output=True, timeout=60)
            lines = [l for l in p.stdout.decode().split("\n") if l.strip()]
            err = p.stderr.decode(errors="replace")
            if "Sanitizer" in err or "runtime error:" in err:
                got = {"crash": err[-500:]}
            elif p.returncode == 1 and not lines:
                got = {"error": err.strip()}
            else:
                got = json.loads(lines[0]) if len(lines) == 1 else {"crash": p.returncode}
            good = got.get("text") == want["text"] if "text" in want else "error" in got
            if good:
                ok += 1
            else:
                bad += 1
                if bad <= 5:
                    print("MISMATCH case %d\n  template: %r\n  oracle: %r\n  tern:   %r" % (i, src, want, got))
    finally:
        shutil.rmtree(tmp)
    print("random templates: %d, matched %d, mismatched %d" % (args.count, ok, bad))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
