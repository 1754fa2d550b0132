#!/usr/bin/env python3
"""Deterministic multilingual tokenizer test corpus, one JSON string a line.

Usage: gen_corpus.py [--bytes N] [--seed S] > corpus.jsonl

Mixes prose, code, numbers, CJK, emoji (ZWJ, flags, skin tones), combining
marks and decomposed text (for NFC), right-to-left and Indic scripts, odd
whitespace (tabs, CR, NBSP, ideographic space, zero-width), literal
special-token text of the tokenizers we test, and random code points from
every plane. The same seed always gives the same corpus (Python's random
with an int seed is stable across versions for the calls used here).
"""
import argparse
import json
import random
import unicodedata

PROSE = [
    "Once upon a time, there was a little girl named Lily.",
    "She loved to play outside in the sunshine with her dog.",
    "The quick brown fox jumps over the lazy dog!",
    "I'm sure you'll agree: it's the best we've ever had, isn't it?",
    "HE'S HERE. They'RE gone. We'VE won. I'D say so. You'LL see.",
    "Dr. Smith (aged 42) paid $1,234.56 on 2024-03-15 at 10:30am.",
    "E-mail me at someone@example.com or visit https://example.org/a?b=c&d=e#f.",
    "  Leading spaces, trailing spaces   ",
    "Mr. O'Neil said \"hello\" -- and then... nothing.",
    "Ünïcödé façade naïve café résumé coöperate jalapeño Straße ÆØÅ œuvre",
    "Привет, как дела? Всё хорошо, спасибо!",
    "Γειά σου Κόσμε· ΟΔΥΣΣΕΥΣ ὁ πολύτροπος",
    "مرحبا بالعالم، كيف حالك؟",
    "שלום עולם, מה שלומך?",
    "नमस्ते दुनिया, आप कैसे हैं?",
    "สวัสดีชาวโลก ภาษาไทยไม่มีช่องว่าง",
    "Xin chào thế giới, tiếng Việt có dấu",
    "你好，世界！今天天气很好，我们去公园散步吧。",
    "日本語のテキスト：ひらがな、カタカナ、漢字が混ざっています。",
    "한국어 텍스트입니다. 안녕하세요, 세계!",
    "İstanbul'da ılık bir gün; ĞÜŞİÖÇ ğüşiöç",
    "Ἀρχὴ ἥμισυ παντός",
]

CODE = [
    "def fib(n):\n    if n < 2:\n        return n\n    return fib(n - 1) + fib(n - 2)\n",
    "int main(void) {\n\tprintf(\"%d\\n\", 42);\n\treturn 0;\n}\n",
    "for (let i = 0; i < arr.length; i++) { sum += arr[i] ** 2; }",
    '{"name": "tern", "version": [1, 2, 3], "ok": true, "nested": {"a": null}}',
    "SELECT id, name FROM users WHERE age >= 18 ORDER BY name DESC;",
    "#include <stdio.h>\n#define MAX(a,b) ((a)>(b)?(a):(b))\n",
    "    \n\n\t\t  x = [i*i for i in range(10) if i % 2 == 0]  # comment\r\n",
    "fn main() -> Result<(), Box<dyn Error>> { let v: Vec<u8> = vec![0xFF; 16]; Ok(()) }",
    "$ ls -la | grep '^d' && echo \"done\" >> /tmp/log.txt 2>&1",
    "<div class=\"a\"><p>Hello&nbsp;<b>world</b></p></div>",
    "a+=1;b-=2;c*=3;d/=4;e%=5;f<<=6;g>>=7;h&&=i||j;k??=l",
]

SPECIAL = [
    "<|im_start|>", "<|im_end|>", "<|endoftext|>", "<s>", "</s>", "<unk>", "<pad>", "<bos>", "<eos>",
    "<start_of_turn>", "<end_of_turn>", "<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>",
    "<|start_header_id|>", "<|end_header_id|>", "<think>", "</think>", "<tool_call>", "<|fim_prefix|>",
    "<0x41>", "<0xE4>", "<|im_st", "im_end|>", "<mask>", "[CLS]", "<start_of_image>", "<unused12>",
    "<|reserved_special_token_5|>", "<|vision_pad|>",
]

WHITESPACE = [" ", "  ", "   ", "\t", "\n", "\n\n", "\r\n", "\r", "\u00a0", "\u2003", "\u3000", "\u200b",
              "\u2028", "\u0085", "\x0b", "\x0c", " \n ", "\t\t", "        ", "\u202f", "\ufeff"]

