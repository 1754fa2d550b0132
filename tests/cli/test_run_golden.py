#!/usr/bin/env python3
"""tern run / tern logits against outside oracles on stories260K:
- greedy text and ids equal llama2.c's (golden/reference_greedy.json);
- top-5 logits equal HF transformers' (golden/hf_logits_top5.json) within 1e-4;
- bad model folders fail with a one-line error and exit code 1."""
import json, os, shutil, subprocess, sys, tempfile

TERN = os.environ["TERN_BIN"]
SHARED = os.environ.get("TERN_SHARED", "../shared")
STORIES = os.path.join(SHARED, "models/stories260K")
failures = 0


def check(ok, what):
    global failures
    print(("ok   " if ok else "FAIL ") + what)
    if not ok:
        failures += 1


gold = json.load(open(os.path.join(STORIES, "golden/reference_greedy.json")))
for run in gold["runs"]:
    p = subprocess.run([TERN, "run", STORIES, "--prompt", run["prompt"], "--max-tokens", "128",
                        "--temperature", "0", "--verbose"], capture_output=True, text=True, timeout=120)
    check(p.returncode == 0, f"run {run['prompt']!r} exits 0")
    check(run["prompt"] + p.stdout == run["stdout_128_new_tokens"], f"run {run['prompt']!r}: text equals llama2.c")
    ids_line = [l for l in p.stderr.splitlines() if l.startswith("ids: ")]
    ids = json.loads(ids_line[0][5:]) if ids_line else None
    check(ids == run["generated_ids_128"], f"run {run['prompt']!r}: ids equal llama2.c")

hf = json.load(open(os.path.join(STORIES, "golden/hf_logits_top5.json")))
positions = hf["positions"]
if isinstance(positions, str):  # stored as a Python-literal string
    import ast
    positions = ast.literal_eval(positions)
ids = ",".join(str(i) for i in hf["input_ids"])
p = subprocess.run([TERN, "logits", STORIES, "--ids", ids, "--top", "5"], capture_output=True, text=True, timeout=60)
check(p.returncode == 0, "logits exits 0")
lines = [json.loads(l) for l in p.stdout.splitlines()]
check(len(lines) == len(positions), "logits: one line per position")
worst = 0.0
for got, want in zip(lines, positions):
    check(got["pos"] == want["pos"], f"logits pos {want['pos']}")
    check([t[0] for t in got["top"]] == [t[0] for t in want["top5"]], f"logits pos {want['pos']}: same top-5 ids")
    worst = max([worst] + [abs(a[1] - b[1]) for a, b in zip(got["top"], want["top5"])])
print(f"max |logit - HF| = {worst:.3g}")
check(worst <= 1e-4, "logits within 1e-4 of HF")

# Broken model folders: one clear line on stderr, exit code 1, no crash.
with tempfile.TemporaryDirectory() as tmp:
    def broken(name, mutate):
        d = os.path.join(tmp, name)
        shutil.copytree(STORIES, d, ignore=shutil.ignore_patterns("golden", "scripts"))
        for f in os.listdir(d):
            os.chmod(os.path.join(d, f), 0o644)
        mutate(d)
        p = subprocess.run([TERN, "run", d, "--prompt", "Hi", "--max-tokens", "4"], capture_output=True,
                           text=True, timeout=60)
        lines = p.stderr.strip().splitlines()
        check(p.returncode == 1 and len(lines) == 1 and p.stdout == "",
              f"{name}: exit 1 with one line ({lines[-1] if lines else 'nothing'})")

    def truncate(d):
        f = os.path.join(d, "model.safetensors")
        size = os.path.getsize(f)
        with open(f, "r+b") as fh:
            fh.truncate(size // 2)

    def drop_field(d):
        f = os.path.join(d, "config.json")
        c = json.load(open(f))
        del c["hidden_size"]
        json.dump(c, open(f, "w"))

    def bad_header(d):
        f = os.path.join(d, "model.safetensors")
        with open(f, "r+b") as fh:
            fh.write((1 << 40).to_bytes(8, "little"))

    def bad_json(d):
        open(os.path.join(d, "config.json"), "w").write("{\"model_type\": \"llama\", ")

    def bad_type(d):
        f = os.path.join(d, "config.json")
        c = json.load(open(f))
        c["model_type"] = "mamba"
        json.dump(c, open(f, "w"))

    def rope_scaling(d):
        f = os.path.join(d, "config.json")
        c = json.load(open(f))
        c["rope_scaling"] = {"rope_type": "longrope", "factor": 4.0}
        json.dump(c, open(f, "w"))

    broken("truncated-safetensors", truncate)
    broken("config-missing-field", drop_field)
    broken("oversized-header", bad_header)
    broken("malformed-config", bad_json)
    broken("unsupported-model-type", bad_type)
    broken("unsupported-rope-scaling", rope_scaling)

print(f"{failures} failed")
sys.exit(1 if failures else 0)
