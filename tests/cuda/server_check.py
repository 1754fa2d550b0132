#!/usr/bin/env python3
"""Device end-to-end check of `tern serve --device cuda` (not part of ctest).

Starts several servers on the demo model at once and checks the server's
feature set on the device, printing one PASS/FAIL line per feature and a
summary; exit status 0 only when every feature passed. Stdlib only (no
Node, no dev packages), so prebuilt binaries can be checked on a GPU machine:

    TERN_BIN=build-cuda/tern sh tests/cuda/server_check.sh

Environment: TERN_BIN (the tern binary; default $TERN_BUILD/tern, then
build-cuda/tern, build/tern), TERN_ROOT (repository root; default: two
levels up), TERN_CHECK_DEVICE (default cuda; `cpu` runs the same checks on
the CPU, to check this script itself), TERN_CHECK_LOGS (a folder to keep
each server's log in).

Servers (all --device DEVICE unless noted):
  exact   TERN_CUDA_GEMM_MIN_T=1000000 TERN_CUDA_GEMV=staged,by-shape,by-shape: every product on
          one batch-invariant GEMV kernel, so a request gives the same
          tokens alone or in any batch - the reference for the equivalence
          checks (by default a bf16 step of two or more sequences takes the
          tensor-core GEMV, one sequence another kernel)
  draft   exact + --draft-model models/tern-demo-draft (speculation)
  ngram   exact + --spec ngram
  default the default product paths (cuBLAS for batches of 33+ tokens,
          the tensor-core GEMV for bf16 steps of two or more sequences):
          smoke checks only (bf16-rounded prefill products may change
          greedy ties)
  cpu     --device cpu: the cross-device comparison
"""
import json
import os
import re
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

ROOT = os.environ.get("TERN_ROOT") or os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
DEVICE = os.environ.get("TERN_CHECK_DEVICE", "cuda")
LOGS = os.environ.get("TERN_CHECK_LOGS")


def find_bin():
    if os.environ.get("TERN_BIN"):
        return os.environ["TERN_BIN"]
    cands = []
    if os.environ.get("TERN_BUILD"):
        cands.append(os.path.join(os.environ["TERN_BUILD"], "tern"))
    cands += [os.path.join(ROOT, "build-cuda", "tern"), os.path.join(ROOT, "build", "tern")]
    for c in cands:
        if os.path.exists(c):
            return c
    return cands[0]


BIN = find_bin()
MODEL = os.path.join(ROOT, "models", "tern-demo")
DRAFT = os.path.join(ROOT, "models", "tern-demo-draft")

results = []  # (feature, ok, detail)


def report(feature, ok, detail=""):
    results.append((feature, ok, detail))
    line = "%s %s%s" % ("PASS" if ok else "FAIL", feature, (" -- " + detail) if detail and not ok else "")
    print(line, flush=True)


# ---- servers ----


class Server:
    def __init__(self, name, args, env=None):
        self.name, self.args, self.url, self.log = name, args, None, ""
        self.ready = threading.Event()
        e = dict(os.environ)
        e.pop("TERN_DEVICE", None)  # no device flag means auto here
        e.update(env or {})
        cmd = [BIN, "serve", MODEL, "--host", "127.0.0.1", "--port", "0"] + args
        self.cmd = cmd
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=e)
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for raw in self.proc.stdout:
            line = raw.decode("utf-8", "replace")
            self.log += line
            m = re.search(r"serving \S+ on (http://\S+:\d+)", line)
            if m and not self.url:
                self.url = m.group(1)
                self.ready.set()
        self.ready.set()

    def wait(self, timeout=90):
        self.ready.wait(timeout)
        return self.url is not None

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if LOGS:
            os.makedirs(LOGS, exist_ok=True)
            with open(os.path.join(LOGS, self.name + ".log"), "w") as f:
                f.write(" ".join(self.cmd) + "\n" + self.log)
        return self.proc.returncode


