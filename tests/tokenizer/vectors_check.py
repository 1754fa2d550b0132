#!/usr/bin/env python3
"""llama.cpp tokenizer test vectors (../shared/tokenizers/vectors, MIT):
NAME.gguf.inp holds strings separated by "\\n__ggml_vocab_test__\\n", NAME.gguf.out
the expected ids (no special tokens), one line per string. Checks
`tern tokenize --jsonl --no-special` against them for each VECTORS=TOKENIZER pair.
Usage: vectors_check.py [NAME=DIR ...]   (TERN_BIN, TERN_SHARED from ctest)
"""
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
SEP = "\n__ggml_vocab_test__\n"


def main():
    shared = os.environ.get("TERN_SHARED", os.path.join(HERE, "..", "..", "..", "shared"))
    tern = os.environ.get("TERN_BIN", os.path.join(HERE, "..", "..", "build", "tern"))
    pairs = sys.argv[1:] or [f"qwen2={shared}/tokenizers/qwen3", f"llama-bpe={shared}/tokenizers/llama3"]
    failures = 0
    for spec in pairs:
        name, d = spec.split("=", 1)
        base = os.path.join(shared, "tokenizers", "vectors", f"ggml-vocab-{name}.gguf")
        with open(base + ".inp", encoding="utf-8", newline="") as f:
            inp = f.read()
        with open(base + ".out", encoding="utf-8", newline="") as f:
            out = f.read().split("\n")
        texts = inp.split(SEP)
        if texts and texts[-1] == "":
            texts.pop()
        expect = [[int(x) for x in line.split()] for line in out[: len(texts)]]
        data = "".join(json.dumps(t) + "\n" for t in texts).encode()
        p = subprocess.run([tern, "tokenize", d, "--jsonl", "--no-special"], input=data, capture_output=True)
        if p.returncode:
            sys.exit(f"FAIL: tern exited {p.returncode}: {p.stderr.decode()[:500]}")
        got = [json.loads(l) for l in p.stdout.decode().split("\n") if l]
        bad = [i for i in range(len(texts)) if i >= len(got) or got[i] != expect[i]]
        print(f"{name} vs {os.path.basename(d)}: {len(texts) - len(bad)}/{len(texts)} equal")
        for i in bad[:5]:
            print(f"  {json.dumps(texts[i])}\n  tern     {got[i] if i < len(got) else None}\n  expected {expect[i]}")
        failures += len(bad) + (len(texts) == 0)
    if failures:
        sys.exit(f"FAIL: {failures} differences")
    print("OK")


if __name__ == "__main__":
    main()
