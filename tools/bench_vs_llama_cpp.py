#!/usr/bin/env python3
"""tern next to llama.cpp on the same random weights: decode and prefill
tokens/s per weight kind, both engines alternating in one run, with ratios.

    bench_vs_llama_cpp.py LLAMA_CPP_TREE [--models DIR] [--gguf DIR] [--build DIR]
                          [--threads N] [--rounds N] [--prompt N] [--tokens N]
                          [--name llama-1b] [--kinds bf16,q8,q4] [--llama-depth N]

LLAMA_CPP_TREE: a llama.cpp source tree built CPU-only in its build/ folder
(llama-bench, llama-quantize), outside this repository. --models holds
tools/bench_models.sh's folders (NAME-bf16, NAME-q8, NAME-q4); the GGUFs of
the same weights are made once into --gguf: BF16 by gguf_from_tern.py, then
Q8_0 and Q4_0 by llama-quantize from it (llama.cpp's own 8- and 4-bit
formats; tern's are MLX affine with group 64). Each round runs, per kind,
tern's bench_decode and then llama-bench; the best of the rounds is kept for
each (shared machines are noisy). tern decodes after its prompt (context
PROMPT..PROMPT+TOKENS), llama-bench's tg after as many tokens (-d PROMPT),
its pp from an empty context. --llama-depth N sets that depth instead
(0: no -d at all, for a llama-bench older than its -d option, whose tg then
runs from an empty context; compare it with tern's decode after a short
prompt, e.g. --prompt 16 --llama-depth 0, and take prefill from a second
invocation with --prompt 512)."""
import argparse
import csv
import io
import os
import re
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
LLAMA_TYPES = {"bf16": None, "q8": "Q8_0", "q4": "Q4_0"}
LLAMA_NAMES = {"bf16": "BF16", "q8": "Q8_0", "q4": "Q4_0"}


def run(cmd):
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if p.returncode:
        sys.exit("bench_vs_llama_cpp: %s failed (%d):\n%s" % (cmd[0], p.returncode, p.stderr[-2000:]))
    return p.stdout


def make_gguf(tree, models, gguf_dir, name, kind):
    out = os.path.join(gguf_dir, "%s-%s.gguf" % (name, LLAMA_NAMES[kind]))
    if os.path.exists(out):
        return out
    base = os.path.join(gguf_dir, "%s-BF16.gguf" % name)
    if not os.path.exists(base):
        run([sys.executable, os.path.join(HERE, "gguf_from_tern.py"), os.path.join(models, name + "-bf16"), base])
    if kind != "bf16":
        run([os.path.join(tree, "build", "bin", "llama-quantize"), base, out, LLAMA_TYPES[kind]])
    return out


def tern_once(build, model_dir, threads, prompt, tokens):
    out = run([os.path.join(build, "bench", "bench_decode"), "--threads", str(threads), "--prompt", str(prompt),
               "--tokens", str(tokens), model_dir])
    for line in out.splitlines():
        m = re.match(r"^\S+\s+\S+\s+[\d.]+MB\s+([\d.]+) t/s\s+([\d.]+) t/s\s+(\d+)%\s+([\d.]+) t/s", line)
        if m:
            bw = re.search(r"bandwidth: ([\d.]+) GB/s", out)
            return float(m.group(1)), float(m.group(4)), float(m.group(3)), float(bw.group(1)) if bw else 0.0
    sys.exit("bench_vs_llama_cpp: no result line from bench_decode:\n" + out)


def llama_once(tree, gguf, threads, prompt, tokens, depth):
    """pp PROMPT from an empty context, then tg TOKENS after DEPTH tokens
    (-d: the context tern's decode runs at; none for DEPTH 0)."""
    bench = os.path.join(tree, "build", "bin", "llama-bench")
    common = ["-m", gguf, "-t", str(threads), "-r", "1", "-o", "csv"]
    out = run([bench] + common + ["-p", str(prompt), "-n", "0"])
    tg_out = run([bench] + common + ["-p", "0", "-n", str(tokens)] + (["-d", str(depth)] if depth else []))
    out = out.rstrip("\n") + "\n" + "\n".join(tg_out.splitlines()[1:])  # its CSV header dropped
    pp = tg = None
    for row in csv.DictReader(io.StringIO(out)):
        if not row.get("n_prompt", "").isdigit():
            continue
        if int(row["n_prompt"]) > 0 and int(row["n_gen"]) == 0:
            pp = float(row["avg_ts"])
        elif int(row["n_gen"]) > 0 and int(row["n_prompt"]) == 0:
            tg = float(row["avg_ts"])
    if pp is None or tg is None:
        sys.exit("bench_vs_llama_cpp: llama-bench printed no pp/tg rows:\n" + out)
    return tg, pp


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("tree")
    ap.add_argument("--models", default="build/bench-models")
    ap.add_argument("--gguf", default=None, help="default: MODELS/gguf")
    ap.add_argument("--build", default="build")
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--prompt", type=int, default=512)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--name", default="llama-1b")
    ap.add_argument("--kinds", default="bf16,q8,q4")
    ap.add_argument("--llama-depth", type=int, default=None,
                    help="context before llama.cpp's tg (default: --prompt; 0: no -d, for an older llama-bench)")
    a = ap.parse_args()
    gguf_dir = a.gguf or os.path.join(a.models, "gguf")
    os.makedirs(gguf_dir, exist_ok=True)
    kinds = a.kinds.split(",")
    for k in kinds:
        if k not in LLAMA_TYPES:
            sys.exit("bench_vs_llama_cpp: unknown kind %s (bf16, q8, q4)" % k)
    ggufs = {k: make_gguf(a.tree, a.models, gguf_dir, a.name, k) for k in kinds}
    depth = a.prompt if a.llama_depth is None else a.llama_depth
    best = {k: [0.0, 0.0, 0.0, 0.0, 0.0, 0.0] for k in kinds}  # tern dec, pre, %floor, bw; llama dec, pre
    for r in range(a.rounds):
        for k in kinds:
            td, tp, fl, bw = tern_once(a.build, os.path.join(a.models, "%s-%s" % (a.name, k)), a.threads, a.prompt,
                                       a.tokens)
            ld, lp = llama_once(a.tree, ggufs[k], a.threads, a.prompt, a.tokens, depth)
            print("round %d %-4s tern decode %7.2f prefill %7.2f | llama.cpp decode %7.2f prefill %7.2f" %
                  (r + 1, k, td, tp, ld, lp), flush=True)
            b = best[k]
            if td > b[0]:
                b[0], b[2], b[3] = td, fl, bw
            b[1] = max(b[1], tp)
            b[4] = max(b[4], ld)
            b[5] = max(b[5], lp)
    print("\n%s, %d threads, prompt %d, %d decode tokens (llama.cpp's after %d), best of %d rounds" %
          (a.name, a.threads, a.prompt, a.tokens, depth, a.rounds))
    print("| kind | tern decode t/s | llama.cpp decode t/s | ratio | tern of floor | tern prefill t/s "
          "| llama.cpp prefill t/s | ratio |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for k in kinds:
        b = best[k]
        print("| %s vs %s | %.2f | %.2f | %.2fx | %.0f%% | %.1f | %.1f | %.2fx |" %
              (k, LLAMA_NAMES[k], b[0], b[4], b[0] / b[4], b[2], b[1], b[5], b[1] / b[5]))


if __name__ == "__main__":
    main()