def post(srv, body, timeout=120):
    req = urllib.request.Request(srv.url + "/v1/chat/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        try:
            return e.code, json.loads(e.read())
        except Exception:
            return e.code, {}
    except Exception as e:  # connection refused, timeout: report, do not crash
        return 0, {"error": str(e)}


def post_stream(srv, body, timeout=120):
    """Returns (status, [data payloads])."""
    b = dict(body, stream=True)
    req = urllib.request.Request(srv.url + "/v1/chat/completions", data=json.dumps(b).encode(),
                                 headers={"Content-Type": "application/json"})
    out = []
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            for raw in r:
                line = raw.decode("utf-8", "replace").strip()
                if line.startswith("data: "):
                    out.append(line[6:])
            return r.status, out
    except Exception as e:
        return 0, [str(e)]


def parallel(fn, items):
    res = [None] * len(items)

    def run(i):
        res[i] = fn(items[i])

    ts = [threading.Thread(target=run, args=(i,)) for i in range(len(items))]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return res


def content(resp):
    try:
        return resp[1]["choices"][0]["message"]["content"]
    except Exception:
        return None


def finish(resp):
    try:
        return resp[1]["choices"][0]["finish_reason"]
    except Exception:
        return None


# ---- requests ----

PERSON = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 20},
                   "age": {"type": "integer", "minimum": 0, "maximum": 120},
                   "tags": {"type": "array", "items": {"enum": ["a", "b", "c"]}, "maxItems": 3}},
    "required": ["name", "age"],
}
ASKS = [
    "Hello! Who are you?",
    "Answer in JSON with keys title, words: The quick brown fox jumps over the lazy dog.",
    "Repeat this text exactly: Small models are useful for testing.",
    "Continue this text: The old ship left the harbour at dawn.",
]
REGEX = r"[A-Z][a-z]+( [a-z]+){2,6}\."
CHOICES = ["yes", "no", "maybe"]


def request(i, max_tokens=48):
    base = {"model": "tern-demo", "temperature": 0, "max_tokens": max_tokens,
            "messages": [{"role": "user", "content": ASKS[i % len(ASKS)]}]}
    k = i % 4
    if k == 1:
        base["response_format"] = {"type": "json_schema", "json_schema": {"name": "p", "schema": PERSON}}
    elif k == 2:
        base["guided_regex"] = REGEX
    elif k == 3:
        base["guided_choice"] = CHOICES
        base["chat_template_kwargs"] = {"enable_thinking": i % 8 == 3}
    return base


def strip_think(t):
    return re.sub(r"^<think>[\s\S]*?</think>\s*", "", t)


def grammar_valid(i, resp):
    """None if the output of request(i) satisfies its constraint, else why not."""
    if resp[0] != 200:
        return "status %s %s" % (resp[0], json.dumps(resp[1])[:200])
    t = content(resp)
    if t is None:
        return "no content"
    k = i % 4
    if k == 0:
        return None
    if finish(resp) == "length":
        return None  # cut by max_tokens: a valid prefix is all one can ask (checked for stop only)
    t = strip_think(t)
    if k == 1:
        try:
            v = json.loads(t)
        except Exception as e:
            return "not JSON (%s): %r" % (e, t)
        ok = (isinstance(v, dict) and isinstance(v.get("name"), str) and len(v["name"]) <= 20 and
              isinstance(v.get("age"), int) and not isinstance(v.get("age"), bool) and 0 <= v["age"] <= 120 and
              set(v) <= {"name", "age", "tags"} and
              (("tags" not in v) or (isinstance(v["tags"], list) and len(v["tags"]) <= 3 and
                                     all(x in ("a", "b", "c") for x in v["tags"]))))
        return None if ok else "does not conform: %r" % t
    if k == 2:
        return None if re.fullmatch(REGEX, t) else "no regex match: %r" % t
    return None if t in CHOICES else "not a choice: %r" % t


# ---- checks ----


