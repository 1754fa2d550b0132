#!/usr/bin/env python3
"""`tern tokenize` / `tern detokenize` end to end: plain and --jsonl modes,
--no-special / --skip-special, tokenizer-only and model folders, and the
error paths (message on stderr, exit 1). Expected ids come from the HF
oracle (oracle.js), not from tern. TERN_BIN, TERN_SHARED, TERN_ROOT from ctest."""
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.environ.get("TERN_ROOT", os.path.join(HERE, "..", ".."))
SHARED = os.environ.get("TERN_SHARED", os.path.join(ROOT, "..", "shared"))
TERN = os.environ.get("TERN_BIN", os.path.join(ROOT, "build", "tern"))
fails = 0


def check(cond, what):
    global fails
    print(("ok   " if cond else "FAIL ") + what)
    fails += not cond


def tern(args, data):
    return subprocess.run([TERN] + args, input=data, capture_output=True)


def oracle(d, mode, values):
    data = "".join(json.dumps(v) + "\n" for v in values).encode()
    out = subprocess.run(["node", os.path.join(HERE, "oracle.js"), d, mode], input=data, capture_output=True, check=True)
    return [json.loads(l) for l in out.stdout.decode().split("\n") if l]


text = "Hello world!\n<|im_start|> 你好 😀 e\u0301  end "
for d in (f"{SHARED}/models/stories260K", f"{ROOT}/models/tern-demo", f"{SHARED}/tokenizers/qwen3"):
    name = os.path.basename(d)
    for special, flag, mode in ((True, [], "encode"), (False, ["--no-special"], "encode-nospecial")):
        want = oracle(d, mode, [text])[0]
        p = tern(["tokenize", d] + flag, text.encode())
        check(p.returncode == 0 and json.loads(p.stdout) == want, f"{name} tokenize special={special}")
        for skip, sflag, smode in ((False, [], "decode"), (True, ["--skip-special"], "decode-skip")):
            want_text = oracle(d, smode, [want])[0]
            p = tern(["detokenize", d] + sflag, json.dumps(want).encode())
            check(p.returncode == 0 and p.stdout.decode() == want_text, f"{name} detokenize skip={skip}")
    lines = ["a", "", "b c", "<|im_end|>\n"]
    p = tern(["tokenize", d, "--jsonl"], "".join(json.dumps(v) + "\n" for v in lines).encode())
    got = [json.loads(l) for l in p.stdout.decode().split("\n") if l]
    check(p.returncode == 0 and got == oracle(d, "encode", lines), f"{name} tokenize --jsonl")

# errors: message on stderr, exit 1
p = tern(["tokenize", "/nonexistent/tokenizer/dir"], b"x")
check(p.returncode == 1 and p.stderr, "missing folder -> exit 1 with a message")
with tempfile.TemporaryDirectory() as t:
    with open(os.path.join(t, "tokenizer.json"), "w") as f:
        f.write('{"model": {"type": "BPE", "vocab": {"a": 0}, "merges": []}, "decoder": {"type": "Nope"}}')
    p = tern(["tokenize", t], b"a")
    check(p.returncode == 1 and b"Nope" in p.stderr, "unknown decoder type named in the error")
d = f"{SHARED}/models/stories260K"
p = tern(["detokenize", d], b"[1, 2, oops]")
check(p.returncode == 1 and p.stderr, "detokenize bad JSON -> exit 1")
p = tern(["tokenize", d, "--jsonl"], b'"ok"\n42\n')
check(p.returncode == 1 and p.stderr, "tokenize --jsonl non-string line -> exit 1")
p = tern(["tokenize"], b"")
check(p.returncode == 2, "no folder -> usage, exit 2")
sys.exit(1 if fails else 0)
