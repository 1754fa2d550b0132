#!/usr/bin/env python3
"""Every subcommand's failure path is a clean exit 1 with one line on stderr
naming the subcommand (never a signal, never a sanitizer report), for a
folder that does not exist, an empty folder and a model folder whose
config.json does not parse; and model files that lie are load errors naming
what lies:
- two tensors of one file sharing bytes (data_offsets);
- an index naming a tensor its shard does not hold (not "appears twice");
- eos_token_id outside the vocabulary;
- rms_norm_eps NaN, infinite, zero or negative;
- a tokenizer whose vocabulary gives two pieces one id, or two added tokens
  one id."""
import json, os, shutil, struct, subprocess, sys, tempfile

TERN = os.environ["TERN_BIN"]
SHARED = os.environ.get("TERN_SHARED", "../shared")
STORIES = os.path.join(SHARED, "models/stories260K")
failures = 0


def check(ok, what):
    global failures
    print(("ok   " if ok else "FAIL ") + what)
    if not ok:
        failures += 1


def run(*args, stdin=""):
    return subprocess.run([TERN, *args], input=stdin, capture_output=True, text=True, timeout=300)


def clean_failure(p, sub, what, needle=None):
    """exit 1, stderr's last line 'tern SUB: ...' (serve prints its progress
    lines first) and nothing a sanitizer says."""
    err = p.stderr
    last = err.strip().splitlines()[-1] if err.strip() else ""
    ok = p.returncode == 1 and last.startswith("tern " + sub + ":") and "Sanitizer" not in err and \
        "runtime error" not in err and (needle is None or needle in err)
    check(ok, "%s: %s -> exit %d, %s" % (sub, what, p.returncode, last))


tmp = tempfile.mkdtemp(prefix="tern-fail-")
missing = os.path.join(tmp, "no-such-folder")
empty = os.path.join(tmp, "empty")
os.mkdir(empty)


def model_copy(name, files=("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
                            "model.safetensors")):
    d = os.path.join(tmp, name)
    os.mkdir(d)
    for f in files:
        shutil.copy(os.path.join(STORIES, f), d)
    return d


broken = model_copy("broken-config")
with open(os.path.join(broken, "config.json"), "w") as f:
    f.write("{\"model_type\": \"llama\",")
text = os.path.join(tmp, "text.txt")
with open(text, "w") as f:
    f.write("Once upon a time there was a little girl. " * 20)

# --- each subcommand, each way a folder fails ---------------------------------
for folder, what in ((missing, "missing folder"), (empty, "empty folder"), (broken, "unparseable config.json")):
    clean_failure(run("run", folder, "--prompt", "hi", "--max-tokens", "2"), "run", what)
    clean_failure(run("chat", folder, stdin="hi\n"), "chat", what)
    clean_failure(run("logits", folder, "--prompt", "hi"), "logits", what)
    clean_failure(run("logits", folder, "--ids", "1,2"), "logits", what + " (--ids)")
    clean_failure(run("perplexity", folder, "--file", text, "--ctx", "16"), "perplexity", what)
    clean_failure(run("convert", folder, os.path.join(tmp, "out-" + what.replace(" ", "-")), "--bits", "8"),
                  "convert", what)
    clean_failure(run("serve", folder, "--port", "0"), "serve", what)
    clean_failure(run("bench", folder, "--out", os.path.join(tmp, "bench-" + what.replace(" ", "-"))), "bench", what)
    if folder != broken:  # these read only the tokenizer / template files
        clean_failure(run("tokenize", folder, stdin="hi"), "tokenize", what)
        clean_failure(run("detokenize", folder, stdin="[1, 2]"), "detokenize", what)
        clean_failure(run("template", folder, stdin='{"messages": [{"role": "user", "content": "hi"}]}'),
                      "template", what)
# grammar check's documented codes: 1 rejected, 2 a SPEC that cannot be read
schema = os.path.join(tmp, "s.json")
with open(schema, "w") as f:
    f.write('{"type": "integer"}')
clean_failure(run("grammar", "masks", "--tokenizer", missing, "--schema", schema, "--input", text), "grammar",
              "masks with a missing tokenizer")
for args, what in ((("check", "--schema", os.path.join(missing, "s.json"), "--input", text), "missing schema file"),
                   (("compile", "--ebnf", os.path.join(missing, "g.ebnf")), "missing grammar file"),
                   (("check", "--schema", schema, "--input", os.path.join(missing, "in.txt")), "missing input file")):
    p = run("grammar", *args)
    check(p.returncode == 2 and p.stderr.startswith("tern grammar:") and "Sanitizer" not in p.stderr,
          "grammar: %s -> exit %d (bad SPEC/input: 2), %s" % (what, p.returncode, p.stderr.strip()))
clean_failure(run("perplexity", STORIES, "--file", os.path.join(missing, "t.txt")), "perplexity", "missing text file")

# --- model files that lie -----------------------------------------------------


def st_read(path):
    b = open(path, "rb").read()
    n = struct.unpack("<Q", b[:8])[0]
    return json.loads(b[8:8 + n]), b[8 + n:]


