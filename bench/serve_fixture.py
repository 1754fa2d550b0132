#!/usr/bin/env python3
"""Prepares a random-weight model folder (tools/make_fixture) for the served
benchmark (bench/bench_serve.c), so that every generated token is one
streamed chunk of text on any server:

    serve_fixture.py SRC_DIR OUT_DIR

A fixture's vocabulary is padded far beyond its tokenizer (e.g. 128256 ids
over stories260K's 512), and greedy decoding of random weights picks a
padding id almost every step; padding, special and partial-UTF-8 byte
tokens decode to no text, and servers send no chunk for a token without
text, so chunks would not count tokens. OUT_DIR gets the same weights with
the output head's rows of those ids set to zero: their logits are exactly 0
while a printable token's random logit is above 0 somewhere among ~400, so
greedy decoding only ever picks printable tokens. The shape, and so the
work of every step (the head is still the full vocab-wide product), is
unchanged. The token kept are: normal tokens whose text is printable ASCII
(the SentencePiece space included) other than a lone space, and byte tokens
0x21-0x7E.

OUT_DIR also gets a ChatML chat template, chat_template.jinja (the fixture
has none; tern reads the file, llama-server takes it with
--chat-template-file). Every other file is a symbolic link to SRC_DIR's; only the
safetensors shard that holds the head is copied. Pure Python (no numpy)."""
import json
import os
import shutil
import struct
import sys

CHATML = ("{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + "
          "'<|im_end|>' + '\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}"
          "{% endif %}")


def printable_ids(tokenizer_json):
    """Ids of the tokens that decode to at least one printable ASCII character on their own."""
    tok = json.load(open(tokenizer_json))
    special = {t["id"] for t in tok.get("added_tokens", [])}
    keep = []
    for text, i in tok["model"]["vocab"].items():
        if i in special:
            continue
        if len(text) == 6 and text.startswith("<0x") and text.endswith(">"):
            if 0x21 <= int(text[3:5], 16) <= 0x7E:
                keep.append(i)
            continue
        plain = text.replace("\u2581", " ")
        if plain.strip() and all(0x20 <= ord(c) <= 0x7E for c in plain):
            keep.append(i)
    return sorted(keep)


def safetensors_header(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        return 8 + n, json.loads(f.read(n))


def main():
    if len(sys.argv) != 3:
        sys.exit("usage: serve_fixture.py SRC_DIR OUT_DIR")
    src, out = sys.argv[1], sys.argv[2]
    cfg = json.load(open(os.path.join(src, "config.json")))
    head_name = "model.embed_tokens.weight" if cfg.get("tie_word_embeddings") else "lm_head.weight"
    shard = None
    for name in sorted(os.listdir(src)):
        if name.endswith(".safetensors"):
            base, hdr = safetensors_header(os.path.join(src, name))
            if head_name in hdr:
                shard, info = name, hdr[head_name]
                break
    if shard is None:
        sys.exit("serve_fixture: no %s in %s" % (head_name, src))
    width = {"BF16": 2, "F16": 2, "F32": 4}[info["dtype"]]
    rows, dim = info["shape"]
    keep = set(printable_ids(os.path.join(src, "tokenizer.json")))
    if len(keep) < 64:
        sys.exit("serve_fixture: only %d printable tokens" % len(keep))
    os.makedirs(out, exist_ok=True)
    for name in os.listdir(src):
        dst = os.path.join(out, name)
        if os.path.lexists(dst):
            os.remove(dst)
        if name == shard:
            shutil.copyfile(os.path.join(src, name), dst)
        else:
            os.symlink(os.path.abspath(os.path.join(src, name)), dst)
    with open(os.path.join(out, "chat_template.jinja"), "w") as f:
        f.write(CHATML)
    row_bytes = dim * width
    start = base + info["data_offsets"][0]
    zero_row = bytes(row_bytes)
    with open(os.path.join(out, shard), "r+b") as f:
        run = None  # [first, end) of a run of rows to clear
        for r in list(range(rows)) + [None]:
            if r is not None and r not in keep:
                run = [r, r + 1] if run is None else [run[0], r + 1]
                continue
            if run:
                f.seek(start + run[0] * row_bytes)
                left = run[1] - run[0]
                step = max(1, (1 << 24) // row_bytes)
                while left:
                    n = min(left, step)
                    f.write(zero_row * n)
                    left -= n
                run = None
    print("serve_fixture: %s -> %s: %d of %d head rows kept (printable tokens), chat template chatml"
          % (src, out, len(keep), rows))


if __name__ == "__main__":
    main()
