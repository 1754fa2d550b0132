#!/usr/bin/env python3
"""tern bench on the demo pair, small enough for the suite:
- a tiny matrix (4 features x none/draft/ngram x 1 and 2 streams, cold and
  warm cache) plus the same load against a `tern serve` over HTTP
  (--compare): every planned cell is in report.json exactly once, with the
  requests it was to run, none failed, plain requests decoding exactly
  --max-tokens tokens, speculation and cache numbers where (and only where)
  they apply; the summary adds up; report.md has a row per cell; the PNG
  and SVG plots exist and parse;
- against a server that ignores the constraint (a stub that streams the same
  free text for everything), the choice cell is a failed cell - present,
  every request counted invalid, the reason named - not a missing one."""
import http.server, json, os, re, socketserver, subprocess, sys, tempfile, threading
import xml.etree.ElementTree as ET

TERN = os.environ["TERN_BIN"]
ROOT = os.environ.get("TERN_ROOT", ".")
MODEL = os.path.join(ROOT, "models/tern-demo")
DRAFT = os.path.join(ROOT, "models/tern-demo-draft")
FEATURES = ["plain", "json_schema", "regex", "choice"]
failures = 0


def check(ok, what):
    global failures
    print(("ok   " if ok else "FAIL ") + what)
    if not ok:
        failures += 1


def start_serve():
    p = subprocess.Popen([TERN, "serve", MODEL, "--port", "0", "--threads", "1"], stderr=subprocess.PIPE, text=True)
    for line in p.stderr:
        m = re.search(r"on http://127\.0\.0\.1:(\d+)", line)
        if m:
            threading.Thread(target=lambda: p.stderr.read(), daemon=True).start()
            return p, int(m.group(1))
    raise SystemExit("tern serve did not start")


def bench(out, *extra):
    return subprocess.run([TERN, "bench", MODEL, "--out", out, *extra], capture_output=True, text=True, timeout=900)


