#!/usr/bin/env python3
"""bench/bench_serve against `tern serve` on the demo model, its numbers
checked against the server's own counters (/metrics) and against each other:
- --drain (every request finishes): the requests, prompt tokens and
  completion tokens the load generator counted equal the server's counter
  deltas exactly; every request decoded its max_tokens (ignore_eos) and no
  more chunks than tokens; a level's output tokens are the sum over its
  requests, tok/s and req/s are those over the window, percentiles ordered;
  the k-th request of every level has the same lengths (seeded workload) and
  the lengths stay within the stated clip;
- default (requests in flight at the deadline are closed): the closed ones
  are counted as aborted with the chunks they got, and the server cancels
  exactly that many generations;
- serve.md, the plots and --compare's side-by-side table are written.
"""
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

TERN = os.environ.get("TERN_BIN", "build/tern")
BUILD = os.environ.get("TERN_BUILD", os.path.dirname(TERN))
BENCH = os.path.join(BUILD, "bench", "bench_serve")
SRC = os.environ.get("TERN_ROOT", os.path.join(os.path.dirname(__file__), "..", ".."))
MODEL = os.path.join(SRC, "models", "tern-demo")
fails = 0


def check(cond, what, detail=None):
    global fails
    if cond:
        print("ok  ", what)
    else:
        fails += 1
        print("FAIL", what, "" if detail is None else "-- %s" % str(detail)[:1500])


