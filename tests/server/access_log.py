#!/usr/bin/env python3
"""Logs and metrics of `tern serve` (src/server/access.c, metrics.c, base/log.c):
- one access line per request, with a timestamp, id (X-Request-Id kept and
  echoed), method, route, model, status, prompt/completion tokens (equal to
  the response's usage), TTFT <= duration, and `end=aborted` for a stream the
  client dropped;
- `--log-format json`: every stderr line is one JSON object (the load
  progress too), the access records with typed fields;
- /metrics parsed by the Prometheus client library's own text parser: the
  TTFT, inter-token latency, request duration and queue time histograms per
  model, cumulative buckets ending in +Inf == count, counts that match the
  requests made (one duration and TTFT per generation request, one queue
  time per engine request, tokens - 1 inter-token gaps per choice);
- on a terminal the load progress bar is rewritten in place and no log line
  is ever written into it (run under a pty).
"""
import json
import os
import pty
import re
import select
import socket
import subprocess
import sys
import time
import urllib.request

from prometheus_client.parser import text_string_to_metric_families  # Debian python3-prometheus-client

TERN = os.environ.get("TERN_BIN", "build/tern")
SRC = os.environ.get("TERN_SRC", os.path.join(os.path.dirname(__file__), "..", ".."))
MODEL = os.path.join(SRC, "models", "tern-demo")
fails = 0


def check(cond, what, detail=None):
    global fails
    if cond:
        print("ok  ", what)
    else:
        fails += 1
        print("FAIL", what, "" if detail is None else "-- %s" % str(detail)[:1500])


