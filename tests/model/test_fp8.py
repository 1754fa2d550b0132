#!/usr/bin/env python3
"""FP8 (E4M3) checkpoints against an independent oracle: this script's own
E4M3 codec (the 256 codes from the format's formula, no tern code) writes
FP8 checkpoints of stories260K, of a random fixture (dim 256: several
128-wide blocks a row, and the 172-wide down projection's partial last
block on stories) and of a small qwen3_moe (the experts FP8, not the
router) in both hub layouts - quant_method "fp8" with 128 x 128
block scales (f32), compressed-tensors per output channel (bf16 scales,
the embedding too) - beside the f32 checkpoint of the dequantized weights.
- `tern logits` of each FP8 model equals the dequantized model's within f32
  reordering (FP8 products sum per block then scale; the dense ones do not),
  and greedy generation gives the same tokens;
- `tern convert --fp8` decodes here to every weight within half an E4M3
  step of the source, scales amax(block) / 448 (1 for an all-zero block),
  the hub's config block; the converted model runs and matches its own
  dequantized copy;
- load errors name the tensor or the config field: a missing or misshapen
  scale, an FP8 norm, unsupported compressed-tensors fields."""
import bisect, json, math, os, shutil, struct, subprocess, sys, tempfile
from array import array

TERN = os.environ["TERN_BIN"]
SHARED = os.environ.get("TERN_SHARED", "../shared")
BUILD = os.environ.get("TERN_BUILD", "build")
STORIES = os.path.join(SHARED, "models/stories260K")
# Measured largest |logit difference| / max |logit| between an FP8 model and
# its dequantized f32 copy: ~1e-6 (f32 reordering); an error in a block's
# scale or code moves logits by 1e-2 and more.
REL_TOL = 2e-5
failures = 0


def check(ok, what):
    global failures
    print(("ok   " if ok else "FAIL ") + what)
    if not ok:
        failures += 1


# ---- E4M3 ("e4m3fn": bias 7, no infinities, S.1111.111 NaN, max 448) ----
# Plain Python (no numpy): doubles hold every E4M3 value, every product of
# one with an f32 scale, and an f32 quotient correctly rounded once stored
# as f32 (array('f') rounds to nearest even).
def e4m3_value(code):
    s, e, m = code >> 7, (code >> 3) & 15, code & 7
    if e == 15 and m == 7:
        return float("nan")
    v = (m / 8.0) * 2.0 ** -6 if e == 0 else (1 + m / 8.0) * 2.0 ** (e - 7)
    return -v if s else v


E4M3 = [e4m3_value(c) for c in range(256)]
POS = E4M3[:0x7f]  # the finite magnitudes, ascending with the code


def e4m3_encode(x):
    """-> code: nearest magnitude, ties to the even code, saturating at 448."""
    a = min(abs(x), 448.0)
    hi = min(max(bisect.bisect_left(POS, a), 1), 0x7e)
    lo = hi - 1
    dl, dh = a - POS[lo], POS[hi] - a
    code = lo if dl < dh else hi if dh < dl else (lo if lo % 2 == 0 else hi)
    return code | (0x80 if math.copysign(1.0, x) < 0 else 0)


def e4m3_half_step(q):
    """Half the E4M3 spacing at magnitude |q| (the rounding bound)."""
    e = math.floor(math.log2(max(abs(q), 2.0 ** -6)))
    return 0.5 * 2.0 ** (e - 3)


def f32(xs):
    return array("f", xs)


# ---- safetensors: name -> (dtype, shape, flat values: f32 array, or bytes for FP8) ----
def st_read(path):
    raw = open(path, "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    hdr = json.loads(raw[8:8 + n])
    out = {}
    for k, v in hdr.items():
        if k == "__metadata__":
            continue
        b, e = v["data_offsets"]
        out[k] = (v["dtype"], v["shape"], raw[8 + n + b:8 + n + e])
    return out


def st_write(path, tensors):
    """tensors: name -> (dtype, shape, bytes)."""
    hdr, off = {}, 0
    for k, (dt, shape, b) in tensors.items():
        hdr[k] = {"dtype": dt, "shape": list(shape), "data_offsets": [off, off + len(b)]}
        off += len(b)
    h = json.dumps(hdr).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h)
        for _, _, b in tensors.values():
            f.write(b)