def safe(fn, *args):
    """Runs one check; an exception in it is that feature's FAIL, not the end of the run."""
    try:
        return fn(*args)
    except Exception as e:  # noqa: BLE001 - report whatever broke
        report("%s (crashed)" % fn.__name__, False, "%s: %s" % (type(e).__name__, e))
        return None


def check_selection(srvs):
    want = "device: cpu" if DEVICE == "cpu" else "device: cuda"
    bad = [s.name for s in srvs if s.name != "cpu" and want not in s.log]
    if DEVICE != "cpu" and not any(s.name == "default" and "device: cuda:0 (auto)" in s.log for s in srvs):
        bad.append("default (no --device: 'device: cuda:0 (auto)' expected)")
    for s in srvs:
        m = re.search(r"engine: .*", s.log)
        print("INFO %s: %s" % (s.name, m.group(0) if m else "no engine line"), flush=True)
    gpu_kv = DEVICE == "cpu" or all("of GPU memory" in s.log for s in srvs if s.name != "cpu")
    report("selection: servers log the chosen device and a GPU-resident KV pool", not bad and gpu_kv,
           ("missing '%s' in %s" % (want, bad)) if bad else ("" if gpu_kv else "engine line lacks 'of GPU memory'"))


def check_errors():
    if DEVICE == "cpu":
        return
    p = subprocess.run([BIN, "serve", MODEL, "--port", "0", "--device", DEVICE, "--kv-budget", "4000"],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=90)
    msg = p.stdout.decode("utf-8", "replace")
    report("kv budget: a --kv-budget larger than the GPU is a clear error",
           p.returncode != 0 and "does not fit in GPU memory" in msg, msg.strip().splitlines()[-1] if msg else "")
    # a large budget that fits: 20 GB of KV in GPU memory (none of it on the host)
    big = Server("kv20", ["--device", DEVICE, "--kv-budget", "20"])
    up = big.wait()
    m = re.search(r"engine: (\d+) KV blocks \((\d+) MB of GPU memory\)", big.log)
    r = post(big, request(0, 8)) if up else (0, {})
    rss = 0
    try:
        with open("/proc/%d/status" % big.proc.pid) as f:
            rss = int(re.search(r"VmRSS:\s+(\d+)", f.read()).group(1)) >> 10
    except Exception:
        pass
    big.stop()
    report("kv budget: --kv-budget 20 gives a 20 GB pool in GPU memory (host RSS %d MB) that serves" % rss,
           bool(m) and int(m.group(2)) >= 20 * 1024 - 1 and r[0] == 200 and rss < 4096,
           (m.group(0) if m else big.log[-300:]))
    p = subprocess.run([BIN, "logits", MODEL, "--ids", "1,2", "--device", "cuda:97"], stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, timeout=90)
    msg = p.stdout.decode("utf-8", "replace")
    report("selection: a missing GPU is a clear error", p.returncode != 0 and "does not exist" in msg,
           msg.strip().splitlines()[-1] if msg else "")


def check_logits():
    ids = "1,271,8000,0,16,321,673,1248,16,263,6686,6310,23,17,100,200,300,400,500,600"
    outs = {}
    for dev in (DEVICE, "cpu"):
        p = subprocess.run([BIN, "logits", MODEL, "--ids", ids, "--top", "3", "--device", dev],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=120)
        outs[dev] = [json.loads(l) for l in p.stdout.decode().splitlines() if l.strip()] if p.returncode == 0 else None
        if p.returncode:
            report("logits: tern logits --device %s runs" % dev, False, p.stderr.decode()[-300:])
            return
    a, b = outs[DEVICE], outs["cpu"]

    def agree(x, y):  # the same top-1 id, or a near tie among the CPU's top 3
        if x["top"][0][0] == y["top"][0][0]:
            return True
        cpu = dict((t[0], t[1]) for t in y["top"])
        return x["top"][0][0] in cpu and abs(cpu[x["top"][0][0]] - y["top"][0][1]) < 1e-3

    same_top = sum(agree(x, y) for x, y in zip(a, b))
    err = max(abs(x["top"][0][1] - y["top"][0][1]) for x, y in zip(a, b))
    report("logits: tern logits --device %s matches the CPU (top-1 ids, max |dlogit| %.2g)" % (DEVICE, err),
           len(a) == len(b) == 20 and same_top == 20 and err < 0.05, "%d/20 top-1 equal" % same_top)


