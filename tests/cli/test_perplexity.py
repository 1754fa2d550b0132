#!/usr/bin/env python3
"""tern perplexity on stories260K:
- the ppl of a chunk equals the one computed here from `tern logits` (all
  logits of the chunk, BOS first, second half scored) within 1e-5 relative;
- a run against its own saved logits has KL 0 and full top-1 agreement;
- the 8-bit conversion's KL against the f32 model is small but not zero, with
  the integer products (default) and with --exact-products, which differ;
- bad input (missing file, too short a text, a base of another ctx) is a
  one-line error with exit code 1."""
import json, math, os, subprocess, sys, tempfile

TERN = os.environ["TERN_BIN"]
SHARED = os.environ.get("TERN_SHARED", "../shared")
STORIES = os.path.join(SHARED, "models/stories260K")
failures = 0


def check(ok, what):
    global failures
    print(("ok   " if ok else "FAIL ") + what)
    if not ok:
        failures += 1


def run(*args, ok=True):
    p = subprocess.run([TERN, *args], capture_output=True, text=True, timeout=300)
    if ok and p.returncode != 0:
        print(p.stderr)
    return p


gold = json.load(open(os.path.join(STORIES, "golden/reference_greedy.json")))
tmp = tempfile.mkdtemp(prefix="tern-ppl-")
text = os.path.join(tmp, "text.txt")
with open(text, "w") as f:
    f.write("\n".join(r["stdout_128_new_tokens"] for r in gold["runs"]))
CTX = 64

# ppl of the second chunk from tern logits, computed here
ids = json.loads(subprocess.run([TERN, "tokenize", STORIES, "--no-special"], stdin=open(text), capture_output=True,
                                text=True, check=True).stdout)
bos = json.loads(subprocess.run([TERN, "tokenize", STORIES], input="", capture_output=True, text=True,
                                check=True).stdout)
chunk = ids[CTX:2 * CTX]
chunk[0] = bos[0]
p = run("logits", STORIES, "--ids", ",".join(map(str, chunk)), "--top", "100000")
rows = [json.loads(l) for l in p.stdout.splitlines()]
nll = 0.0
for j in range(CTX // 2, CTX - 1):
    logit = {t: v for t, v in rows[j]["top"]}
    mx = max(logit.values())
    lse = mx + math.log(sum(math.exp(v - mx) for v in logit.values()))
    nll -= logit[chunk[j + 1]] - lse
n = CTX - 1 - CTX // 2
want = math.exp(nll / n)
# the second chunk's ppl from the one- and two-chunk runs (equal token counts
# per chunk: ppl(2 chunks)^2 = ppl(chunk 1) * ppl(chunk 2))
p0 = run("perplexity", STORIES, "--file", text, "--ctx", str(CTX), "--chunks", "1")
p2 = run("perplexity", STORIES, "--file", text, "--ctx", str(CTX), "--chunks", "2")
r0, r2 = json.loads(p0.stdout), json.loads(p2.stdout)
got = r2["ppl"] ** 2 / r0["ppl"]
check(p0.returncode == 0 and r2["n_tokens"] == 2 * n and r2["ctx"] == CTX, "perplexity exits 0 with its counts")
check(abs(got - want) <= 1e-5 * want, f"chunk 2 ppl {got:.6f} equals the one from tern logits {want:.6f}")

# self-KL is zero
base = os.path.join(tmp, "f32.lp")
p = run("perplexity", STORIES, "--file", text, "--ctx", str(CTX), "--save-logits", base)
r = json.loads(p.stdout)
p = run("perplexity", STORIES, "--file", text, "--ctx", str(CTX), "--kl-base", base)
s = json.loads(p.stdout)
check(s["kl_mean"] == 0 and s["kl_p99"] == 0 and s["top1_agree"] == 1 and s["ppl"] == s["ppl_base"] == r["ppl"],
      f"against itself: KL 0, top-1 agreement 1 ({s})")

# the 8-bit conversion: small KL, integer and exact products differ
q8 = os.path.join(tmp, "q8")
subprocess.run([TERN, "convert", STORIES, q8, "--bits", "8", "--group-size", "32"], capture_output=True, check=True)
res = {}
for mode in ("integer", "exact"):
    extra = ["--exact-products"] if mode == "exact" else []
    p = run("perplexity", q8, "--file", text, "--ctx", str(CTX), "--kl-base", base, *extra)
    res[mode] = json.loads(p.stdout)
    k = res[mode]
    print(f"     q8 {mode}: {k}")
    check(0 < k["kl_mean"] < 0.01 and k["top1_agree"] > 0.9 and abs(k["ppl"] / k["ppl_base"] - 1) < 0.02,
          f"q8 ({mode} products) vs f32: KL {k['kl_mean']:.2e}, top-1 {k['top1_agree']:.3f}")
check(res["integer"]["kl_mean"] != res["exact"]["kl_mean"], "--exact-products changes the quantized products")

# bad input
p = run("perplexity", STORIES, "--file", os.path.join(tmp, "missing.txt"), ok=False)
check(p.returncode == 1 and p.stderr.count("\n") == 1, "missing file: one-line error, exit 1")
p = run("perplexity", STORIES, "--file", text, "--ctx", "100000", ok=False)
check(p.returncode == 1 and "ctx" in p.stderr, "ctx past the model: error naming --ctx")
p = run("perplexity", STORIES, "--file", text, "--ctx", "32", "--kl-base", base, ok=False)
check(p.returncode == 1 and "ctx" in p.stderr, "base saved with another ctx: error")
p = run("perplexity", STORIES, "--file", text, "--kl-base", base, "--save-logits", base, ok=False)
check(p.returncode == 2, "--kl-base with --save-logits: usage error")

subprocess.run(["rm", "-rf", tmp])
print(f"{failures} failure(s)")
sys.exit(1 if failures else 0)