def st_write(path, header, data):
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    open(path, "wb").write(struct.pack("<Q", len(h)) + h + data)


header, data = st_read(os.path.join(STORIES, "model.safetensors"))
names = [k for k in header if k != "__metadata__"]
big = max(names, key=lambda k: header[k]["data_offsets"][1] - header[k]["data_offsets"][0])

# two equal-sized tensors, the second moved half-way into the first
d = model_copy("overlap", files=("config.json", "tokenizer.json", "tokenizer_config.json"))
h = json.loads(json.dumps(header))
sizes = {}
for k in names:
    sizes.setdefault(h[k]["data_offsets"][1] - h[k]["data_offsets"][0], []).append(k)
a, b = next(v for s, v in sizes.items() if len(v) >= 2 and s >= 8)[:2]
oa = h[a]["data_offsets"]
sz = oa[1] - oa[0]
h[b]["data_offsets"] = [oa[0] + 4, oa[0] + 4 + sz]
st_write(os.path.join(d, "model.safetensors"), h, data)
clean_failure(run("logits", d, "--ids", "1,2"), "logits", "overlapping tensors", "overlap")

# an index naming a tensor the (already opened) shard does not hold
d = model_copy("index-missing", files=("config.json", "tokenizer.json", "tokenizer_config.json"))
shutil.copy(os.path.join(STORIES, "model.safetensors"), os.path.join(d, "model-00001-of-00001.safetensors"))
wm = {k: "model-00001-of-00001.safetensors" for k in names}
wm["model.layers.0.mlp.extra_proj.weight"] = "model-00001-of-00001.safetensors"
json.dump({"metadata": {}, "weight_map": wm}, open(os.path.join(d, "model.safetensors.index.json"), "w"))
p = run("logits", d, "--ids", "1,2")
clean_failure(p, "logits", "index names a missing tensor", "does not hold it")
check("appears twice" not in p.stderr, "a missing tensor is not reported as appearing twice")


def config_lie(name, edit, needle, raw=None):
    d = model_copy(name)
    cfg = json.load(open(os.path.join(STORIES, "config.json")))
    edit(cfg)
    text = json.dumps(cfg, allow_nan=True)
    if raw:
        text = text.replace(*raw)
    open(os.path.join(d, "config.json"), "w").write(text)
    if os.path.exists(os.path.join(d, "generation_config.json")):
        os.remove(os.path.join(d, "generation_config.json"))
    clean_failure(run("logits", d, "--ids", "1,2"), "logits", name, needle)


config_lie("eos-outside", lambda c: c.update(eos_token_id=512), "eos_token_id")
config_lie("eos-list-outside", lambda c: c.update(eos_token_id=[2, 70000]), "eos_token_id")
config_lie("eos-negative", lambda c: c.update(eos_token_id=-3), "eos_token_id")
config_lie("eps-negative", lambda c: c.update(rms_norm_eps=-1e-5), "rms_norm_eps")
config_lie("eps-zero", lambda c: c.update(rms_norm_eps=0), "rms_norm_eps")
config_lie("eps-inf", lambda c: c.update(rms_norm_eps="X"), "rms_norm_eps", raw=('"X"', "1e999"))
config_lie("eps-nan", lambda c: c.update(rms_norm_eps="X"), "rms_norm_eps", raw=('"X"', "NaN"))
config_lie("eps-infinity", lambda c: c.update(rms_norm_eps="X"), "rms_norm_eps", raw=('"X"', "Infinity"))

# generation_config.json's eos list is checked too
d = model_copy("gen-eos-outside")
json.dump({"eos_token_id": [2, 9999]}, open(os.path.join(d, "generation_config.json"), "w"))
clean_failure(run("logits", d, "--ids", "1,2"), "logits", "generation_config eos outside", "eos_token_id")


def tokenizer_lie(name, edit, needle):
    d = model_copy(name)
    t = json.load(open(os.path.join(STORIES, "tokenizer.json")))
    edit(t)
    json.dump(t, open(os.path.join(d, "tokenizer.json"), "w"))
    clean_failure(run("tokenize", d, stdin="hi"), "tokenize", name, needle)
    clean_failure(run("run", d, "--prompt", "hi", "--max-tokens", "2"), "run", name, needle)


def vocab_collide(t):
    v = t["model"]["vocab"]
    keys = list(v)
    v[keys[300]] = v[keys[301]]


def added_collide(t):
    t["added_tokens"].append(dict(t["added_tokens"][1], content="<extra>"))


tokenizer_lie("vocab-ids-collide", vocab_collide, "model.vocab")
tokenizer_lie("added-ids-collide", added_collide, "added_tokens")

# the real models still load
for m in ("stories260K", "tern-demo-16m", "tern-demo-draft-3m"):
    p = run("tokenize", os.path.join(SHARED, "models", m), stdin="hello")
    check(p.returncode == 0, "%s still loads its tokenizer" % m)
p = run("logits", STORIES, "--ids", "1,2")
check(p.returncode == 0, "stories260K still loads")

shutil.rmtree(tmp)
print("%d failures" % failures)
sys.exit(1 if failures else 0)