def check_streaming(srv):
    body = request(0, 32)
    s, chunks = post_stream(srv, body)
    ref = post(srv, body)
    text, ok = "", s == 200 and len(chunks) > 2 and chunks[-1] == "[DONE]"
    for c in chunks[:-1]:
        try:
            d = json.loads(c)["choices"]
            if d:
                text += d[0].get("delta", {}).get("content") or ""
        except Exception:
            ok = False
    ok = ok and text == content(ref)
    report("streaming: SSE chunks end with [DONE] and concatenate to the non-streamed text", ok,
           "%d chunks, %r vs %r" % (len(chunks), text[:60], (content(ref) or "")[:60]))


def check_batching(srv, alone):
    # 16 greedy (mixed grammars) + 4 seeded sampled requests at once, and the
    # sampled ones alone: greedy equal to alone, sampled equal to alone.
    sampled = [{"model": "tern-demo", "temperature": 0.9, "top_p": 0.95, "top_k": 40, "seed": 1000 + i,
                "max_tokens": 32, "messages": [{"role": "user", "content": ASKS[i % 4]}]} for i in range(4)]
    s_alone = [post(srv, b) for b in sampled]
    both = parallel(lambda b: post(srv, b), [request(i) for i in range(16)] + sampled)
    bad = [i for i in range(16) if content(both[i]) != content(alone[i]) or both[i][0] != 200]
    bad_s = [i for i in range(4) if content(both[16 + i]) != content(s_alone[i]) or both[16 + i][0] != 200]
    report("batching: 20 concurrent requests (greedy + seeded sampling) equal their runs alone", not bad and not bad_s,
           "greedy differ %s, sampled differ %s" % (bad, bad_s) if bad or bad_s else "")


def check_device_sampler(srv, hostpath):
    # seeded sampled requests (the default temperature 1, top-p, top-k,
    # min-p, logit_bias, grammar-free) sampled on the device equal the same
    # requests sampled on the host (TERN_GPU_SAMPLING=0): one uniform per
    # token from the request's stream, the host sampler's order and cuts;
    # they may differ only if a uniform falls within ~1e-6 of a CDF boundary
    kinds = [{}, {"top_p": 0.9}, {"temperature": 0.7, "top_k": 40}, {"temperature": 1.3, "min_p": 0.05},
             {"temperature": 0.8, "top_p": 0.8, "top_k": 20, "min_p": 0.02},
             {"logit_bias": {"13": 4.0, "29": -100}}]
    reqs = [dict({"model": "tern-demo", "seed": 77 + i, "max_tokens": 32,
                  "messages": [{"role": "user", "content": ASKS[i % 4]}]}, **kinds[i % len(kinds)])
            for i in range(2 * len(kinds))]
    dev = parallel(lambda b: post(srv, b), reqs)
    host = parallel(lambda b: post(hostpath, b), reqs)
    bad = [i for i in range(len(reqs)) if dev[i][0] != 200 or host[i][0] != 200 or content(dev[i]) != content(host[i])]
    report("device sampling: %d seeded requests (top-p/top-k/min-p/logit_bias, batched) equal TERN_GPU_SAMPLING=0"
           % len(reqs), not bad,
           "; ".join("%d %s: %r vs %r" % (i, json.dumps(kinds[i % len(kinds)]), (content(dev[i]) or "")[:40],
                                           (content(host[i]) or "")[:40]) for i in bad[:4]))


def lp_entries(resp):
    try:
        return resp[1]["choices"][0]["logprobs"]["content"]
    except Exception:
        return None


