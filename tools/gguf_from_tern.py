#!/usr/bin/env python3
"""Writes a tern Llama- or Qwen3-family model folder (bf16/f16/f32 safetensors, as
tools/make_fixture writes the decode-benchmark models) as one GGUF file, so
that llama.cpp can run the very same weights next to tern.

    gguf_from_tern.py MODEL_DIR OUT.gguf [--type Q8_0|Q4_0]

Plain Python (no numpy, no gguf package): the GGUF v3 layout is written
here, in the order llama.cpp's gguf-py writer uses, one tensor at a time
(memory stays at one tensor). Weights keep their dtype (bf16 -> BF16); 1-D
tensors (the norms) are written as F32, as llama.cpp's converter does. The
q/k projections are reordered from the checkpoint's half-split rotary layout
to the interleaved one GGUF's llama architecture expects. The vocabulary:
the folder's tokenizer.json (a byte-fallback BPE such as stories260K's) as
llama.cpp's SentencePiece-style tokenizer, token scores from the merge
ranks, padded with unused tokens up to the model's vocab_size, so both
engines tokenize a text the same way. Qwen3 MoE folders (qwen3_moe, as
tools/make_fixture --preset 30b-a3b writes them): architecture qwen3moe,
the router as ffn_gate_inp and each layer's experts stacked into
ffn_{gate,up,down}_exps ([expert][out][in]), written one expert at a time;
llama.cpp always renormalizes the chosen experts' weights, so such a
folder needs norm_topk_prob true. Qwen3 folders (models/tern-demo):
architecture qwen3 (NEOX rotary: q/k stay as they are; per-head q/k norms),
a byte-level BPE tokenizer.json with its merges as llama.cpp's "gpt2" model
and the "qwen2" pre-tokenizer (the split regex is checked to be Qwen2's),
no BOS when the folder has none; tied embeddings stay tied.

--type Q8_0|Q4_0 writes every 2-D weight whose rows are whole blocks of 32
in llama.cpp's Q8_0 / Q4_0 blocks (its reference quantizers, as
`llama-quantize --pure` writes them: the same tensor bytes), the rest as
above - for models llama-quantize refuses (stories260K's 172-wide down
projections, which tern's conversions keep unquantized too). Plain Python:
slow on large models (about a minute for 16M weights)."""
import json
import math
import os
import struct
import sys

ALIGN = 32
# GGUF value types and the ggml tensor types / llama file types used here
T_U32, T_I32, T_F32, T_BOOL, T_STR, T_ARR = 4, 5, 6, 7, 8, 9
GGML = {"F32": 0, "F16": 1, "BF16": 30, "Q4_0": 2, "Q8_0": 8}
FILE_TYPE = {"F32": 0, "F16": 1, "BF16": 32, "Q4_0": 2, "Q8_0": 7}
BLOCK = {"Q4_0": 18, "Q8_0": 34}  # bytes per block of 32 (an f16 scale, then the codes)
TOK_NORMAL, TOK_CONTROL, TOK_USER, TOK_UNUSED, TOK_BYTE = 1, 3, 4, 5, 6
QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
               r"\s*[\r\n]+|\s+(?!\S)|\s+")
ELEM = {"F32": 4, "F16": 2, "BF16": 2}


def safetensors_index(folder):
    """Every tensor of the folder's *.safetensors: name -> (dtype, shape, file, offset, length)."""
    out = {}
    for name in sorted(os.listdir(folder)):
        if not name.endswith(".safetensors"):
            continue
        path = os.path.join(folder, name)
        with open(path, "rb") as f:
            n = struct.unpack("<Q", f.read(8))[0]
            header = json.loads(f.read(n))
        for key, info in header.items():
            if key == "__metadata__":
                continue
            b, e = info["data_offsets"]
            out[key] = (info["dtype"], info["shape"], path, 8 + n + b, e - b)
    return out


