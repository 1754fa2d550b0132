#!/usr/bin/env python3
"""Writes a tern Llama-family model folder (bf16/f16/f32 safetensors, as
tools/make_fixture writes the decode-benchmark models) as one GGUF file, so
that llama.cpp can run the very same weights next to tern.

    gguf_from_tern.py LLAMA_CPP_TREE MODEL_DIR OUT.gguf

LLAMA_CPP_TREE is a llama.cpp source tree: its gguf-py package writes the
file (needs numpy). Weights keep their dtype (bf16 -> BF16). The q/k
projections are reordered from the checkpoint's half-split rotary layout to
the interleaved one GGUF's llama architecture expects. The vocabulary: the
folder's tokenizer.json (a byte-fallback BPE such as stories260K's) as
llama.cpp's SentencePiece-style tokenizer, token scores from the merge ranks,
padded with unused tokens up to the model's vocab_size, so both engines
tokenize a text the same way."""
import json
import os
import struct
import sys

import numpy as np


def load_safetensors(folder):
    """Every tensor of the folder's *.safetensors as (dtype name, shape, bytes)."""
    out = {}
    for name in sorted(os.listdir(folder)):
        if not name.endswith(".safetensors"):
            continue
        with open(os.path.join(folder, name), "rb") as f:
            n = struct.unpack("<Q", f.read(8))[0]
            header = json.loads(f.read(n))
            base = 8 + n
            for key, info in header.items():
                if key == "__metadata__":
                    continue
                b, e = info["data_offsets"]
                f.seek(base + b)
                out[key] = (info["dtype"], info["shape"], f.read(e - b))
    return out


def as_array(dtype, shape, raw):
    np_dtype = {"BF16": np.uint16, "F16": np.float16, "F32": np.float32}[dtype]
    return np.frombuffer(raw, dtype=np_dtype).reshape(shape)


def unsplit_rotary(w, n_head, head_dim):
    """Rows of one q/k projection from [head][half][i] to [head][i][half]."""
    rows = w.shape[1:]
    return w.reshape(n_head, 2, head_dim // 2, *rows).swapaxes(1, 2).reshape(w.shape)


def vocab_entries(folder, n_vocab, gguf):
    tok = json.load(open(os.path.join(folder, "tokenizer.json")))
    model = tok["model"]
    vocab = model["vocab"]
    rank = {}
    for i, m in enumerate(model.get("merges", [])):
        a, b = m.split(" ") if isinstance(m, str) else m
        rank.setdefault(a + b, i)
    special = {t["id"] for t in tok.get("added_tokens", []) if t.get("special")}
    tokens, scores, types = [""] * n_vocab, [0.0] * n_vocab, [0] * n_vocab
    T = gguf.TokenType
    for text, i in vocab.items():
        if i >= n_vocab:
            continue
        tokens[i] = text
        if i in special:
            types[i], scores[i] = T.CONTROL, 0.0
        elif text.startswith("<0x") and text.endswith(">") and len(text) == 6:
            types[i], scores[i] = T.BYTE, 0.0
        else:
            types[i] = T.NORMAL
            scores[i] = -float(rank[text]) if text in rank else (0.0 if len(text) == 1 else -1e6)
    for i in range(n_vocab):
        if not tokens[i]:
            tokens[i], types[i], scores[i] = "[PAD%d]" % i, T.UNUSED, -1e9
    return tokens, scores, types


def main():
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    tree, folder, out_path = sys.argv[1:]
    sys.path.insert(0, os.path.join(tree, "gguf-py"))
    import gguf

    cfg = json.load(open(os.path.join(folder, "config.json")))
    if cfg.get("model_type") != "llama":
        sys.exit("gguf_from_tern: only llama-family folders (model_type %r)" % cfg.get("model_type"))
    dim, n_head = cfg["hidden_size"], cfg["num_attention_heads"]
    n_kv = cfg.get("num_key_value_heads", n_head)
    head_dim = cfg.get("head_dim") or dim // n_head
    n_layer, n_vocab = cfg["num_hidden_layers"], cfg["vocab_size"]
    ts = load_safetensors(folder)
    dtypes = {d for d, _, _ in ts.values()}
    ftype = {"BF16": gguf.LlamaFileType.MOSTLY_BF16, "F16": gguf.LlamaFileType.MOSTLY_F16}.get(
        next(iter(dtypes)) if len(dtypes) == 1 else "F32", gguf.LlamaFileType.ALL_F32)

    w = gguf.GGUFWriter(out_path, "llama")
    w.add_name(os.path.basename(os.path.normpath(folder)))
    w.add_file_type(ftype)
    w.add_context_length(cfg.get("max_position_embeddings", 4096))
    w.add_embedding_length(dim)
    w.add_block_count(n_layer)
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(n_head)
    w.add_head_count_kv(n_kv)
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    w.add_rope_dimension_count(head_dim)
    w.add_rope_freq_base(float(cfg.get("rope_theta", 10000.0)))
    w.add_layer_norm_rms_eps(float(cfg.get("rms_norm_eps", 1e-5)))
    w.add_vocab_size(n_vocab)
    if cfg.get("rope_scaling"):
        sys.exit("gguf_from_tern: rope_scaling is not written (the benchmark models have none)")
    tokens, scores, types = vocab_entries(folder, n_vocab, gguf)
    w.add_tokenizer_model("llama")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_bos_token_id(cfg.get("bos_token_id", 1))
    w.add_eos_token_id(cfg.get("eos_token_id", 2))
    w.add_unk_token_id(0)
    w.add_add_bos_token(True)
    w.add_add_eos_token(False)

    names = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
             "lm_head.weight": "output.weight"}
    per_layer = {"input_layernorm.weight": "attn_norm.weight", "self_attn.q_proj.weight": "attn_q.weight",
                 "self_attn.k_proj.weight": "attn_k.weight", "self_attn.v_proj.weight": "attn_v.weight",
                 "self_attn.o_proj.weight": "attn_output.weight",
                 "post_attention_layernorm.weight": "ffn_norm.weight", "mlp.gate_proj.weight": "ffn_gate.weight",
                 "mlp.up_proj.weight": "ffn_up.weight", "mlp.down_proj.weight": "ffn_down.weight"}
    for l in range(n_layer):
        for k, v in per_layer.items():
            names["model.layers.%d.%s" % (l, k)] = "blk.%d.%s" % (l, v)
    raw_types = {"BF16": gguf.GGMLQuantizationType.BF16, "F16": gguf.GGMLQuantizationType.F16,
                 "F32": gguf.GGMLQuantizationType.F32}
    for key in sorted(ts, key=lambda k: (names.get(k, k))):
        if key not in names:
            sys.exit("gguf_from_tern: tensor %s has no llama.cpp name" % key)
        dt, shape, raw = ts[key]
        a = as_array(dt, shape, raw)
        if key.endswith("q_proj.weight"):
            a = unsplit_rotary(a, n_head, head_dim)
        elif key.endswith("k_proj.weight"):
            a = unsplit_rotary(a, n_kv, head_dim)
        if a.ndim == 1 and dt != "F32":  # norms in f32, as llama.cpp's converter writes them
            a = (a.astype(np.uint32) << 16).view(np.float32) if dt == "BF16" else a.astype(np.float32)
            w.add_tensor(names[key], np.ascontiguousarray(a))
        else:
            w.add_tensor(names[key], np.ascontiguousarray(a), raw_dtype=raw_types[dt])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


if __name__ == "__main__":
    main()