def lp_close(a, b, tol=2e-5):
    """Two responses' logprobs agree: the same tokens, values within tol
    (relative above 1); alternatives may swap only where their values tie."""
    if a is None or b is None or len(a) != len(b):
        return False
    for x, y in zip(a, b):
        if x.get("bytes") != y.get("bytes") or abs(x["logprob"] - y["logprob"]) > tol * (1 + abs(y["logprob"])):
            return False
        tx, ty = x.get("top_logprobs") or [], y.get("top_logprobs") or []
        if len(tx) != len(ty):
            return False
        for p, q in zip(tx, ty):
            d, m = abs(p["logprob"] - q["logprob"]), 1 + abs(q["logprob"])
            if d > tol * m or (p.get("bytes") != q.get("bytes") and d > 2e-6 * m):
                return False
    return True


def check_device_logprobs(srv, hostpath):
    # logprobs and min_tokens rows sample on the device: the same text and
    # logprobs as the host sampler over the same logits (TERN_GPU_SAMPLING=0)
    kinds = [{"temperature": 0, "logprobs": True, "top_logprobs": 5},
             {"logprobs": True, "top_logprobs": 20},
             {"temperature": 0.8, "top_p": 0.9, "top_k": 40, "logprobs": True, "top_logprobs": 3},
             {"temperature": 0.9, "presence_penalty": 0.5, "logprobs": True},
             {"temperature": 0, "min_tokens": 40, "max_tokens": 48},
             {"temperature": 0.7, "min_tokens": 30, "max_tokens": 40, "logprobs": True, "top_logprobs": 2}]
    reqs = [dict({"model": "tern-demo", "seed": 91 + i, "max_tokens": 24,
                  "messages": [{"role": "user", "content": ASKS[i % 4]}]}, **kinds[i % len(kinds)])
            for i in range(2 * len(kinds))]
    dev = parallel(lambda b: post(srv, b), reqs)
    host = parallel(lambda b: post(hostpath, b), reqs)

    def ok(i):
        d, h, k = dev[i], host[i], kinds[i % len(kinds)]
        if d[0] != 200 or h[0] != 200 or content(d) != content(h):
            return False
        if k.get("logprobs") and not lp_close(lp_entries(d), lp_entries(h)):
            return False
        return d[1].get("usage", {}).get("completion_tokens", 0) >= k.get("min_tokens", 0)
    bad = [i for i in range(len(reqs)) if not ok(i)]
    report("device sampling: %d logprobs / min_tokens requests (greedy, sampled, truncated, penalized; batched) "
           "equal TERN_GPU_SAMPLING=0, logprobs within 2e-5" % len(reqs), not bad,
           "; ".join("%d %s: %r vs %r" % (i, json.dumps(kinds[i % len(kinds)]), (content(dev[i]) or "")[:40],
                                           (content(host[i]) or "")[:40]) for i in bad[:4]))


def check_greedy_paths(srv, alone):
    # the same greedy request with and without logprobs must give the same
    # text (the device's argmax vs its sampler's greedy path)
    idx = [0, 1, 2, 3, 4, 5]
    lp = parallel(lambda i: post(srv, dict(request(i), logprobs=True, top_logprobs=2)), idx)
    bad = [i for i, r in zip(idx, lp) if r[0] != 200 or content(r) != content(alone[i])]
    have_lp = all(r[0] == 200 and r[1]["choices"][0].get("logprobs") for r in lp)
    report("greedy sampling: device argmax (plain) equals the device sampler's (with logprobs), grammar rows included",
           not bad and have_lp, "differ %s" % bad if bad else ("" if have_lp else "logprobs missing"))


def check_grammar(srv, label, n=24):
    rs = parallel(lambda i: post(srv, request(i, 64)), list(range(n)))
    bad = [(i, grammar_valid(i, r)) for i, r in enumerate(rs) if grammar_valid(i, r)]
    n_g = sum(1 for i in range(n) if i % 4)
    n_done = sum(1 for i in range(n) if i % 4 and finish(rs[i]) == "stop")
    report("grammar (%s): %d constrained outputs (%d complete) 100%% valid (JSON schema, regex, choice, thinking)"
           % (label, n_g, n_done), not bad and n_done > 0, "; ".join("%d: %s" % b for b in bad[:3]))


