#!/usr/bin/python3
"""KV cache events through `tern serve --kv-events`, read by a ZeroMQ
subscriber as a router would (Debian's python3-zmq, python3-msgpack,
python3-xxhash; run with Debian's python3):
- every batch is (topic, 8-byte big-endian sequence 0, 1, 2, ..., msgpack);
- BlockStored's hashes are the prefix cache's chain hashes: recomputed
  from the event's own tokens and parent (XXH3-64 of the int32 tokens,
  seeded with the parent hash), and every full block of every prompt
  (tokens from /tokenize) is announced before its request's answer comes;
- with a KV budget that forces eviction: BlockRemoved names only blocks
  announced before and not removed since, and at every quiet moment the
  announced-minus-removed set has exactly /stats' kv_blocks_cached blocks;
- the replay socket returns every batch from a sequence number on, then
  the end marker; shutdown sends AllBlocksCleared;
- --kv-events-format map gives the same events as maps; /metrics carries
  the vLLM-named gauges routers read; a bad endpoint is a clean exit 1."""
import json, os, re, shutil, signal, struct, subprocess, sys, tempfile, time, urllib.request

import msgpack
import xxhash
import zmq

TERN = os.environ["TERN_BIN"]
ROOT = os.environ.get("TERN_ROOT", os.path.join(os.path.dirname(__file__), "..", ".."))
MODEL = os.path.join(ROOT, "models", "tern-demo")
BS = 16
failures = 0


def check(ok, what):
    global failures
    print(("ok   " if ok else "FAIL ") + what)
    if not ok:
        failures += 1