def unsplit_rotary(raw, shape, n_head, head_dim, elem):
    """Rows of one q/k projection from [head][half][i] to [head][i][half]."""
    row = elem * (len(raw) // (elem * shape[0]))
    half = head_dim // 2
    out = bytearray()
    for h in range(n_head):
        base = h * head_dim
        for i in range(half):
            for s in (0, 1):
                r = base + s * half + i
                out += raw[r * row:(r + 1) * row]
    return bytes(out)


def vocab_entries(folder, n_vocab):
    tok = json.load(open(os.path.join(folder, "tokenizer.json")))
    model = tok["model"]
    rank = {}
    for i, m in enumerate(model.get("merges", [])):
        a, b = m.split(" ") if isinstance(m, str) else m
        rank.setdefault(a + b, i)
    special = {t["id"] for t in tok.get("added_tokens", []) if t.get("special")}
    tokens, scores, types = [""] * n_vocab, [0.0] * n_vocab, [0] * n_vocab
    for text, i in model["vocab"].items():
        if i >= n_vocab:
            continue
        tokens[i] = text
        if i in special:
            types[i], scores[i] = TOK_CONTROL, 0.0
        elif text.startswith("<0x") and text.endswith(">") and len(text) == 6:
            types[i], scores[i] = TOK_BYTE, 0.0
        else:
            types[i] = TOK_NORMAL
            scores[i] = -float(rank[text]) if text in rank else (0.0 if len(text) == 1 else -1e6)
    for i in range(n_vocab):
        if not tokens[i]:
            tokens[i], types[i], scores[i] = "[PAD%d]" % i, TOK_UNUSED, -1e9
    return tokens, scores, types


def bpe_entries(folder, n_vocab):
    """A byte-level BPE tokenizer.json (Qwen2's split) as gpt2-model tokens, types and merges."""
    tok = json.load(open(os.path.join(folder, "tokenizer.json")))
    pre = tok.get("pre_tokenizer") or {}
    splits = [p for p in pre.get("pretokenizers", []) if p.get("type") == "Split"]
    if not splits or splits[0]["pattern"].get("Regex") != QWEN2_SPLIT:
        sys.exit("gguf_from_tern: the byte-level tokenizer's split is not Qwen2's (llama.cpp would split otherwise)")
    tokens, types = [""] * n_vocab, [TOK_NORMAL] * n_vocab
    for text, i in tok["model"]["vocab"].items():
        if i < n_vocab:
            tokens[i] = text
    for t in tok.get("added_tokens", []):
        if t["id"] < n_vocab:
            tokens[t["id"]] = t["content"]
            types[t["id"]] = TOK_CONTROL if t.get("special") else TOK_USER
    for i in range(n_vocab):
        if not tokens[i]:
            tokens[i], types[i] = "[PAD%d]" % i, TOK_UNUSED
    merges = [m if isinstance(m, str) else " ".join(m) for m in tok["model"].get("merges", [])]
    return tokens, types, merges


def pack_str(s):
    b = s.encode("utf-8")
    return struct.pack("<Q", len(b)) + b


def pack_val(vtype, v):
    if vtype == T_STR:
        return pack_str(v)
    return struct.pack({T_U32: "<I", T_I32: "<i", T_F32: "<f", T_BOOL: "?"}[vtype], v)


def pack_kv(key, vtype, v, sub=None):
    out = pack_str(key) + struct.pack("<I", vtype)
    if vtype != T_ARR:
        return out + pack_val(vtype, v)
    out += struct.pack("<IQ", sub, len(v))
    return out + b"".join(pack_val(sub, x) for x in v)


def write_all(f, data):
    view = memoryview(data)
    while len(view):
        view = view[f.write(view):]


def copy_range(path, start, length, f):
    """length bytes of path from start appended to f (an unbuffered file)."""
    with open(path, "rb") as src:
        done = 0
        while done < length and hasattr(os, "copy_file_range"):
            try:
                n = os.copy_file_range(src.fileno(), f.fileno(), length - done, start + done)
            except OSError:
                break
            if n <= 0:
                break
            done += n
        if done < length:
            src.seek(start + done)
            write_all(f, src.read(length - done))


def f32(x):
    return struct.unpack("<f", struct.pack("<f", x))[0]


def to_f32_values(raw, dt):
    n = len(raw) // ELEM[dt]
    if dt == "BF16":
        return list(struct.unpack("<%df" % n, struct.pack("<%dI" % n, *(v << 16 for v in struct.unpack("<%dH" % n, raw)))))
    return list(struct.unpack("<%d%s" % (n, "e" if dt == "F16" else "f"), raw))


def quantize_blocks(vals, qtype):
    """llama.cpp's quantize_row_q8_0_ref / quantize_row_q4_0_ref, in f32."""
    out = bytearray()
    for b in range(0, len(vals), 32):
        x = vals[b:b + 32]
        if qtype == "Q8_0":
            amax = max(abs(v) for v in x)
            d = f32(amax / 127.0)
            inv = f32(1.0 / d) if d else 0.0
            q = []
            for v in x:
                y = f32(v * inv)
                r = math.floor(abs(y) + 0.5)
                q.append(int(-r if y < 0 else r))
            out += struct.pack("<e", d) + struct.pack("<32b", *q)
        else:
            amax, mx = 0.0, 0.0
            for v in x:
                if amax < abs(v):
                    amax, mx = abs(v), v
            d = f32(mx / -8.0)
            inv = f32(1.0 / d) if d else 0.0
            lo = [min(15, int(f32(f32(x[j] * inv) + 8.5))) for j in range(16)]
            hi = [min(15, int(f32(f32(x[16 + j] * inv) + 8.5))) for j in range(16)]
            out += struct.pack("<e", d) + bytes(lo[j] | hi[j] << 4 for j in range(16))
    return bytes(out)


def pad(n):
    return (n + ALIGN - 1) // ALIGN * ALIGN


def main():
    args = sys.argv[1:]
    qtype = None
    if len(args) == 4 and args[2] == "--type" and args[3].upper() in BLOCK:
        qtype = args[3].upper()
        args = args[:2]
    if len(args) != 2:
        sys.exit(__doc__)
    folder, out_path = args
    cfg = json.load(open(os.path.join(folder, "config.json")))
    arch = cfg.get("model_type")
    if arch not in ("llama", "qwen3", "qwen3_moe"):
        sys.exit("gguf_from_tern: only llama-, qwen3- and qwen3_moe-family folders (model_type %r)" % arch)
    moe = arch == "qwen3_moe"
    if moe:
        if not cfg.get("norm_topk_prob", False):
            sys.exit("gguf_from_tern: llama.cpp renormalizes the chosen experts: norm_topk_prob must be true")
        if cfg.get("mlp_only_layers") or cfg.get("decoder_sparse_step", 1) != 1:
            sys.exit("gguf_from_tern: every layer must be sparse (mlp_only_layers, decoder_sparse_step)")
        n_expert = cfg.get("num_experts", cfg.get("num_local_experts"))
        arch = "qwen3moe"
    rp = cfg.get("rope_parameters") or {}
    if cfg.get("rope_scaling") or rp.get("rope_type", "default") != "default":
        sys.exit("gguf_from_tern: rope_scaling is not written (the benchmark models have none)")
    dim, n_head = cfg["hidden_size"], cfg["num_attention_heads"]
    n_kv = cfg.get("num_key_value_heads", n_head)
    head_dim = cfg.get("head_dim") or dim // n_head
    n_layer, n_vocab = cfg["num_hidden_layers"], cfg["vocab_size"]
    ts = safetensors_index(folder)
    dtypes = {v[0] for v in ts.values()}
    ftype = FILE_TYPE[qtype] if qtype else FILE_TYPE.get(next(iter(dtypes)) if len(dtypes) == 1 else "F32", 0)
    kv = [("general.architecture", T_STR, arch),
          ("general.name", T_STR, os.path.basename(os.path.normpath(folder))),
          ("general.file_type", T_U32, ftype),
          (arch + ".context_length", T_U32, cfg.get("max_position_embeddings", 4096)),
          (arch + ".embedding_length", T_U32, dim),
          (arch + ".block_count", T_U32, n_layer),
          (arch + ".feed_forward_length", T_U32, cfg["intermediate_size"]),
          (arch + ".attention.head_count", T_U32, n_head),
          (arch + ".attention.head_count_kv", T_U32, n_kv),
          (arch + ".attention.key_length", T_U32, head_dim),
          (arch + ".attention.value_length", T_U32, head_dim),
          (arch + ".rope.dimension_count", T_U32, head_dim),
          (arch + ".rope.freq_base", T_F32, float(cfg.get("rope_theta", rp.get("rope_theta", 10000.0)))),
          (arch + ".attention.layer_norm_rms_epsilon", T_F32, float(cfg.get("rms_norm_eps", 1e-5))),
          (arch + ".vocab_size", T_U32, n_vocab)]
    if moe:
        kv += [(arch + ".expert_count", T_U32, n_expert),
               (arch + ".expert_used_count", T_U32, cfg["num_experts_per_tok"]),
               (arch + ".expert_feed_forward_length", T_U32, cfg["moe_intermediate_size"])]
    byte_level = arch == "qwen3"  # qwen3moe: as its tokenizer.json is (the fixtures borrow stories260K's)
    if moe:
        pre = json.load(open(os.path.join(folder, "tokenizer.json"))).get("pre_tokenizer") or {}
        byte_level = any(p.get("type") == "Split" for p in pre.get("pretokenizers", []))
    if byte_level:
        tokens, types, merges = bpe_entries(folder, n_vocab)
        bos = cfg.get("bos_token_id")
        kv += [("tokenizer.ggml.model", T_STR, "gpt2"),
               ("tokenizer.ggml.pre", T_STR, "qwen2"),
               ("tokenizer.ggml.tokens", T_ARR, tokens, T_STR),
               ("tokenizer.ggml.token_type", T_ARR, types, T_I32),
               ("tokenizer.ggml.merges", T_ARR, merges, T_STR)]
        kv += [("tokenizer.ggml.bos_token_id", T_U32, bos)] if bos is not None else []
        kv += [("tokenizer.ggml.eos_token_id", T_U32, cfg.get("eos_token_id", 2)),
               ("tokenizer.ggml.add_bos_token", T_BOOL, bos is not None),
               ("tokenizer.ggml.add_eos_token", T_BOOL, False)]
    else:
        tokens, scores, types = vocab_entries(folder, n_vocab)
        kv += [("tokenizer.ggml.model", T_STR, "llama"),
               ("tokenizer.ggml.pre", T_STR, "default"),
               ("tokenizer.ggml.tokens", T_ARR, tokens, T_STR),
               ("tokenizer.ggml.scores", T_ARR, scores, T_F32),
               ("tokenizer.ggml.token_type", T_ARR, types, T_I32),
               ("tokenizer.ggml.bos_token_id", T_U32, cfg.get("bos_token_id", 1)),
               ("tokenizer.ggml.eos_token_id", T_U32, cfg.get("eos_token_id", 2)),
               ("tokenizer.ggml.unknown_token_id", T_U32, 0),
               ("tokenizer.ggml.add_bos_token", T_BOOL, True),
               ("tokenizer.ggml.add_eos_token", T_BOOL, False)]

    names = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
             "lm_head.weight": "output.weight"}
    per_layer = {"input_layernorm.weight": "attn_norm.weight", "self_attn.q_proj.weight": "attn_q.weight",
                 "self_attn.k_proj.weight": "attn_k.weight", "self_attn.v_proj.weight": "attn_v.weight",
                 "self_attn.o_proj.weight": "attn_output.weight",
                 "post_attention_layernorm.weight": "ffn_norm.weight", "mlp.gate_proj.weight": "ffn_gate.weight",
                 "mlp.up_proj.weight": "ffn_up.weight", "mlp.down_proj.weight": "ffn_down.weight",
                 "self_attn.q_norm.weight": "attn_q_norm.weight", "self_attn.k_norm.weight": "attn_k_norm.weight",
                 "mlp.gate.weight": "ffn_gate_inp.weight"}
    for l in range(n_layer):
        for k, v in per_layer.items():
            names["model.layers.%d.%s" % (l, k)] = "blk.%d.%s" % (l, v)
    # output tensors: name -> the source keys written one after the other
    # (one, or a layer's experts of one projection, stacked)
    parts = {}
    stacked = {"gate_proj": "ffn_gate_exps.weight", "up_proj": "ffn_up_exps.weight",
               "down_proj": "ffn_down_exps.weight"}
    for l in range(n_layer if moe else 0):
        for proj, out in stacked.items():
            keys = ["model.layers.%d.mlp.experts.%d.%s.weight" % (l, e, proj) for e in range(n_expert)]
            for k in keys:
                if k not in ts:
                    sys.exit("gguf_from_tern: tensor %s is missing" % k)
            parts["blk.%d.%s" % (l, out)] = keys
    in_stack = {k for keys in parts.values() for k in keys}
    for key in ts:
        if key in in_stack:
            continue
        if key not in names:
            sys.exit("gguf_from_tern: tensor %s has no llama.cpp name" % key)
        parts[names[key]] = [key]
    order = sorted(parts)
    # tensor infos: 1-D tensors become F32, the rest keep their type
    infos, offset = [], 0
    for name in order:
        keys = parts[name]
        dt, shape, _, _, length = ts[keys[0]]
        if any(ts[k][0] != dt or ts[k][1] != shape for k in keys):
            sys.exit("gguf_from_tern: the experts of %s differ in type or shape" % name)
        out_dt = "F32" if len(shape) == 1 else dt
        if qtype and len(shape) == 2 and shape[-1] % 32 == 0:
            out_dt = qtype
            nbytes = length // ELEM[dt] // 32 * BLOCK[qtype] * len(keys)
        else:
            nbytes = length // ELEM[dt] * ELEM[out_dt] * len(keys)
        infos.append((name, keys, dt, out_dt, ([len(keys)] if len(keys) > 1 else []) + shape, offset, nbytes))
        offset += pad(nbytes)
    with open(out_path, "wb", buffering=0) as f:  # unbuffered: copy_file_range writes at the same offset
        head = bytearray(b"GGUF" + struct.pack("<IQQ", 3, len(order), len(kv)))
        for e in kv:
            head += pack_kv(*e)
        for name, keys, dt, out_dt, shape, off, nbytes in infos:
            head += pack_str(name) + struct.pack("<I", len(shape))
            head += b"".join(struct.pack("<Q", d) for d in reversed(shape))
            head += struct.pack("<IQ", GGML[out_dt], off)
        head += b"\0" * (pad(len(head)) - len(head))
        write_all(f, head)
        for name, keys, dt, out_dt, shape, off, nbytes in infos:
            for key in keys:
                _, kshape, path, start, length = ts[key]
                if out_dt == dt and not (arch == "llama" and key.endswith(("q_proj.weight", "k_proj.weight"))):
                    copy_range(path, start, length, f)  # as stored: the kernel copies it
                    continue
                with open(path, "rb") as src:
                    src.seek(start)
                    raw = src.read(length)
                if arch == "llama" and key.endswith("q_proj.weight"):
                    raw = unsplit_rotary(raw, kshape, n_head, head_dim, ELEM[dt])
                elif arch == "llama" and key.endswith("k_proj.weight"):
                    raw = unsplit_rotary(raw, kshape, n_kv, head_dim, ELEM[dt])
                if out_dt in BLOCK:
                    raw = quantize_blocks(to_f32_values(raw, dt), out_dt)
                elif out_dt != dt:  # norms in f32
                    n = length // ELEM[dt]
                    if dt == "BF16":
                        raw = struct.pack("<%dI" % n, *(v << 16 for v in struct.unpack("<%dH" % n, raw)))
                    else:
                        raw = struct.pack("<%df" % n, *struct.unpack("<%de" % n, raw))
                write_all(f, raw)
            write_all(f, b"\0" * (pad(nbytes) - nbytes))


if __name__ == "__main__":
    main()