def check_spec(name, srv, alone, want_accept):
    a = [post(srv, request(i)) for i in range(16)]
    c = parallel(lambda i: post(srv, request(i)), list(range(16)))
    bad = [("alone", i) for i in range(16) if content(a[i]) != content(alone[i]) or finish(a[i]) != finish(alone[i])]
    bad += [("batch", i) for i in range(16) if content(c[i]) != content(alone[i]) or finish(c[i]) != finish(alone[i])]
    spec = [r[1].get("usage", {}).get("speculation") for r in a if r[0] == 200]
    spec = [x for x in spec if x]
    drafted = sum(x.get("drafted", 0) for x in spec)
    accepted = sum(x.get("accepted", 0) for x in spec)
    ok = not bad and (accepted > 0 or not want_accept)
    report("speculation (%s): 16 greedy requests alone and batched identical to no speculation; %d/%d drafts accepted"
           % (name, accepted, drafted), ok, ("differ %s" % bad[:6]) if bad else ("" if ok else "nothing accepted"))


def check_prefix_cache(srv):
    long = ("Here is a story about a lighthouse keeper who lived alone on a rocky island far from the coast. "
            "Every night he climbed the stairs, lit the lamp and watched the ships pass. ") * 4
    body = {"model": "tern-demo", "temperature": 0, "max_tokens": 24,
            "messages": [{"role": "user", "content": long + "What did he do every night?"}]}
    r1 = post(srv, body)
    r2 = post(srv, body)
    c1 = r1[1].get("usage", {}).get("prompt_tokens_details", {}).get("cached_tokens", -1) if r1[0] == 200 else -1
    c2 = r2[1].get("usage", {}).get("prompt_tokens_details", {}).get("cached_tokens", -1) if r2[0] == 200 else -1
    # n = 2 greedy: both choices identical
    r3 = post(srv, dict(body, n=2))
    ch = r3[1].get("choices", []) if r3[0] == 200 else []
    n2 = len(ch) == 2 and ch[0]["message"]["content"] == ch[1]["message"]["content"] == content(r1)
    ok = c2 > 0 and content(r1) == content(r2) and content(r1) is not None and n2
    report("prefix cache: repeated prompt reuses %d cached tokens with identical output; n=2 choices identical" % c2,
           ok, "cached %d then %d, same text %s, n=2 ok %s" % (c1, c2, content(r1) == content(r2), n2))


def check_cross_device(alone, cpu_alone):
    same = sum(1 for a, b in zip(alone, cpu_alone) if content(a) == content(b) and a[0] == 200)
    report("cross-device: %s greedy outputs equal the CPU's in %d/16 requests (>= 12 needed; ties may flip)"
           % (DEVICE, same), same >= 12,
           "" if same == 16 else "first differing: %s" % [i for i in range(16) if content(alone[i]) != content(cpu_alone[i])][:5])


def check_default_smoke(srv):
    t = time.time()
    rs = parallel(lambda i: post(srv, request(i, 40)), list(range(32)))
    dt = time.time() - t
    ok = all(r[0] == 200 and content(r) is not None and finish(r) in ("stop", "length") for r in rs)
    report("concurrency (default product paths): 32 concurrent mixed requests all answered", ok,
           "" if ok else str([(r[0], json.dumps(r[1])[:120]) for r in rs if r[0] != 200][:2]))
    n_tok = sum(r[1].get("usage", {}).get("completion_tokens", 0) for r in rs if r[0] == 200)
    alone = [post(srv, request(i, 40)) for i in range(8)]
    same = sum(1 for i in range(8) if content(alone[i]) == content(rs[i]))
    print("INFO default paths: 32 concurrent requests, %d tokens in %.2fs (%.0f tok/s); %d/8 equal to their run "
          "alone (cuBLAS prefill rounds to bf16: not guaranteed)" % (n_tok, dt, n_tok / dt if dt > 0 else 0, same),
          flush=True)