EMOJI = ["😀", "👍🏽", "👨‍👩‍👧‍👦", "🇺🇸", "🇯🇵", "❤️", "🏳️‍🌈", "🤖", "🧑🏿‍🚀", "✨", "🎉🎉🎉", "😂😂", "☕",
         "1️⃣", "©", "™", "🫠", "👩🏻‍💻"]

RANGES = [
    (0x20, 0x7E), (0xA0, 0x24F), (0x300, 0x36F), (0x370, 0x3FF), (0x400, 0x4FF), (0x590, 0x5FF), (0x600, 0x6FF),
    (0x900, 0x97F), (0xE00, 0xE7F), (0x1100, 0x11FF), (0x1E00, 0x1EFF), (0x2000, 0x206F), (0x2190, 0x22FF),
    (0x3040, 0x30FF), (0x4E00, 0x9FFF), (0xAC00, 0xD7A3), (0xE000, 0xE0FF), (0xFB00, 0xFB4F), (0xFF00, 0xFFEF),
    (0x1F300, 0x1FAFF), (0x20000, 0x2A6DF), (0x1D400, 0x1D7FF), (0x0, 0x1F), (0x10000, 0x1007F),
]


def rand_char(r):
    lo, hi = r.choice(RANGES)
    c = r.randint(lo, hi)
    if 0xD800 <= c <= 0xDFFF:
        c = 0x41
    return chr(c)


def rand_number(r):
    k = r.randrange(7)
    if k == 0:
        return str(r.randrange(10 ** r.randint(1, 12)))
    if k == 1:
        return f"{r.uniform(-1e6, 1e6):.{r.randint(0, 6)}f}"
    if k == 2:
        return f"{r.randint(1900, 2100)}-{r.randint(1, 12):02d}-{r.randint(1, 28):02d}"
    if k == 3:
        return f"+1 ({r.randint(200, 999)}) {r.randint(100, 999)}-{r.randint(1000, 9999)}"
    if k == 4:
        return "".join(r.choice("0123456789") for _ in range(r.randint(10, 40)))
    if k == 5:
        return f"{r.randint(0, 255)}.{r.randint(0, 255)}.{r.randint(0, 255)}.{r.randint(0, 255)}"
    return f"{r.random():e}"


def combining(r):
    base = r.choice("aeiouAEIOUnczsqx")
    return base + "".join(chr(r.randint(0x300, 0x36F)) for _ in range(r.randint(1, 4)))


def fragment(r):
    k = r.randrange(12)
    if k == 0:
        return r.choice(PROSE)
    if k == 1:
        return r.choice(CODE)
    if k == 2:
        return rand_number(r)
    if k == 3:
        return r.choice(SPECIAL)
    if k == 4:
        return r.choice(WHITESPACE)
    if k == 5:
        return r.choice(EMOJI)
    if k == 6:
        return combining(r)
    if k == 7:
        return unicodedata.normalize(r.choice(["NFD", "NFKD", "NFC"]), r.choice(PROSE))
    if k == 8:
        return "".join(rand_char(r) for _ in range(r.randint(1, 30)))
    if k == 9:
        w = r.choice(PROSE).split(" ")
        r.shuffle(w)
        return " ".join(w).upper() if r.random() < 0.3 else " ".join(w)
    if k == 10:
        return r.choice(["'s", "'t", "'re", "'ve", "'m", "'ll", "'d", "'S", "'LL", "n't"])
    return r.choice(WHITESPACE) + r.choice(PROSE) + r.choice(WHITESPACE)


def line(r):
    n = r.choice([1, 1, 2, 3, 5, 8, 13, 30])
    parts = []
    for _ in range(n):
        parts.append(fragment(r))
        if r.random() < 0.5:
            parts.append(" ")
    return "".join(parts)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bytes", type=int, default=1 << 20)
    ap.add_argument("--seed", type=int, default=1234)
    a = ap.parse_args()
    r = random.Random(a.seed)
    total = 0
    out = []
    fixed = ["", " ", "a", "\n", "  \n\n  ", "<|im_start|>user\nhi<|im_end|>", "<s> </s>", "▁▁x▁"]
    for s in fixed:
        out.append(json.dumps(s))
    while total < a.bytes:
        s = line(r)
        total += len(s.encode("utf-8"))
        out.append(json.dumps(s))
    print("\n".join(out))


if __name__ == "__main__":
    main()