def start(args):
    p = subprocess.Popen([TERN, "serve", MODEL, "--host", "127.0.0.1", "--port", "0", *args],
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    end = time.time() + 60
    log = ""
    while time.time() < end:
        line = p.stdout.readline()
        if not line:
            break
        log += line
        m = re.search(r"serving \S+ on (http://[^\s]+)", line)
        if m:
            return p, m.group(1)
    p.kill()
    raise RuntimeError("server did not start:\n" + log)


def post(url, path, body):
    req = urllib.request.Request(url + path, data=json.dumps(body).encode(), headers={"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        return json.loads(r.read())


def get(url, path):
    with urllib.request.urlopen(url + path, timeout=30) as r:
        return r.read().decode()


def chain(parent, toks):
    h = xxhash.xxh3_64_intdigest(struct.pack("<%di" % len(toks), *toks), seed=parent)
    return h or 1


class Sub:
    def __init__(self, ctx, endpoint):
        self.s = ctx.socket(zmq.SUB)
        self.s.connect(endpoint)
        self.s.setsockopt(zmq.SUBSCRIBE, b"")
        self.batches = []  # (topic, seq, payload bytes, decoded)

    def drain(self, quiet=0.5):
        """Reads until nothing came for `quiet` seconds."""
        while self.s.poll(int(quiet * 1000)):
            topic, seq, payload = self.s.recv_multipart()
            self.batches.append((topic, struct.unpack(">q", seq)[0], payload, msgpack.unpackb(payload, raw=False)))


tmp = tempfile.mkdtemp(prefix="tern-kvev-")
ev_ep, replay_ep = "ipc://%s/ev" % tmp, "ipc://%s/replay" % tmp
ctx = zmq.Context()
srv, url = start(["--kv-events", ev_ep, "--kv-events-replay", replay_ep, "--kv-budget", "0.004", "--max-batch", "2",
                  "-c", "256", "--kv-type", "f32"])  # a budget of f32 blocks
try:
    sub = Sub(ctx, ev_ep)
    time.sleep(0.5)  # PUB/SUB: the subscription must reach the server first
    words = "the cat sat on a mat and looked at the bird in the old tree by the river".split()
    prompts = []
    for i in range(14):
        base = "Story %d: " % (i % 5) + " ".join(words[(i * 3 + k) % len(words)] for k in range(60))
        prompts.append(base)
    live, stored_ever, problems = set(), set(), []
    prompt_blocks = []
    cached_checks = 0
    for i, p in enumerate(prompts + prompts[:4]):
        toks = post(url, "/tokenize", {"content": p, "add_special": True})["tokens"]
        r = post(url, "/v1/completions", {"prompt": p, "max_tokens": 6, "temperature": 0})
        sub.drain(0.4)
        h, hashes = 0, []
        for b in range(len(toks) // BS):
            h = chain(h, toks[b * BS:(b + 1) * BS])
            hashes.append(h)
        prompt_blocks.append(hashes)
        live, stored_ever = set(), set()
        for _, _, _, batch in sub.batches:
            for ev in batch[1]:
                if ev[0] == "BlockStored":
                    parent = ev[2] if ev[2] is not None else 0
                    toks_ev = ev[3]
                    if len(toks_ev) != BS * len(ev[1]) or ev[4] != BS:
                        problems.append("stored event with %d tokens for %d blocks" % (len(toks_ev), len(ev[1])))
                    for k, hh in enumerate(ev[1]):
                        want = chain(parent, toks_ev[k * BS:(k + 1) * BS])
                        if want != hh:
                            problems.append("stored hash %x is not the chain hash %x" % (hh, want))
                        parent = hh
                        if hh in live:
                            problems.append("block %x stored twice without a removal" % hh)
                        live.add(hh)
                        stored_ever.add(hh)
                elif ev[0] == "BlockRemoved":
                    for hh in ev[1]:
                        if hh not in live:
                            problems.append("block %x removed but not live" % hh)
                        live.discard(hh)
        missing = [x for x in hashes if x not in stored_ever]
        if missing:
            problems.append("request %d: %d of its %d prompt blocks never announced" % (i, len(missing), len(hashes)))
        st = json.loads(get(url, "/stats"))
        cached = st.get("engine", st).get("kv_blocks_cached")
        if cached is None:
            cached = re.search(r'"kv_blocks_cached":\s*(\d+)', json.dumps(st))
            cached = int(cached.group(1)) if cached else -1
        if cached != len(live):
            problems.append("after request %d: %d live blocks announced, the cache holds %d" % (i, len(live), cached))
        cached_checks += 1
    seqs = [b[1] for b in sub.batches]
    n_stored = sum(len(e[1]) for b in sub.batches for e in b[3][1] if e[0] == "BlockStored")
    n_removed = sum(len(e[1]) for b in sub.batches for e in b[3][1] if e[0] == "BlockRemoved")
    print("%d batches, %d blocks stored, %d removed" % (len(seqs), n_stored, n_removed))
    check(seqs == list(range(len(seqs))) and len(seqs) > 0, "sequence numbers 0, 1, 2, ... (%d batches)" % len(seqs))
    check(all(b[0] == b"" for b in sub.batches), "the default topic is empty")
    check(not problems, "stored hashes are the chain hashes, every prompt block announced, removals consistent, "
          "live set = the cache (%d checks): %s" % (cached_checks, problems[:5]))
    check(n_removed > 0, "the small KV budget evicted blocks (%d removed)" % n_removed)
    check(all(len(b[3]) == 3 and isinstance(b[3][0], float) and b[3][2] == 0 for b in sub.batches),
          "batches are [ts, events, data_parallel_rank]")
    check(all(e[-1] == "CPU" for b in sub.batches for e in b[3][1] if e[0] in ("BlockStored", "BlockRemoved")),
          "medium CPU")
    # replay from sequence 1: every batch from there, byte for byte, then the end marker
    d = ctx.socket(zmq.DEALER)
    d.connect(replay_ep)
    d.send_multipart([b"", struct.pack(">q", 1)])
    got = []
    while d.poll(5000):
        fr = d.recv_multipart()
        seq = struct.unpack(">q", fr[1])[0]
        if seq == -1:
            break
        got.append((seq, fr[2]))
    check(got == [(b[1], b[2]) for b in sub.batches[1:]], "replay from 1 returns the batches (%d of %d)" %
          (len(got), len(sub.batches) - 1))
    metrics = get(url, "/metrics")
    check(all(re.search(r"^%s [0-9.e+-]+$" % re.escape(n), metrics, re.M) for n in
              ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc")),
          "/metrics has the router gauges")
    srv.send_signal(signal.SIGTERM)
    srv.wait(timeout=30)
    sub.drain(1.0)
    last = sub.batches[-1][3][1] if sub.batches else []
    check(any(e[0] == "AllBlocksCleared" for e in last), "shutdown announces AllBlocksCleared")
finally:
    if srv.poll() is None:
        srv.kill()

# maps, a topic
srv, url = start(["--kv-events", ev_ep, "--kv-events-format", "map", "--kv-events-topic", "kv@tern"])
try:
    sub = Sub(ctx, ev_ep)
    time.sleep(0.5)
    post(url, "/v1/completions", {"prompt": prompts[0], "max_tokens": 4, "temperature": 0})
    sub.drain(0.5)
    ok = bool(sub.batches)
    for topic, _, _, b in sub.batches:
        ok &= topic == b"kv@tern" and isinstance(b, dict) and set(b) == {"ts", "events", "data_parallel_rank"}
        for e in b["events"]:
            ok &= e.get("type") == "BlockStored" and set(e) >= {"block_hashes", "parent_block_hash", "token_ids",
                                                                 "block_size", "lora_id", "medium"}
    check(ok, "--kv-events-format map and --kv-events-topic")
finally:
    srv.kill()
    srv.wait()

p = subprocess.run([TERN, "serve", MODEL, "--port", "0", "--kv-events", "nonsense://x"], capture_output=True,
                   text=True, timeout=60)
check(p.returncode == 1 and "kv events" in p.stderr, "a bad endpoint: exit 1 naming it (%r)" % p.stderr.strip()[-100:])
shutil.rmtree(tmp, ignore_errors=True)
print("%d failed" % failures if failures else "all kv event checks passed")
sys.exit(1 if failures else 0)