def main():
    t0 = time.time()
    if not os.path.exists(BIN):
        print("FAIL setup -- no tern binary at %s (set TERN_BIN)" % BIN)
        return 1
    exact = {"TERN_CUDA_GEMM_MIN_T": "1000000", "TERN_CUDA_GEMV": "staged,by-shape,by-shape"}
    dev = ["--device", DEVICE]
    srvs = [
        Server("exact", dev, exact),
        Server("draft", dev + ["--draft-model", DRAFT, "--num-draft-tokens", "4"], exact),
        Server("ngram", dev + ["--spec", "ngram", "--num-draft-tokens", "4"], exact),
        # no --device: auto must pick the GPU
        Server("default", (dev if DEVICE == "cpu" else []) + ["--max-batch", "64"]),
        Server("cpu", ["--device", "cpu"]),
        Server("hostpath", dev, dict(exact, TERN_GPU_SAMPLING="0")),
    ]
    by = {s.name: s for s in srvs}
    try:
        down = [s.name for s in srvs if not s.wait()]
        report("startup: 6 servers (exact, draft, ngram, default, cpu, hostpath) ready", not down,
               "; ".join("%s: %s" % (n, by[n].log.strip()[-400:]) for n in down))
        if down:
            return 1
        safe(check_selection, srvs)
        ex = by["exact"]
        alone = [post(ex, request(i)) for i in range(16)]
        report("answers: 16 greedy requests alone on the device", all(r[0] == 200 and content(r) is not None
                                                                        for r in alone),
               str([(r[0], json.dumps(r[1])[:160]) for r in alone if r[0] != 200][:2]))
        cpu_alone_box, host_box = {}, {}
        th = threading.Thread(target=lambda: cpu_alone_box.update(
            r=[post(by["cpu"], request(i)) for i in range(16)]))
        th.start()
        th2 = threading.Thread(target=lambda: host_box.update(
            r=[post(by["hostpath"], request(i)) for i in range(16)]))
        th2.start()
        safe(check_streaming, ex)
        safe(check_batching, ex, alone)
        safe(check_greedy_paths, ex, alone)
        safe(check_grammar, ex, "exact")
        safe(check_prefix_cache, ex)
        spec_threads = [threading.Thread(target=safe, args=(check_spec, "draft model", by["draft"], alone, True)),
                        threading.Thread(target=safe, args=(check_spec, "prompt lookup", by["ngram"], alone, False))]
        for t in spec_threads:
            t.start()
        safe(check_default_smoke, by["default"])
        safe(check_grammar, by["default"], "default")
        for t in spec_threads:
            t.join()
        th.join()
        th2.join()
        safe(check_device_sampler, ex, by["hostpath"])
        safe(check_device_logprobs, ex, by["hostpath"])
        safe(check_cross_device, alone, cpu_alone_box.get("r", []))
        hp = host_box.get("r", [])
        bad = [i for i in range(16) if i >= len(hp) or content(hp[i]) != content(alone[i])]
        report("greedy sampling: device path equals TERN_GPU_SAMPLING=0 (host sampling, no overlap), 16 requests "
               "alone", not bad, "differ %s" % bad[:6])
    finally:
        for s in srvs:
            rc = s.stop()
            if rc not in (0, None) and s.url:
                report("shutdown: %s server exits cleanly" % s.name, False, "exit %s: %s" % (rc, s.log[-300:]))
    safe(check_errors)
    safe(check_logits)
    n_fail = sum(1 for r in results if not r[1])
    print("server_check (%s): %d passed, %d failed in %.0fs" % (DEVICE, len(results) - n_fail, n_fail,
                                                                time.time() - t0))
    return 0 if n_fail == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