def start():
    p = subprocess.Popen([TERN, "serve", MODEL, "--host", "127.0.0.1", "--port", "0", "--max-batch", "8"],
                         stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
    t0 = time.time()
    lines = []
    while time.time() - t0 < 60:
        line = p.stderr.readline()
        if not line:
            break
        lines.append(line)
        m = re.search(r"serving \S+ on (http://[^\s]+:\d+)", line)
        if m:
            threading.Thread(target=lambda: [None for _ in p.stderr], daemon=True).start()  # keep the pipe drained
            return p, m.group(1)
    p.kill()
    sys.exit("server did not start:\n" + "".join(lines))


def metrics(url):
    text = urllib.request.urlopen(url + "/metrics", timeout=30).read().decode()
    out = {}
    for line in text.splitlines():
        m = re.match(r"^(tern_[a-z_]+(?:\{[^}]*\})?) (\S+)$", line)
        if m:
            out[m.group(1)] = float(m.group(2))
    return out


def delta(a, b, key):
    return b.get(key, 0) - a.get(key, 0)


def bench(url, out, extra):
    cmd = [BENCH, "--url", url, "--out", out, "--input", "80,0.6,8,300", "--seed", "7"] + extra
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
    print(r.stdout, r.stderr, sep="")
    return r.returncode, json.load(open(os.path.join(out, "serve.json"))) if os.path.exists(
        os.path.join(out, "serve.json")) else None


def close(a, b, rel=1e-6):
    return abs(a - b) <= rel * max(abs(a), abs(b), 1e-9)


def check_level(lv, run):
    c = lv["clients"]
    reqs = lv["requests"]
    done = [q for q in reqs if q["status"] == "done"]
    aborted = [q for q in reqs if q["status"] == "aborted"]
    check(lv["requests_failed"] == 0 and all(q["status"] in ("done", "aborted") for q in reqs),
          "%d clients: no failed request" % c, lv["first_error"])
    check(lv["requests_started"] == len(reqs) and lv["requests_done"] == len(done)
          and lv["requests_aborted"] == len(aborted), "%d clients: request counts add up" % c)
    out = sum(q["completion_tokens"] for q in done) + sum(q["chunks"] for q in aborted)
    check(lv["output_tokens"] == out, "%d clients: output tokens = sum over requests" % c, (lv["output_tokens"], out))
    check(all(q["completion_tokens"] == q["max_tokens"] for q in done),
          "%d clients: every finished request decoded its max_tokens (ignore_eos)" % c,
          [(q["max_tokens"], q["completion_tokens"]) for q in done if q["completion_tokens"] != q["max_tokens"]])
    check(all(1 <= q["chunks"] <= q["completion_tokens"] for q in done),
          "%d clients: 1 <= chunks <= tokens per request" % c)
    check(all(q["prompt_tokens"] > 0 for q in done), "%d clients: usage prompt tokens" % c)
    w = run["workload"]["output"]
    check(all(w["min"] <= q["max_tokens"] <= w["max"] for q in reqs), "%d clients: max_tokens within the clip" % c)
    check(close(lv["output_tok_s"], lv["output_tokens"] / lv["window_s"]) and
          close(lv["requests_s"], lv["requests_done"] / lv["window_s"]), "%d clients: rates over the window" % c)
    for k in ("ttft_ms", "itl_ms", "tpot_ms"):
        p = lv[k]
        check(0 <= p["p50"] <= p["p90"] <= p["p99"], "%d clients: %s percentiles ordered" % (c, k), p)
    check(lv["ttft_ms"]["n"] == sum(1 for q in reqs if q["chunks"] > 0), "%d clients: a TTFT per started stream" % c)
    check(lv["itl_ms"]["n"] == sum(q["chunks"] - 1 for q in reqs if q["chunks"] > 0),
          "%d clients: chunks - 1 gaps per stream" % c)
    check(len(done) >= c, "%d clients: at least one request per client finished" % c, len(done))


def main():
    if not os.path.exists(BENCH):
        sys.exit("no %s (build the bench targets)" % BENCH)
    p, url = start()
    tmp = tempfile.mkdtemp(prefix="serve_bench.")
    try:
        # 1. drain: exact accounting against the server's counters
        m0 = metrics(url)
        rc, run = bench(url, os.path.join(tmp, "drain"), ["--drain", "--clients", "1,3", "--duration", "2",
                                                            "--output", "24,0.5,4,64", "--label", "drained"])
        m1 = metrics(url)
        check(rc == 0 and run is not None, "bench_serve --drain ran clean", rc)
        if run is None:
            return 1
        tot = run["totals"]
        check(tot["requests"] == delta(m0, m1, "tern_engine_requests_finished_total"),
              "requests = the server's finished requests", (tot["requests"], delta(m0, m1, "tern_engine_requests_finished_total")))
        check(tot["completion_tokens"] == delta(m0, m1, "tern_completion_tokens_total"),
              "completion tokens = the server's", (tot["completion_tokens"], delta(m0, m1, "tern_completion_tokens_total")))
        check(tot["prompt_tokens"] == delta(m0, m1, "tern_prompt_tokens_total"),
              "prompt tokens = the server's", (tot["prompt_tokens"], delta(m0, m1, "tern_prompt_tokens_total")))
        levels = run["levels"]
        check([lv["clients"] for lv in levels] == [1, 3], "one level per client count")
        for lv in levels:
            check_level(lv, run)
            check(lv["requests_aborted"] == 0, "%d clients: drained, nothing closed" % lv["clients"])
        check(sum(lv["requests_started"] for lv in levels) + 2 == tot["requests"],
              "levels' requests + 2 calibration = all requests")
        check(sum(lv["output_tokens"] for lv in levels) + 2 == tot["completion_tokens"],
              "levels' output tokens + 2 = all completion tokens")
        a, b = levels[0]["requests"], levels[1]["requests"]
        n = min(len(a), len(b))
        check(n > 0 and [q["max_tokens"] for q in a[:n]] == [q["max_tokens"] for q in b[:n]]
              and [q["prompt_target"] for q in a[:n]] == [q["prompt_target"] for q in b[:n]],
              "request k has the same lengths at every level (seeded)")
        # 2. closing at the deadline: long requests are cut, the server cancels them
        m0 = metrics(url)
        rc, cut = bench(url, os.path.join(tmp, "cut"), ["--clients", "2", "--duration", "1.5",
                                                        "--output", "1500,0,1500,1500", "--label", "cut"])
        check(rc == 0 and cut is not None, "bench_serve (closing) ran clean", rc)
        if cut is None:
            return 1
        lv = cut["levels"][0]
        reqs = lv["requests"]
        check(lv["requests_failed"] == 0 and lv["output_tokens"] == sum(
            q["completion_tokens"] if q["status"] == "done" else q["chunks"] for q in reqs),
            "closing: output tokens = finished requests' tokens + closed requests' chunks", lv["first_error"])
        check(lv["requests_aborted"] == 2, "both clients' last requests were closed", lv["requests_aborted"])
        for _ in range(100):
            m1 = metrics(url)
            if m1.get("tern_running_requests", 1) == 0 and m1.get("tern_streams_active", 1) == 0:
                break
            time.sleep(0.1)
        check(delta(m0, m1, "tern_engine_requests_cancelled_total") == lv["requests_aborted"],
              "the server cancelled as many generations as were closed",
              (delta(m0, m1, "tern_engine_requests_cancelled_total"), lv["requests_aborted"]))
        check(lv["output_tokens"] <= delta(m0, m1, "tern_tokens_decoded_total") and lv["output_tokens"] > 0,
              "tokens counted <= tokens the server decoded", (lv["output_tokens"], delta(m0, m1, "tern_tokens_decoded_total")))
        # 3. reports
        for f in ("serve.md", "throughput.png", "latency.png", "throughput.svg", "plots.gp"):
            check(os.path.getsize(os.path.join(tmp, "drain", f)) > 0, "report file " + f)
        r = subprocess.run([BENCH, "--compare", os.path.join(tmp, "drain", "serve.json"),
                            os.path.join(tmp, "cut", "serve.json"), "--out", os.path.join(tmp, "cmp")],
                           capture_output=True, text=True, timeout=60)
        md = open(os.path.join(tmp, "cmp", "compare.md")).read() if r.returncode == 0 else ""
        tok_s = "%.1f" % levels[0]["output_tok_s"]
        check(r.returncode == 0 and "| 1 | " + tok_s + " | - |" in md and "drained / cut" in md,
              "--compare: the side-by-side table", r.stderr + md[:600])
    finally:
        p.terminate()
        try:
            p.wait(15)
        except subprocess.TimeoutExpired:
            p.kill()
    print("serve_bench: %s" % ("all passed" if fails == 0 else "%d failed" % fails))
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
