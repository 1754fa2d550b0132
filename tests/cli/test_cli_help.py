#!/usr/bin/env python3
"""The CLI a newcomer expects:
- `tern --version` prints the version;
- `tern CMD --help` for every subcommand: exit 0, usage, a one-line
  description, and every option with its default (or marked required); every
  option the subcommand's own usage message names is in its help;
- -c/--ctx-size above the model's maximum is an error (run, serve,
  perplexity), not a silent clamp; -t/--threads is accepted by run, logits,
  perplexity and serve;
- `tern grammar check --input -` reads stdin, allows a trailing newline and
  says why it rejects."""
import os, re, subprocess, sys, tempfile

TERN = os.environ["TERN_BIN"]
SHARED = os.environ.get("TERN_SHARED", "../shared")
STORIES = os.path.join(SHARED, "models/stories260K")  # max_position_embeddings 512
failures = 0
COMMANDS = ["run", "chat", "logits", "perplexity", "convert", "template", "grammar", "tokenize", "detokenize", "serve", "bench"]


def check(ok, what):
    global failures
    print(("ok   " if ok else "FAIL ") + what)
    if not ok:
        failures += 1


def run(*args, stdin=""):
    return subprocess.run([TERN, *args], input=stdin, capture_output=True, text=True, timeout=300)


p = run("--version")
check(p.returncode == 0 and re.fullmatch(r"tern \d+\.\d+\.\d+ \(.*\)\n", p.stdout) is not None,
      "--version: %r" % p.stdout)
top = run("--help").stdout
for cmd in COMMANDS:
    p = run(cmd, "--help")
    out = p.stdout
    check(p.returncode == 0 and out.startswith("usage: tern " + cmd), "%s --help: exit 0 and usage" % cmd)
    lines = out.splitlines()
    check(len(lines) > 2 and lines[1] == "" and len(lines[2]) > 10 and lines[2].endswith("."),
          "%s --help: a one-line description" % cmd)
    check(lines[2] in top, "%s: the description is in `tern --help`" % cmd)
    # option entries: a line starting "  -" and its deeper-indented continuation lines
    entries, cur = [], None
    for l in lines:
        if l.startswith("  -"):
            cur = [l]
            entries.append(cur)
        elif cur is not None and l.startswith("     "):
            cur.append(l)
        else:
            cur = None
    check(len(entries) > 0, "%s --help: lists options" % cmd)
    for e in entries:
        text = " ".join(e)
        check("default" in text or "required" in text, "%s --help: %s says its default" % (cmd, e[0].split()[0]))
    # every option the subcommand's usage names is documented
    usage = run(cmd).stderr
    named = set(re.findall(r"--[a-z][a-z0-9-]*", usage))
    check(len(named) > 0 or cmd in ("template",), "%s: its usage names options" % cmd)
    for flag in sorted(named):
        check(re.search(re.escape(flag) + r"\b", out) is not None, "%s --help documents %s" % (cmd, flag))
    p = run(cmd, "-h")
    check(p.returncode == 0 and p.stdout == out, "%s -h is --help" % cmd)

# -c/--ctx-size above the model's maximum: an error naming the flag and the maximum
for args, who in ((("run", STORIES, "--prompt", "hi", "-n", "2", "-c", "100000"), "run -c"),
                  (("run", STORIES, "--prompt", "hi", "-n", "2", "--ctx-size", "513"), "run --ctx-size"),
                  (("serve", STORIES, "--port", "0", "-c", "4096"), "serve -c"),
                  (("serve", STORIES, "--port", "0", "--ctx-size", "513"), "serve --ctx-size")):
    p = run(*args)
    last = p.stderr.strip().splitlines()[-1] if p.stderr.strip() else ""
    check(p.returncode == 1 and "ctx-size" in last and "512" in last, "%s above the maximum: exit 1 (%s)" % (who, last))
tmp = tempfile.mkdtemp(prefix="tern-help-")
text = os.path.join(tmp, "t.txt")
with open(text, "w") as f:
    f.write("Once upon a time there was a little girl. " * 40)
p = run("perplexity", STORIES, "--file", text, "-c", "1000")
check(p.returncode == 1 and "512" in p.stderr, "perplexity -c above the maximum: exit 1")

# -c at the maximum, -t: accepted and the same text as without them
base = run("run", STORIES, "--prompt", "Once upon a time", "-n", "8", "--temperature", "0")
check(base.returncode == 0 and base.stdout.strip() != "", "run greedy")
for extra in (["-t", "1"], ["--threads", "2"], ["-c", "512"], ["--ctx-size", "64", "-t", "1"]):
    p = run("run", STORIES, "--prompt", "Once upon a time", "-n", "8", "--temperature", "0", *extra)
    check(p.returncode == 0 and p.stdout == base.stdout, "run %s: same text" % " ".join(extra))
lg = run("logits", STORIES, "--ids", "1,2,3")
p = run("logits", STORIES, "--ids", "1,2,3", "-t", "1")
check(p.returncode == 0 and p.stdout == lg.stdout, "logits -t 1: same logits")
p = run("perplexity", STORIES, "--file", text, "-c", "64", "--chunks", "1", "-t", "1")
check(p.returncode == 0, "perplexity -c 64 -t 1")
p = run("logits", STORIES, "--ids", "1", "-t", "0")
check(p.returncode == 2, "logits -t 0 is a usage error")

# grammar check --input -
schema = os.path.join(tmp, "s.json")
with open(schema, "w") as f:
    f.write('{"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}')
for inp, want, what in (('{"a": 1}', 0, "accepted"), ('{"a": 1}\n', 0, "a trailing newline"),
                        ('{"a": 1}\r\n', 0, "a trailing CRLF"), ('{"a": "x"}', 1, "a wrong type"),
                        ('{"a": 1', 1, "cut short"), ('{"a": 1}\n\nx', 1, "text after the newline")):
    p = run("grammar", "check", "--schema", schema, "--input", "-", stdin=inp)
    check(p.returncode == want, "grammar check --input - %s: exit %d" % (what, p.returncode))
    if want == 1:
        check("rejected" in p.stderr and ("byte" in p.stderr), "grammar check says why: %s" % p.stderr.strip())
p = run("grammar", "check", "--schema", schema, "--input", "-", stdin='{"a": "x"}')
check("byte 6" in p.stderr, "the rejection points at the first byte no sentence allows")

print("%d failures" % failures)
sys.exit(1 if failures else 0)