def to_f32(dt, b):
    if dt == "F32":
        return array("f", b)
    if dt == "BF16":
        u = array("I", (h << 16 for h in array("H", b)))
        return array("f", u.tobytes())
    if dt == "F16":
        return f32(struct.unpack("<%de" % (len(b) // 2), b))
    if dt == "F8_E4M3":
        return f32(E4M3[c] for c in b)
    raise ValueError(dt)


def bf16_bits(x):
    """f32 value -> bf16 bits, round to nearest even."""
    u = struct.unpack("<I", struct.pack("<f", x))[0]
    return (u + 0x7fff + ((u >> 16) & 1)) >> 16


def is_linear(name, shape):
    return len(shape) == 2 and ".layers." in "." + name and name.endswith("_proj.weight")


def block_scales(w, o, i, br=128, bc=128):
    """scale = amax(block) / 448 in f32, 1 for an all-zero block: [ceil(o/br) * ceil(i/bc)]."""
    nr, nc = (o + br - 1) // br, (i + bc - 1) // bc
    amax = [0.0] * (nr * nc)
    for r in range(o):
        row, base = w[r * i:(r + 1) * i], (r // br) * nc
        for c in range(nc):
            m = max(abs(v) for v in row[c * bc:(c + 1) * bc])
            if m > amax[base + c]:
                amax[base + c] = m
    return f32(a / 448.0 if a > 0 else 1.0 for a in amax), nr, nc


def quant(w, o, i, scale_of):
    """codes (bytes) of w / scale and the dequantized f32 weight; scale_of(r, c) the f32 scale."""
    codes, deq = bytearray(o * i), array("f", bytes(4 * o * i))
    q = array("f", [0.0])
    for r in range(o):
        for c in range(i):
            s = scale_of(r, c)
            q[0] = w[r * i + c] / s
            code = e4m3_encode(q[0])
            codes[r * i + c] = code
            deq[r * i + c] = E4M3[code] * s
    return bytes(codes), deq


def make_variants(src, dst, tag):
    """src model folder -> dst/{tag}-fp8, -ct, -deq-fp8, -deq-ct folders."""
    w = {k: (dt, sh, to_f32(dt, b)) for k, (dt, sh, b) in st_read(os.path.join(src, "model.safetensors")).items()}
    cfg = json.load(open(os.path.join(src, "config.json")))
    outs = {}
    for kind in ("fp8", "ct"):
        q, deq = {}, {}
        for k, (dt, sh, a) in w.items():
            embed = k.endswith("embed_tokens.weight")
            if kind == "fp8" and is_linear(k, sh):
                o, i = sh
                s, nr, nc = block_scales(a, o, i)
                codes, d = quant(a, o, i, lambda r, c: s[(r // 128) * nc + c // 128])
                q[k] = ("F8_E4M3", sh, codes)
                q[k + "_scale_inv"] = ("F32", [nr, nc], s.tobytes())
                deq[k] = ("F32", sh, d.tobytes())
            elif kind == "ct" and (is_linear(k, sh) or embed):
                o, i = sh
                sb = [bf16_bits(x) for x in block_scales(a, o, i, 1, i)[0]]
                s = to_f32("BF16", array("H", sb).tobytes())
                codes, d = quant(a, o, i, lambda r, c: s[r])
                q[k] = ("F8_E4M3", sh, codes)
                q[k + "_scale"] = ("BF16", [o, 1], array("H", sb).tobytes())
                deq[k] = ("F32", sh, d.tobytes())
            else:
                q[k] = deq[k] = ("F32", sh, a.tobytes())
        if kind == "fp8":
            qc = {"quant_method": "fp8", "activation_scheme": "dynamic", "fmt": "e4m3",
                  "weight_block_size": [128, 128], "modules_to_not_convert": ["lm_head"]}
        else:
            qc = {"quant_method": "compressed-tensors", "format": "float-quantized",
                  "quantization_status": "compressed", "ignore": ["lm_head"], "kv_cache_scheme": None,
                  "sparsity_config": {},
                  "config_groups": {"group_0": {"targets": ["Linear"], "output_activations": None,
                                                "weights": {"num_bits": 8, "type": "float", "strategy": "channel",
                                                            "symmetric": True, "dynamic": False, "group_size": None,
                                                            "block_structure": None, "actorder": None,
                                                            "observer": "minmax"},
                                                "input_activations": {"num_bits": 8, "type": "float",
                                                                      "strategy": "token", "symmetric": True,
                                                                      "dynamic": True}}}}
        for name, tensors, qcfg in ((f"{tag}-{kind}", q, qc), (f"{tag}-deq-{kind}", deq, None)):
            d = os.path.join(dst, name)
            os.makedirs(d)
            c = dict(cfg)
            c.pop("quantization_config", None)
            if qcfg:
                c["quantization_config"] = qcfg
            json.dump(c, open(os.path.join(d, "config.json"), "w"), indent=1)
            for f in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
                if os.path.exists(os.path.join(src, f)):
                    shutil.copy(os.path.join(src, f), d)
            st_write(os.path.join(d, "model.safetensors"), tensors)
            outs[name] = d
    return outs


def run(*args):
    return subprocess.run([TERN, *args], capture_output=True, text=True, timeout=300)


def logits(model, ids, vocab):
    p = run("logits", model, "--ids", ",".join(map(str, ids)), "--top", str(vocab), "-t", "2")
    if p.returncode:
        print(p.stderr)
        return None
    out = []
    for line in p.stdout.splitlines():
        row = [0.0] * vocab
        for t, v in json.loads(line)["top"]:
            row[t] = v
        out.append(row)
    return out


def greedy(model):
    p = run("run", model, "--prompt", "Once upon a time", "-n", "24", "--temperature", "0", "-t", "2")
    return p.stdout if p.returncode == 0 else "error: " + p.stderr


def compare(a, b, what, vocab):
    ids = [1, 400, 22, 86, 17, 300, 5, 250, 44, 9, 120, 77, 31, 2, 200, 64][:16]
    la, lb = logits(a, ids, vocab), logits(b, ids, vocab)
    if la is None or lb is None:
        check(False, f"{what}: tern logits runs")
        return
    rel = max(abs(x - y) for ra, rb in zip(la, lb) for x, y in zip(ra, rb)) / max(abs(y) for rb in lb for y in rb)
    print(f"     {what}: max |logit diff| / max |logit| = {rel:.2e}")
    check(rel < REL_TOL, f"{what}: logits equal the dequantized model's within {REL_TOL:g} relative")
    argmax = lambda r: max(range(len(r)), key=lambda t: (r[t], -t))
    check(all(argmax(ra) == argmax(rb) for ra, rb in zip(la, lb)), f"{what}: same top token at every position")
    ga, gb = greedy(a), greedy(b)
    check(ga == gb and not ga.startswith("error"), f"{what}: greedy tokens equal")


tmp = tempfile.mkdtemp(prefix="tern-fp8-")
try:
    models = make_variants(STORIES, tmp, "stories")
    fix = os.path.join(tmp, "fixture")
    subprocess.run([os.path.join(BUILD, "tools/make_fixture"), "--family", "qwen3", "--out", fix, "--tokenizer",
                    STORIES, "--dim", "256", "--layers", "2", "--heads", "4", "--kv-heads", "2", "--head-dim", "64",
                    "--ff", "352", "--vocab", "512", "--tie", "1"], check=True, capture_output=True)
    models.update(make_variants(fix, tmp, "fixture"))
    # a mixture of experts (Qwen3-30B-A3B-FP8's layout: every expert's projections FP8, the router not;
    # 96-wide experts: one partial block a row)
    moe = os.path.join(tmp, "moe")
    subprocess.run([os.path.join(BUILD, "tools/make_fixture"), "--family", "qwen3_moe", "--out", moe, "--tokenizer",
                    STORIES, "--dim", "160", "--layers", "2", "--heads", "4", "--kv-heads", "2", "--head-dim", "40",
                    "--ff", "192", "--vocab", "512", "--experts", "4", "--top-k", "2", "--moe-ff", "96"],
                   check=True, capture_output=True)
    models.update(make_variants(moe, tmp, "moe"))
    for tag in ("stories", "fixture", "moe"):
        for kind in ("fp8", "ct"):
            compare(models[f"{tag}-{kind}"], models[f"{tag}-deq-{kind}"], f"{tag} {kind}", 512)
    ex = st_read(os.path.join(models["moe-fp8"], "model.safetensors"))
    check(ex["model.layers.0.mlp.experts.3.down_proj.weight"][0] == "F8_E4M3" and
          ex["model.layers.0.mlp.gate.weight"][0] == "F32", "moe: experts FP8, router not")
    # the same experts stacked as MLX writes them (switch_mlp.PROJ.weight [E][out][in], scales [E][..][..])
    stk = os.path.join(tmp, "moe-stacked")
    shutil.copytree(models["moe-fp8"], stk)
    out = {}
    for k, v in ex.items():
        if ".mlp.experts." not in k:
            out[k] = v
            continue
        pre, rest = k.split(".mlp.experts.")
        e, name = rest.split(".", 1)
        if e == "0":  # NAME.weight and NAME.weight_scale_inv, each expert's in order
            parts = [ex[f"{pre}.mlp.experts.{j}.{name}"] for j in range(4)]
            out[f"{pre}.mlp.switch_mlp.{name}"] = (parts[0][0], [4] + parts[0][1], b"".join(p[2] for p in parts))
    st_write(os.path.join(stk, "model.safetensors"), out)
    compare(stk, models["moe-deq-fp8"], "moe stacked fp8", 512)

    # ---- tern convert --fp8, decoded here ----
    for tag, src in (("stories", STORIES), ("fixture", fix), ("moe", moe)):
        out = os.path.join(tmp, tag + "-conv")
        p = run("convert", src, out, "--fp8")
        check(p.returncode == 0, f"convert --fp8 {tag}: exit 0 ({p.stderr.strip()[:200]})")
        if p.returncode:
            continue
        srcw = {k: (sh, to_f32(dt, b)) for k, (dt, sh, b) in st_read(os.path.join(src, "model.safetensors")).items()}
        got = st_read(os.path.join(out, "model.safetensors"))
        qc = json.load(open(os.path.join(out, "config.json"))).get("quantization_config")
        routers = [f"model.layers.{l}.mlp.gate" for l in range(2)] if tag == "moe" else []
        check(qc == {"quant_method": "fp8", "activation_scheme": "dynamic", "weight_block_size": [128, 128],
                     "modules_to_not_convert": ["lm_head"] + routers}, f"convert {tag}: the hub's quantization_config")
        n_fp8, bad_scale, bad_code, deq = 0, [], [], {}
        for k, (sh, a) in srcw.items():
            dt, gsh, g = got[k]
            if not is_linear(k, sh):
                if dt == "F8_E4M3" or gsh != sh or to_f32(dt, g) != a:
                    bad_code.append(k)
                deq[k] = ("F32", sh, a.tobytes())
                continue
            n_fp8 += 1
            sdt, ssh, sb = got.get(k + "_scale_inv", ("?", None, None))
            o, i = sh
            nr, nc = (o + 127) // 128, (i + 127) // 128
            if dt != "F8_E4M3" or gsh != sh or sdt != "F32" or ssh != [nr, nc]:
                bad_scale.append(k)
                continue
            s = to_f32(sdt, sb)
            want = block_scales(a, o, i)[0]
            if s != want:
                bad_scale.append(k)
            d = array("f", bytes(4 * o * i))
            for r in range(o):
                for c in range(i):
                    sc = s[(r // 128) * nc + c // 128]
                    qv = a[r * i + c] / sc  # the source in scale units
                    v = E4M3[g[r * i + c]]
                    if abs(v - qv) > e4m3_half_step(qv) * (1 + 1e-6):
                        bad_code.append(f"{k}[{r},{c}]")
                    d[r * i + c] = v * sc
            deq[k] = ("F32", sh, d.tobytes())
        check(n_fp8 > 0 and not bad_scale, f"convert {tag}: {n_fp8} weights FP8, scales amax/448 {bad_scale[:3]}")
        check(not bad_code, f"convert {tag}: every weight within half an E4M3 step, others copied {bad_code[:3]}")
        d = os.path.join(tmp, tag + "-conv-deq")
        shutil.copytree(out, d)
        c = json.load(open(os.path.join(d, "config.json")))
        del c["quantization_config"]
        json.dump(c, open(os.path.join(d, "config.json"), "w"))
        st_write(os.path.join(d, "model.safetensors"), deq)
        compare(out, d, f"convert {tag}", 512)
    p = run("convert", STORIES, os.path.join(tmp, "x"), "--fp8", "--bits", "8")
    check(p.returncode != 0 and "--fp8" in p.stderr, "convert: --fp8 with --bits is refused")
    p = run("convert", models["stories-fp8"], os.path.join(tmp, "y"), "--fp8")
    check(p.returncode != 0 and "quantized" in p.stderr, "convert: an FP8 source is refused")

    # ---- load errors ----
    def variant(name, edit_tensors=None, edit_cfg=None):
        d = os.path.join(tmp, name)
        shutil.copytree(models["stories-fp8"], d)
        if edit_tensors:
            t = st_read(os.path.join(d, "model.safetensors"))
            edit_tensors(t)
            st_write(os.path.join(d, "model.safetensors"), t)
        if edit_cfg:
            c = json.load(open(os.path.join(d, "config.json")))
            edit_cfg(c["quantization_config"])
            json.dump(c, open(os.path.join(d, "config.json"), "w"))
        return d

    def load_error(d, want, what):
        p = run("logits", d, "--ids", "1,2")
        check(p.returncode != 0 and all(w in p.stderr for w in want), f"{what}: a load error naming {want}")
        if p.returncode == 0 or not all(w in p.stderr for w in want):
            print("     got:", p.stderr.strip()[:300])

    W = "model.layers.1.mlp.down_proj.weight"
    load_error(variant("e1", lambda t: t.pop(W + "_scale_inv")), [W, "scale"], "missing scale")
    load_error(variant("e2", lambda t: t.__setitem__(W + "_scale_inv", ("F32", [2, 3], f32([1.0] * 6).tobytes()))),
               [W, "[2, 3]"], "misshapen scale")
    load_error(variant("e2b", lambda t: t.__setitem__(W + "_scale_inv", ("F32", [5], f32([1.0] * 5).tobytes()))),
               [W, "[5]"], "a 1-D scale of the wrong length")
    N = "model.layers.0.input_layernorm.weight"
    load_error(variant("e3", lambda t: t.__setitem__(N, ("F8_E4M3", t[N][1], bytes(e4m3_encode(v) for v in to_f32(t[N][0], t[N][2]))))), [N, "F8_E4M3"],
               "FP8 norm")

    def ct(edit):
        def f(q):
            q.clear()
            q.update(json.loads(json.dumps({"quant_method": "compressed-tensors", "format": "float-quantized",
                                            "config_groups": {"g0": {"targets": ["Linear"], "weights": {
                                                "num_bits": 8, "type": "float", "strategy": "channel",
                                                "symmetric": True}}}})))
            edit(q)
        return f

    wq = lambda q: q["config_groups"]["g0"]["weights"]
    load_error(variant("c1", edit_cfg=ct(lambda q: wq(q).update(num_bits=4))), ["num_bits", "4"], "4-bit weights")
    load_error(variant("c2", edit_cfg=ct(lambda q: wq(q).update(type="int"))), ["type", "int"], "int weights")
    load_error(variant("c3", edit_cfg=ct(lambda q: wq(q).update(strategy="group", group_size=128))),
               ["strategy", "group"], "group strategy")
    load_error(variant("c4", edit_cfg=ct(lambda q: q.update(format="pack-quantized"))), ["format", "pack-quantized"],
               "packed format")
    load_error(variant("c5", edit_cfg=ct(lambda q: q.update(sparsity_config={"format": "sparse-24-bitmask"}))),
               ["sparsity_config", "sparse-24-bitmask"], "sparsity config")
    load_error(variant("c6", edit_cfg=lambda q: q.update(quant_method="awq")), ["awq"], "another quant_method")
    load_error(variant("c7", edit_cfg=lambda q: q.update(weight_block_size=[128, 100])), ["weight_block_size"],
               "a block width off the 32 grid")
    # the block layout under compressed-tensors (strategy "block", block_structure), static input scales
    d = variant("c8", edit_cfg=ct(lambda q: wq(q).update(strategy="block", block_structure=[128, 128]) or
                                  q["config_groups"]["g0"].update(input_activations={
                                      "num_bits": 8, "type": "float", "strategy": "tensor", "dynamic": False})))
    p = run("logits", d, "--ids", "1,2")
    check(p.returncode == 0 and p.stderr.count("input_scale") == 1, "compressed-tensors block + static: loads, logged")
    compare(d, models["stories-deq-fp8"], "compressed-tensors block", 512)
    # a static activation scheme loads, says so once, and computes the same logits
    d = variant("s1", edit_cfg=lambda q: q.update(activation_scheme="static"))
    p = run("logits", d, "--ids", "1,2")
    check(p.returncode == 0 and p.stderr.count("input_scale") == 1, "static activation scales: loads, logged once")
finally:
    shutil.rmtree(tmp, ignore_errors=True)

print("failures:", failures)
sys.exit(1 if failures else 0)
