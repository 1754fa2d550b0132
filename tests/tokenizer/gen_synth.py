#!/usr/bin/env python3
"""Writes synthetic tokenizer folders that exercise tokenizer.json components
the shipped tokenizers do not use (Metaspace, every Split behavior and
invert, Digits, Punctuation, Whitespace, BertNormalizer, Lowercase, Strip,
NFKC/NFD, WordPiece, Unigram, BPE with continuing_subword_prefix /
end_of_word_suffix, RobertaProcessing, added-token lstrip/rstrip/
single_word/normalized, ...). Each folder is then compared with the HF
oracle by oracle_compare.py; the oracle loading it also proves it valid.

Usage: gen_synth.py OUTDIR   (prints NAME=DIR lines)
Vocabularies derive from ../shared/models/stories260K (BPE, byte fallback)
and models/tern-demo (byte-level BPE) plus deterministic random merges.
"""
import copy
import json
import os
import random
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.environ.get("TERN_ROOT", os.path.join(HERE, "..", ".."))
SHARED = os.environ.get("TERN_SHARED", os.path.join(ROOT, "..", "shared"))


def load(p):
    with open(p, encoding="utf-8") as f:
        return json.load(f)


def added(i, content, special=True, lstrip=False, rstrip=False, single_word=False, normalized=False):
    return {"id": i, "content": content, "single_word": single_word, "lstrip": lstrip, "rstrip": rstrip,
            "normalized": normalized, "special": special}


def seq(kind, items):
    key = {"normalizer": "normalizers", "pre": "pretokenizers", "decoder": "decoders"}[kind]
    return {"type": "Sequence", key: items}


def byte_level(t):
    return {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}


def split(pattern, behavior, invert=False, regex=True):
    return {"type": "Split", "pattern": {"Regex" if regex else "String": pattern}, "behavior": behavior,
            "invert": invert}


def random_bpe(prefix=None, suffix=None, seed=1):
    """A valid BPE over letters/digits/punctuation with random merges."""
    r = random.Random(seed)
    chars = list("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.,!?'-_ ") + ["[UNK]"]
    vocab = {}
    for c in chars:
        vocab.setdefault(c, len(vocab))
        if prefix and c != "[UNK]":
            vocab.setdefault(prefix + c, len(vocab))
        if suffix and c != "[UNK]":
            vocab.setdefault(c + suffix, len(vocab))
            if prefix:
                vocab.setdefault(prefix + c + suffix, len(vocab))
    merges = []
    toks = [k for k in vocab if k != "[UNK]"]
    for _ in range(400):
        a = r.choice(toks)
        b = r.choice(toks)
        if suffix and a.endswith(suffix):
            continue
        if prefix:
            if a.startswith(prefix) and False:
                pass
            if not b.startswith(prefix):
                continue
            new = a + b[len(prefix):]
        else:
            new = a + b
        if len(new) > 12 or [a, b] in merges:
            continue
        merges.append([a, b])
        if new not in vocab:
            vocab[new] = len(vocab)
            toks.append(new)
    return {"type": "BPE", "dropout": None, "unk_token": "[UNK]", "continuing_subword_prefix": prefix,
            "end_of_word_suffix": suffix, "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
            "vocab": vocab, "merges": merges}


def wordpiece():
    words = ("the a an and of to in is was it he she they we you i that for on with as at by this "
             "un ##able ##ing ##ed ##s ##ly ##er ##est play run jump happy quick brown fox dog lazy over").split()
    vocab = {"[PAD]": 0, "[UNK]": 1, "[CLS]": 2, "[SEP]": 3, "[MASK]": 4}
    for c in "abcdefghijklmnopqrstuvwxyz0123456789.,!?'-\"()[]:;/éü中文":
        vocab.setdefault(c, len(vocab))
        vocab.setdefault("##" + c, len(vocab))
    for w in words:
        vocab.setdefault(w, len(vocab))
    return {"type": "WordPiece", "unk_token": "[UNK]", "continuing_subword_prefix": "##",
            "max_input_chars_per_word": 100, "vocab": vocab}