def start(extra):
    p = subprocess.Popen([TERN, "serve", MODEL, "--host", "127.0.0.1", "--port", "0"] + extra,
                         stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
    lines = []
    t0 = time.time()
    while time.time() - t0 < 60:
        line = p.stderr.readline()
        if not line:
            break
        lines.append(line.rstrip("\n"))
        m = re.search(r"serving \S+ on http://[^\s:]+:(\d+)", line)
        if m:
            return p, int(m.group(1)), lines
    raise SystemExit("server did not start:\n" + "\n".join(lines))


def stop(p, lines):
    p.terminate()
    rest = p.stderr.read()
    p.wait(15)
    lines += rest.splitlines()
    return p.returncode


def req(port, path, body=None, headers=None):
    r = urllib.request.Request("http://127.0.0.1:%d%s" % (port, path), data=None if body is None else json.dumps(body).encode(),
                               headers={"Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(r, timeout=60) as resp:
            return resp.status, dict(resp.headers), resp.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read().decode()


def sse_usage(text):
    u = None
    for line in text.split("\n"):
        if line.startswith("data: {"):
            d = json.loads(line[6:])
            if d.get("usage"):
                u = d["usage"]
    return u


CHAT = {"messages": [{"role": "user", "content": "Tell me a story."}], "max_tokens": 12, "temperature": 0}


def exercise(port):
    """Requests of every kind; returns {id: expected fields}."""
    exp = {}
    st, h, _ = req(port, "/health", headers={"X-Request-Id": "t-health"})
    exp["t-health"] = {"status": 200, "route": "health", "model": None}
    check(h.get("X-Request-Id") == "t-health", "X-Request-Id is echoed", h)
    st, h, body = req(port, "/v1/chat/completions", CHAT, {"X-Request-Id": "t-chat"})
    u = json.loads(body)["usage"]
    exp["t-chat"] = {"status": 200, "route": "chat_completions", "model": "tern-demo",
                     "prompt_tokens": u["prompt_tokens"], "completion_tokens": u["completion_tokens"], "gen": 1, "choices": 1}
    st, h, body = req(port, "/v1/completions", {"prompt": "Once upon a time", "max_tokens": 9, "n": 2, "stream": True,
                                                "stream_options": {"include_usage": True}}, {"X-Request-Id": "t-stream"})
    u = sse_usage(body)
    exp["t-stream"] = {"status": 200, "route": "completions", "model": "tern-demo",
                       "prompt_tokens": u["prompt_tokens"], "completion_tokens": u["completion_tokens"], "gen": 1, "choices": 2}
    st, h, body = req(port, "/v1/chat/completions", {"messages": "nope"}, {"X-Request-Id": "t-bad"})
    exp["t-bad"] = {"status": 400, "route": "chat_completions", "model": None}
    # a stream the client drops after its first chunk
    s = socket.create_connection(("127.0.0.1", port))
    b = json.dumps({**CHAT, "max_tokens": 400, "stream": True}).encode()
    s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              b"X-Request-Id: t-drop\r\nContent-Length: %d\r\n\r\n" % len(b) + b)
    got = b""
    while b"data: {" not in got:
        got += s.recv(4096)
    s.close()
    exp["t-drop"] = {"status": 200, "route": "chat_completions", "model": "tern-demo", "end": "aborted", "gen": 1,
                     "choices": None}
    time.sleep(1.0)  # its generation is cancelled and the line written
    return exp


def text_access(lines):
    out = {}
    for l in lines:
        m = re.match(r"tern: (\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z) info: access (.*)$", l)
        if m:
            kv = dict(x.split("=", 1) for x in m.group(2).split(" "))
            kv["time"] = m.group(1)
            out.setdefault(kv["id"], []).append(kv)
    return out


def check_access(recs, exp, typed):
    for rid, e in exp.items():
        got = recs.get(rid, [])
        check(len(got) == 1, "%s: exactly one access line" % rid, got)
        if len(got) != 1:
            continue
        g = got[0]
        num = (lambda v: v) if typed else (lambda v: None if v == "-" else float(v))
        check(int(num(g["status"])) == e["status"], "%s: status %d" % (rid, e["status"]), g)
        check(g["route"] == e["route"], "%s: route" % rid, g)
        model = g["model"] if typed else (None if g["model"] == "-" else g["model"])
        check(model == e["model"], "%s: model" % rid, g)
        check(g["end"] == e.get("end", "complete"), "%s: end" % rid, g)
        dur = float(num(g["duration_ms"]))
        check(dur >= 0, "%s: a duration" % rid, g)
        if "prompt_tokens" in e:
            check(int(num(g["prompt_tokens"])) == e["prompt_tokens"], "%s: prompt tokens = usage" % rid, (g, e))
            check(int(num(g["completion_tokens"])) == e["completion_tokens"], "%s: completion tokens = usage" % rid, (g, e))
        if e.get("gen"):
            ttft = num(g["ttft_ms"])
            check(ttft is not None and 0 <= float(ttft) <= dur, "%s: 0 <= ttft <= duration" % rid, g)
            check(re.match(r"c(hat)?cmpl-", g.get("completion_id", "")) or g.get("completion_id", "").startswith("cmpl-"),
                  "%s: the completion id" % rid, g)


def check_metrics(port, exp):
    st, h, text = req(port, "/metrics")
    fams = {f.name: f for f in text_string_to_metric_families(text)}
    gens = [e for e in exp.values() if e.get("gen")]
    for name in ["tern_time_to_first_token_seconds", "tern_inter_token_latency_seconds",
                 "tern_request_duration_seconds", "tern_queue_time_seconds"]:
        f = fams.get(name)
        check(f is not None and f.type == "histogram", "%s: a histogram" % name, list(fams)[:50])
        if not f:
            continue
        buckets = [(float(s.labels["le"]), s.value) for s in f.samples
                   if s.name.endswith("_bucket") and s.labels.get("model") == "tern-demo"]
        count = [s.value for s in f.samples if s.name.endswith("_count") and s.labels.get("model") == "tern-demo"]
        total = [s.value for s in f.samples if s.name.endswith("_sum") and s.labels.get("model") == "tern-demo"]
        check(buckets and buckets[-1][0] == float("inf") and count and buckets[-1][1] == count[0],
              "%s: +Inf bucket = count" % name, (buckets[-3:], count))
        check(all(buckets[i][1] <= buckets[i + 1][1] for i in range(len(buckets) - 1)) and
              all(buckets[i][0] < buckets[i + 1][0] for i in range(len(buckets) - 1)), "%s: cumulative buckets" % name)
        check(total and total[0] > 0, "%s: a positive sum" % name, total)
        if name == "tern_request_duration_seconds" or name == "tern_time_to_first_token_seconds":
            check(count and count[0] == len(gens), "%s: one per generation request" % name, (count, len(gens)))
        if name == "tern_queue_time_seconds":
            n_rows = sum(e["choices"] for e in gens if e["choices"])
            check(count and n_rows <= count[0] <= n_rows + 1, "%s: one per engine request" % name, (count, n_rows))
        if name == "tern_inter_token_latency_seconds":
            gaps = sum(e["completion_tokens"] - e["choices"] for e in gens if e["choices"])
            check(count and count[0] >= gaps, "%s: a gap per token after a choice's first" % name, (count, gaps))


# ---- text mode ----
p, port, lines = start([])
exp = exercise(port)
# the access lines are written before the next request is answered, except the dropped stream's
check_metrics(port, exp)
rc = stop(p, lines)
check(rc == 0, "text: clean exit", rc)
check_access(text_access(lines), exp, typed=False)

# ---- JSON mode ----
p, port, lines = start(["--log-format", "json"])
exp = exercise(port)
rc = stop(p, lines)
check(rc == 0, "json: clean exit", rc)
recs, bad = {}, []
for l in lines:
    try:
        o = json.loads(l)
    except ValueError:
        bad.append(l)
        continue
    if not (isinstance(o, dict) and re.match(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$", o.get("time", "")) and
            o.get("level") in ("debug", "info", "warn", "error") and isinstance(o.get("msg"), str)):
        bad.append(l)
    if o.get("msg") == "access":
        recs.setdefault(o["id"], []).append(o)
check(not bad, "json: every stderr line is a JSON record with time, level and msg", bad[:5])
check(any(o.get("steps") == 3 for o in map(json.loads, [l for l in lines if l.startswith("{")]) if "steps" in o),
      "json: the load progress is records too")
check_access(recs, exp, typed=True)
check(all(isinstance(r[0]["prompt_tokens"], int) and isinstance(r[0]["duration_ms"], (int, float))
          for r in recs.values()), "json: typed fields")

# ---- a terminal: the progress bar and log lines never share a line ----
pid, fd = pty.fork()
if pid == 0:
    os.execv(TERN, [TERN, "serve", MODEL, "--host", "127.0.0.1", "--port", "0", "--verbose"])
buf = b""
t0 = time.time()
while time.time() - t0 < 60 and b"serving" not in buf:
    r, _, _ = select.select([fd], [], [], 1)
    if r:
        try:
            buf += os.read(fd, 65536)
        except OSError:
            break
os.kill(pid, 15)
os.waitpid(pid, 0)
out = buf.decode("utf-8", "replace").replace("\r\n", "\n")
bars, logs, mixed = 0, 0, []
for raw in out.split("\n"):
    seg = raw.split("\r\x1b[K")[-1]  # what the terminal shows on that line in the end
    for part in raw.split("\r\x1b[K"):
        if not part:
            continue
        is_bar = re.match(r"^\[[=> ]{24}\] \d/\d ", part) is not None
        is_log = part.startswith("tern: ")
        bars += is_bar
        logs += is_log
        if not (is_bar or is_log) or (is_bar and "tern: " in part) or (is_log and re.search(r"\[[=> ]{24}\]", part)):
            mixed.append(part)
    del seg
check(bars >= 3 and logs >= 2, "pty: a progress bar and log lines", (bars, logs, out[-800:]))
check(not mixed, "pty: no line holds both a progress bar and a log line", mixed[:5])

print("access_log: %d failed" % fails)
sys.exit(1 if fails else 0)
