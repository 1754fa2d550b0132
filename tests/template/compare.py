#!/usr/bin/python3
"""Oracle comparison: renders the same requests with `tern template DIR
--jsonl` and with hf_oracle.py (jinja2 configured as transformers does) and
requires byte-identical prompts. Where the oracle fails, tern must fail too
(with the same message when the template called raise_exception).

Usage: compare.py [--seed N] [--count N] [--min-ok N] [DIR ...]
Defaults: the templates of ../shared/tokenizers (qwen3, llama3, gemma3), the
demo model, and the Mistral, Phi-3, Llama 3.1 and Hermes 3 fixtures under
tests/template/templates. Needs TERN_BIN (set by ctest) and TERN_SHARED."""
import argparse
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))


def default_dirs():
    shared = os.environ.get("TERN_SHARED", os.path.join(ROOT, "..", "shared"))
    dirs = [os.path.join(shared, "tokenizers", n) for n in ("qwen3", "llama3", "gemma3")]
    dirs.append(os.path.join(ROOT, "models", "tern-demo"))
    dirs += [os.path.join(HERE, "templates", n) for n in ("mistral", "phi3", "llama31", "hermes3")]
    return dirs


def run(cmd, data):
    p = subprocess.run(cmd, input=data.encode(), capture_output=True, timeout=600)
    err = p.stderr.decode(errors="replace")
    if "Sanitizer" in err or "runtime error:" in err:
        sys.stderr.write(err)
        raise SystemExit("sanitizer report from: %s" % " ".join(cmd))
    if p.returncode != 0:
        sys.stderr.write(p.stderr.decode(errors="replace"))
        raise SystemExit("command failed: %s" % " ".join(cmd))
    return [json.loads(line) for line in p.stdout.decode().split("\n") if line.strip()]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--count", type=int, default=60)
    ap.add_argument("--min-ok", type=int, default=30)
    ap.add_argument("--cases", help="a JSONL file of requests instead of gen_cases.py's random ones")
    ap.add_argument("dirs", nargs="*")
    args = ap.parse_args()
    tern = os.environ.get("TERN_BIN", os.path.join(ROOT, "build", "tern"))
    if args.cases:
        with open(args.cases) as f:
            cases = f.read()
    else:
        cases = subprocess.run([sys.executable, os.path.join(HERE, "gen_cases.py"), "--seed", str(args.seed),
                                "--count", str(args.count)], capture_output=True, check=True).stdout.decode()
    lines = [l for l in cases.split("\n") if l.strip()]
    failed = False
    for d in args.dirs or default_dirs():
        want = run(["/usr/bin/python3", os.path.join(HERE, "hf_oracle.py"), d], cases)
        got = run([tern, "template", d, "--jsonl"], cases)
        if len(want) != len(lines) or len(got) != len(lines):
            print("%s: result count mismatch (cases %d, oracle %d, tern %d)" % (d, len(lines), len(want), len(got)))
            failed = True
            continue
        ok = errs = bad = 0
        for i, (w, g) in enumerate(zip(want, got)):
            if "text" in w:
                if g.get("text") == w["text"]:
                    ok += 1
                    continue
            elif "error" in g and (not w.get("raised") or g["error"] == w["error"]):
                errs += 1
                continue
            bad += 1
            if bad <= 3:
                print("MISMATCH %s case %d\n  request: %s\n  oracle:  %r\n  tern:    %r"
                      % (d, i, lines[i][:300], w, g))
        # single-request mode: exact bytes on stdout (no added newline), or
        # exit code 1 with the message on stderr
        for i in range(0, len(lines), max(1, len(lines) // 6)):
            p = subprocess.run([tern, "template", d], input=lines[i].encode(), capture_output=True, timeout=60)
            w = want[i]
            if "text" in w:
                single_ok = p.returncode == 0 and p.stdout.decode() == w["text"]
            else:
                single_ok = (p.returncode == 1 and not p.stdout and
                             (not w.get("raised") or w["error"] in p.stderr.decode()))
            if not single_ok:
                bad += 1
                print("SINGLE-MODE MISMATCH %s case %d: rc %d, stdout %r, stderr %r, oracle %r"
                      % (d, i, p.returncode, p.stdout[:200], p.stderr[:200], w))
        name = os.path.basename(os.path.normpath(d))
        print("%-10s identical %3d, both-error %3d, mismatched %d" % (name, ok, errs, bad))
        if bad or ok < args.min_ok:
            failed = True
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