def unigram(byte_fallback):
    r = random.Random(5)
    pieces = [["<unk>", 0.0], ["<s>", 0.0], ["</s>", 0.0]]
    if byte_fallback:
        pieces += [[f"<0x{b:02X}>", 0.0] for b in range(256)]
    seen = set(p[0] for p in pieces)
    base = "▁abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.,!?'"
    for c in base:
        pieces.append([c, -r.uniform(5, 9)])
        seen.add(c)
    for _ in range(600):
        n = r.randint(2, 6)
        w = ("▁" if r.random() < 0.4 else "") + "".join(r.choice("etaoinshrdlucmfw") for _ in range(n))
        if w not in seen:
            seen.add(w)
            pieces.append([w, -r.uniform(3, 12)])
    return {"type": "Unigram", "unk_id": 0, "vocab": pieces, "byte_fallback": byte_fallback}


def main():
    out = sys.argv[1]
    stories = load(os.path.join(SHARED, "models", "stories260K", "tokenizer.json"))
    demo = load(os.path.join(ROOT, "models", "tern-demo", "tokenizer.json"))
    cases = {}

    # SentencePiece/Llama-2 legacy style: Metaspace pre-tokenizer + decoder.
    for scheme in ("always", "first", "never"):
        for sp in (True, False):
            t = copy.deepcopy(stories)
            t["normalizer"] = None
            t["pre_tokenizer"] = {"type": "Metaspace", "replacement": "▁", "prepend_scheme": scheme, "split": sp}
            t["decoder"] = seq("decoder", [{"type": "Metaspace", "replacement": "▁", "prepend_scheme": scheme,
                                            "split": sp}, {"type": "ByteFallback"}, {"type": "Fuse"}])
            cases[f"metaspace-{scheme}-{int(sp)}"] = t
    # legacy Metaspace field add_prefix_space
    t = copy.deepcopy(stories)
    t["normalizer"] = None
    t["pre_tokenizer"] = {"type": "Metaspace", "replacement": "▁", "add_prefix_space": True}
    t["decoder"] = {"type": "Metaspace", "replacement": "▁", "add_prefix_space": True}
    cases["metaspace-legacy"] = t

    # Normalizer zoo on the SentencePiece BPE.
    t = copy.deepcopy(stories)
    t["normalizer"] = seq("normalizer", [{"type": "NFKC"}, {"type": "Lowercase"},
                                         {"type": "Strip", "strip_left": True, "strip_right": True},
                                         {"type": "Replace", "pattern": {"Regex": "\\s+"}, "content": " "},
                                         {"type": "Prepend", "prepend": "▁"},
                                         {"type": "Replace", "pattern": {"String": " "}, "content": "▁"}])
    cases["norm-nfkc-lower-strip"] = t
    t = copy.deepcopy(stories)
    t["normalizer"] = seq("normalizer", [{"type": "NFD"}, {"type": "StripAccents"}, {"type": "NFC"},
                                         {"type": "Replace", "pattern": {"String": " "}, "content": "▁"}])
    t["pre_tokenizer"] = seq("pre", [{"type": "Digits", "individual_digits": True},
                                     {"type": "Punctuation", "behavior": "Isolated"}])
    cases["norm-nfd-digits-punct"] = t

    # Every Split behavior, with and without invert, on the byte-level BPE.
    for beh in ("Removed", "Isolated", "MergedWithPrevious", "MergedWithNext", "Contiguous"):
        for inv in (False, True):
            t = copy.deepcopy(demo)
            t["pre_tokenizer"] = seq("pre", [split("\\s+|[.,!?]", beh, inv), byte_level(t)])
            cases[f"split-{beh}-{int(inv)}"] = t
    t = copy.deepcopy(demo)
    t["pre_tokenizer"] = seq("pre", [split("e", "MergedWithNext", False, regex=False),
                                     {"type": "Digits", "individual_digits": False}, byte_level(t)])
    cases["split-string-digits"] = t

    # GPT-2 style: ByteLevel with its own regex and prefix space, Roberta post-processor.
    t = copy.deepcopy(demo)
    t["pre_tokenizer"] = {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True}
    t["post_processor"] = {"type": "RobertaProcessing", "sep": ["<|im_end|>", 2], "cls": ["<|im_start|>", 1],
                           "trim_offsets": True, "add_prefix_space": True}
    cases["gpt2-bytelevel-roberta"] = t
    t = copy.deepcopy(demo)
    t["pre_tokenizer"] = seq("pre", [{"type": "WhitespaceSplit"}, byte_level(t)])
    t["post_processor"] = {"type": "Sequence", "processors": [
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False},
        {"type": "TemplateProcessing",
         "single": [{"SpecialToken": {"id": "<|im_start|>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                    {"SpecialToken": {"id": "<|im_end|>", "type_id": 0}}],
         "pair": [{"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
         "special_tokens": {"<|im_start|>": {"id": "<|im_start|>", "ids": [1], "tokens": ["<|im_start|>"]},
                            "<|im_end|>": {"id": "<|im_end|>", "ids": [2], "tokens": ["<|im_end|>"]}}}]}
    cases["whitespacesplit-template-seq"] = t

    # Added-token flags on the SentencePiece BPE.
    t = copy.deepcopy(stories)
    n = len(t["model"]["vocab"])
    t["added_tokens"] += [added(n, "<mask>", True, lstrip=True, rstrip=True),
                          added(n + 1, "cat", False, single_word=True, normalized=False),
                          added(n + 2, "dog house", False, normalized=True),
                          added(n + 3, "[X]", False, rstrip=True, normalized=False),
                          added(n + 4, "ab", False, lstrip=True, single_word=True, normalized=True)]
    cases["added-flags"] = t

    # BPE with continuing_subword_prefix / end_of_word_suffix.
    for name, pre, suf in (("bpe-prefix", "##", None), ("bpe-suffix", None, "</w>"), ("bpe-both", "##", "</w>")):
        t = {"version": "1.0", "truncation": None, "padding": None, "added_tokens": [], "normalizer": None,
             "pre_tokenizer": {"type": "Whitespace"}, "post_processor": None,
             "decoder": {"type": "BPEDecoder", "suffix": suf} if suf else {"type": "WordPiece", "prefix": "##",
                                                                            "cleanup": True},
             "model": random_bpe(pre, suf, seed=len(name))}
        cases[name] = t

    # BERT-style WordPiece.
    cases["wordpiece-bert"] = {
        "version": "1.0", "truncation": None, "padding": None,
        "added_tokens": [added(i, s) for i, s in enumerate(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"])],
        "normalizer": {"type": "BertNormalizer", "clean_text": True, "handle_chinese_chars": True,
                       "strip_accents": None, "lowercase": True},
        "pre_tokenizer": {"type": "BertPreTokenizer"},
        "post_processor": {"type": "BertProcessing", "sep": ["[SEP]", 3], "cls": ["[CLS]", 2]},
        "decoder": {"type": "WordPiece", "prefix": "##", "cleanup": True},
        "model": wordpiece()}

    # Unigram with and without byte fallback.
    for bf in (False, True):
        cases[f"unigram-bf{int(bf)}"] = {
            "version": "1.0", "truncation": None, "padding": None,
            "added_tokens": [added(0, "<unk>"), added(1, "<s>"), added(2, "</s>")],
            "normalizer": {"type": "Replace", "pattern": {"String": " "}, "content": "▁"},
            "pre_tokenizer": {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "always", "split": True},
            "post_processor": {"type": "TemplateProcessing",
                               "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}},
                                          {"Sequence": {"id": "A", "type_id": 0}},
                                          {"SpecialToken": {"id": "</s>", "type_id": 0}}],
                               "pair": [{"Sequence": {"id": "A", "type_id": 0}}],
                               "special_tokens": {"<s>": {"id": "<s>", "ids": [1], "tokens": ["<s>"]},
                                                  "</s>": {"id": "</s>", "ids": [2], "tokens": ["</s>"]}}},
            "decoder": seq("decoder", [{"type": "Metaspace", "replacement": "▁", "prepend_scheme": "always",
                                        "split": True}, {"type": "ByteFallback"}, {"type": "Fuse"},
                                       {"type": "Strip", "content": " ", "start": 1, "stop": 0}]),
            "model": unigram(bf)}

    # Decoder without one: HF joins tokens with spaces.
    t = copy.deepcopy(stories)
    t["decoder"] = None
    cases["no-decoder"] = t

    for name, t in cases.items():
        d = os.path.join(out, name)
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, "tokenizer.json"), "w", encoding="utf-8") as f:
            json.dump(t, f, ensure_ascii=False)
        with open(os.path.join(d, "tokenizer_config.json"), "w", encoding="utf-8") as f:
            json.dump({"tokenizer_class": "PreTrainedTokenizerFast"}, f)
        print(f"{name}={d}")


if __name__ == "__main__":
    main()
