#!/usr/bin/env python3
"""Compares `tern tokenize/detokenize --jsonl` with Hugging Face tokenizers
(npm tokenizers@0.23.2 via oracle.js) on the generated corpus.

Usage: oracle_compare.py [--bytes N] [--seed S] [--synth | NAME=DIR ...]
Environment (set by ctest): TERN_BIN, TERN_SHARED, TERN_ROOT.
Checks, for every tokenizer, with and without special tokens:
  ids identical to the oracle; decode(ids) and decode(ids, skip_special)
  identical to the oracle's (which makes decode(encode(x)) == x wherever
  the oracle round-trips). Exit 1 on any difference, listing a few.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def run(cmd, data):
    t0 = time.time()
    p = subprocess.run(cmd, input=data, capture_output=True)
    if p.returncode != 0:
        sys.exit(f"FAIL: {' '.join(cmd)} exited {p.returncode}: {p.stderr.decode()[:2000]}")
    lines = p.stdout.decode().split("\n")  # not splitlines(): U+2028 etc. are text
    if lines and lines[-1] == "":
        lines.pop()
    return lines, time.time() - t0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bytes", type=int, default=1 << 20)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--synth", action="store_true", help="compare the gen_synth.py tokenizers instead")
    ap.add_argument("dirs", nargs="*")
    a = ap.parse_args()
    if a.synth:
        tmp = tempfile.mkdtemp(prefix="tern_synth_")
        out = subprocess.run([sys.executable, os.path.join(HERE, "gen_synth.py"), tmp], capture_output=True, check=True)
        a.dirs = out.stdout.decode().split()
    shared = os.environ.get("TERN_SHARED", os.path.join(HERE, "..", "..", "..", "shared"))
    root = os.environ.get("TERN_ROOT", os.path.join(HERE, "..", ".."))
    tern = os.environ.get("TERN_BIN", os.path.join(root, "build", "tern"))
    dirs = a.dirs or [
        f"qwen3={shared}/tokenizers/qwen3",
        f"llama3={shared}/tokenizers/llama3",
        f"gemma3={shared}/tokenizers/gemma3",
        f"stories260K={shared}/models/stories260K",
        f"tern-demo={root}/models/tern-demo",
    ]
    corpus = subprocess.run([sys.executable, os.path.join(HERE, "gen_corpus.py"), "--bytes", str(a.bytes),
                             "--seed", str(a.seed)], capture_output=True, check=True).stdout
    texts = [json.loads(l) for l in corpus.decode().splitlines()]
    print(f"corpus: {len(texts)} lines, {sum(len(t.encode()) for t in texts)} bytes")
    failures = 0
    for spec in dirs:
        name, d = spec.split("=", 1)
        if not os.path.exists(os.path.join(d, "tokenizer.json")):
            sys.exit(f"FAIL: {d}/tokenizer.json missing")
        for special in (True, False):
            flag = [] if special else ["--no-special"]
            ours, t_ours = run([tern, "tokenize", d, "--jsonl"] + flag, corpus)
            ref, t_ref = run(["node", os.path.join(HERE, "oracle.js"), d, "encode" if special else "encode-nospecial"],
                             corpus)
            bad = [i for i in range(len(texts)) if i >= len(ours) or ours[i] != ref[i]]
            print(f"{name} special={special}: {len(texts) - len(bad)}/{len(texts)} id lists equal "
                  f"(tern {t_ours:.2f}s incl. load, oracle {t_ref:.2f}s incl. load)")
            for i in bad[:5]:
                print(f"  text {json.dumps(texts[i])[:300]}\n  tern   {ours[i][:300] if i < len(ours) else None}\n"
                      f"  oracle {ref[i][:300]}")
            failures += len(bad)
            ids_in = ("\n".join(ref) + "\n").encode()
            for skip in (False, True):
                flag = ["--skip-special"] if skip else []
                ours_d, _ = run([tern, "detokenize", d, "--jsonl"] + flag, ids_in)
                ref_d, _ = run(["node", os.path.join(HERE, "oracle.js"), d, "decode-skip" if skip else "decode"],
                               ids_in)
                bad = [i for i in range(len(ref_d)) if i >= len(ours_d) or json.loads(ours_d[i]) != json.loads(ref_d[i])]
                print(f"{name} special={special} decode skip={skip}: {len(ref_d) - len(bad)}/{len(ref_d)} equal")
                for i in bad[:3]:
                    print(f"  ids    {ref[i][:200]}\n  tern   {ours_d[i][:300] if i < len(ours_d) else None}\n"
                          f"  oracle {ref_d[i][:300]}")
                failures += len(bad)
    if failures:
        sys.exit(f"FAIL: {failures} differences")
    print("OK")


if __name__ == "__main__":
    main()
