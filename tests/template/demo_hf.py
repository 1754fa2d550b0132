#!/usr/bin/python3
"""The demo model's chat template against transformers: demo_hf_renders.jsonl
holds requests (tools, tool calls with string and object arguments, tool
results, thinking on and off, non-ASCII text) and the text transformers
5.17's apply_chat_template rendered for each with models/tern-demo's
tokenizer_config.json (tools/demo/finetune.py wrote them on the GPU machine).
Checks, byte for byte: `tern template models/tern-demo` gives the same text;
the template shipped in the model folder is the one of
tools/demo/chat_format_tools.py, whose Python twin render() (the renderer of
the training data) also gives the same text.

Needs TERN_BIN (set by ctest)."""
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "tools", "demo"))
from chat_format_tools import CHAT_TEMPLATE, render  # noqa: E402


def main():
    tern = os.environ.get("TERN_BIN", os.path.join(ROOT, "build", "tern"))
    model = os.path.join(ROOT, "models", "tern-demo")
    bad = 0
    cfg = json.load(open(os.path.join(model, "tokenizer_config.json"), encoding="utf-8"))
    if cfg.get("chat_template") != CHAT_TEMPLATE:
        print("models/tern-demo's chat template differs from tools/demo/chat_format_tools.py")
        bad += 1
    draft = json.load(open(os.path.join(ROOT, "models", "tern-demo-draft", "tokenizer_config.json"), encoding="utf-8"))
    if draft.get("chat_template") != CHAT_TEMPLATE:
        print("models/tern-demo-draft's chat template differs from the target's")
        bad += 1
    lines = [json.loads(l) for l in open(os.path.join(HERE, "demo_hf_renders.jsonl"), encoding="utf-8") if l.strip()]
    for i, case in enumerate(lines):
        rq, want = case["request"], case["hf_text"]
        p = subprocess.run([tern, "template", model], input=json.dumps(rq).encode(), capture_output=True, timeout=60)
        got = p.stdout.decode()
        if p.returncode != 0 or got != want:
            print("case %d: tern differs from transformers\n  tern: %r\n  hf:   %r\n%s" % (i, got, want, p.stderr.decode()))
            bad += 1
        twin = render(rq["messages"], rq.get("tools"), rq.get("add_generation_prompt", False), rq.get("enable_thinking"))
        if twin != want:
            print("case %d: render() differs from transformers\n  twin: %r\n  hf:   %r" % (i, twin, want))
            bad += 1
    tools = sum(1 for c in lines if c["request"].get("tools"))
    print("demo template: %d requests (%d with tools), %d mismatches" % (len(lines), tools, bad))
    return 1 if bad or len(lines) < 4 else 0


if __name__ == "__main__":
    sys.exit(main())