with tempfile.TemporaryDirectory() as tmp:
    srv, port = start_serve()
    try:
        out = os.path.join(tmp, "r")
        p = bench(out, "--draft", DRAFT, "--quick", "--streams", "1,2", "--requests", "2", "--max-tokens", "8",
                  "--kv-types", "q8,bf16", "--compare", "http://127.0.0.1:%d/v1" % port)
    finally:
        srv.terminate()
        srv.wait(timeout=30)
    print(p.stderr[-3000:])
    check(p.returncode == 0, "bench exits 0")
    rep = json.load(open(os.path.join(out, "report.json")))
    cells = rep["cells"]
    # the plan: quick keeps the warm cache to no speculation; each KV type is a plain cold cell at the most streams
    want = set()
    for streams in (1, 2):
        for f in FEATURES:
            for spec in ("none", "draft", "ngram"):
                want.add(("tern", f, spec, streams, "cold", "default"))
            want.add(("tern", f, "none", streams, "warm", "default"))
            want.add(("compare", f, "none", streams, "primed", "default"))
    for kv in ("q8", "bf16"):
        want.add(("tern", "plain", "none", 2, "cold", kv))
    got = [(c["target"], c["feature"], c["spec"], c["concurrency"], c["prefix_cache"], c["kv_type"]) for c in cells]
    check(len(got) == len(set(got)), "no cell twice")
    check(set(got) == want, "every planned cell is present (%d of %d)" % (len(set(got) & want), len(want)))
    for c in cells:
        name = "%s %s/%s/%d/%s/%s" % (c["target"], c["feature"], c["spec"], c["concurrency"], c["prefix_cache"],
                                     c["kv_type"])
        check(c["requests"] == max(2, c["concurrency"]), name + ": ran its requests (%d)" % c["requests"])
        check(c["failed"] == 0 and c["ok"] and c["error"] is None, name + ": none failed (%s)" % c["error"])
        check(c["tokens"] > 0 and c["tok_s"] > 0 and c["wall_s"] > 0, name + ": tokens and tok/s")
        check(0 < c["ttft_ms"]["p50"] <= c["ttft_ms"]["p99"], name + ": ttft p50 <= p99")
        if c["feature"] == "plain":
            check(c["tokens"] == 8 * c["requests"], name + ": plain decodes exactly --max-tokens")
        if c["target"] == "compare":
            continue
        check(c["kv_type"] in ("default", "q8", "bf16") and c["memory"]["rss_peak_mb"] > 0 and
              c["memory"]["kv_peak_mb"] >= 0, name + ": memory")
        check((c["grammar_us_per_token"] is not None) == (c["feature"] != "plain"), name + ": grammar cost iff grammar")
        check((c["drafted"] > 0) == (c["spec"] == "draft") or c["spec"] == "ngram", name + ": drafts iff draft")
        check((c["acceptance"] is not None) == (c["drafted"] > 0), name + ": acceptance iff drafts")
        check((c["cached_tokens"] > 0) == (c["prefix_cache"] == "warm"), name + ": cached tokens iff warm")
        if c["spec"] != "none" and c["acceptance"] is not None:
            check(c["speedup_vs_no_spec"] is not None, name + ": speed-up against its no-speculation cell")
        if c["feature"] != "plain":
            check(c["overhead_vs_plain_pct"] is not None, name + ": overhead against plain")
    s = rep["summary"]
    check(s["cells"] == len(cells) and s["requests"] == sum(c["requests"] for c in cells) and s["failed_cells"] == 0,
          "summary adds up")
    md = open(os.path.join(out, "report.md")).read()
    rows = [l for l in md.splitlines() if re.match(r"\| (plain|json_schema|regex|choice) \| (none|draft|ngram) \|", l)]
    check(sum(" | q8 | " in l for l in rows) == 1 and sum(" | bf16 | " in l for l in rows) == 1,
          "report.md: the KV type cells are named")
    check(len(rows) == len(cells), "report.md: a row per cell (%d)" % len(rows))
    side = md.split("## Side by side", 1)[1] if "## Side by side" in md else ""
    side_rows = [l for l in side.splitlines() if re.match(r"\| (plain|json_schema|regex|choice) \| \d+ \|", l)]
    check(len(side_rows) == sum(c["target"] == "compare" for c in cells), "report.md: side by side, a row per compared cell")
    check(all("decode_speedup_vs_no_spec" in c for c in cells), "decode speed-up in every cell")
    for plot in ("throughput", "latency", "speedup"):
        png = open(os.path.join(out, plot + ".png"), "rb").read()
        check(png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10000, plot + ".png is a PNG")
        root = ET.parse(os.path.join(out, plot + ".svg")).getroot()
        check(root.tag.endswith("svg") and len(list(root.iter())) > 50, plot + ".svg parses")

    # A server that ignores constraints: the cell fails, it does not vanish.
    class Stub(http.server.BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass

        def do_GET(self):
            body = b'{"object":"list","data":[{"id":"stub"}]}'
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_POST(self):
            self.rfile.read(int(self.headers["Content-Length"]))
            chunks = ["I think", " it is nice."]
            out = "".join('data: {"choices":[{"index":0,"delta":{"content":%s}}]}\n\n' % json.dumps(c) for c in chunks)
            out += 'data: {"choices":[],"usage":{"completion_tokens":5}}\n\ndata: [DONE]\n\n'
            b = out.encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Content-Length", str(len(b)))
            self.end_headers()
            self.wfile.write(b)

    stub = socketserver.ThreadingTCPServer(("127.0.0.1", 0), Stub)
    threading.Thread(target=stub.serve_forever, daemon=True).start()
    out2 = os.path.join(tmp, "f")
    p = bench(out2, "--quick", "--streams", "1", "--features", "choice", "--requests", "2", "--max-tokens", "4",
              "--compare", "http://127.0.0.1:%d" % stub.server_address[1])
    stub.shutdown()
    print(p.stderr[-2000:])
    check(p.returncode == 0, "bench against the stub exits 0")
    rep = json.load(open(os.path.join(out2, "report.json")))
    bad = [c for c in rep["cells"] if c["target"] == "compare"]
    check(len(bad) == 1, "the stub's cell is in the report")
    if bad:
        c = bad[0]
        check(not c["ok"] and c["requests"] == 2 and c["failed"] == 2 and c["invalid"] == 2,
              "every stub output counted invalid (%d/%d)" % (c["invalid"], c["requests"]))
        check("not one of" in (c["error"] or ""), "the reason is named: %s" % c["error"])
    check(all(c["ok"] for c in rep["cells"] if c["target"] == "tern"), "tern's own cells still pass")
    check(rep["summary"]["failed_cells"] == 1, "summary counts the failed cell")
    check("## Failed cells (1)" in open(os.path.join(out2, "report.md")).read(), "report.md lists the failed cell")

    # A machine without gnuplot: the reports are written, the missing plots are a warning, the exit status 0.
    out3 = os.path.join(tmp, "noplot")
    p = subprocess.run([TERN, "bench", MODEL, "--out", out3, "--quick", "--streams", "1", "--requests", "1",
                        "--max-tokens", "4", "--features", "plain", "--kv-types", ""], capture_output=True, text=True,
                       timeout=900, env=dict(os.environ, PATH=os.path.join(tmp, "no-such-dir")))
    check(p.returncode == 0, "bench without gnuplot exits 0 (%d: %s)" % (p.returncode, p.stderr[-300:]))
    check("gnuplot is not installed" in p.stderr, "bench without gnuplot says the plots were not made")
    check(os.path.exists(os.path.join(out3, "report.md")) and os.path.exists(os.path.join(out3, "plots.gp")),
          "bench without gnuplot still writes the reports and the plot script")
    check(not os.path.exists(os.path.join(out3, "throughput.png")), "no plot appears without gnuplot")

print("%d failed" % failures)
sys.exit(1 if failures else 0)
