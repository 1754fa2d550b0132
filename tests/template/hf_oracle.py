#!/usr/bin/python3
"""Reference renderer: Debian's python3-jinja2 configured exactly as Hugging
Face transformers configures it for chat templates (see
transformers/utils/chat_template_utils.py: _compile_jinja_template and
render_jinja_template), so tern's output can be compared byte for byte.

Usage: hf_oracle.py DIR < requests.jsonl > results.jsonl
DIR holds tokenizer_config.json (and optionally chat_template.jinja). Each
input line is a request {"messages": [...], "tools": [...],
"add_generation_prompt": bool, ...}; each output line is {"text": ...} or
{"error": ..., "raised": bool} (raised: the template called
raise_exception)."""
import json
import os
import sys
from datetime import datetime

import jinja2
from jinja2 import nodes
from jinja2.ext import Extension
from jinja2.sandbox import ImmutableSandboxedEnvironment


class TemplateRaised(Exception):
    pass


class AssistantTracker(Extension):
    # transformers' {% generation %} block; for plain rendering it only
    # outputs its body.
    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
        return nodes.CallBlock(self.call_method("_render", []), [], [], body).set_lineno(lineno)

    def _render(self, caller):
        return caller()


def raise_exception(message):
    raise TemplateRaised(message)


def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    # transformers overrides jinja's tojson: no HTML escaping, more options
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


def strftime_now(format):
    return datetime.now().strftime(format)


def make_env():
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[AssistantTracker, jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


SPECIAL = ["bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token"]


def token_str(v):
    if isinstance(v, str):
        return v
    if isinstance(v, dict) and isinstance(v.get("content"), str):
        return v["content"]
    return None


def load(dir_):
    cfg = {}
    p = os.path.join(dir_, "tokenizer_config.json")
    if os.path.exists(p):
        with open(p, encoding="utf-8") as f:
            cfg = json.load(f)
    templates = {}
    j = os.path.join(dir_, "chat_template.jinja")
    if os.path.exists(j):
        with open(j, encoding="utf-8", newline="") as f:
            templates["default"] = f.read()
    else:
        ct = cfg.get("chat_template")
        if isinstance(ct, list):
            templates = {e["name"]: e["template"] for e in ct}
        else:
            templates["default"] = ct
    special = {}
    for k in SPECIAL:
        s = token_str(cfg.get(k))
        if s is not None:
            special[k] = s
    extra = cfg.get("additional_special_tokens")
    if isinstance(extra, list):
        special["additional_special_tokens"] = [t for t in map(token_str, extra) if t is not None]
    return templates, special


def continue_final(rendered_chat, chat):
    # transformers' continue_final_message post-processing
    final_message = chat[-1]["content"]
    if isinstance(final_message, (list, tuple)):
        for content_block in reversed(final_message):
            if "text" in content_block:
                final_message = content_block["text"]
                break
        else:
            raise ValueError("no text to continue in the final message")
    if final_message.strip() not in rendered_chat:
        raise ValueError("final message does not appear in the rendered chat")
    final_msg_loc = rendered_chat.rindex(final_message.strip())
    if rendered_chat[final_msg_loc: final_msg_loc + len(final_message.lstrip())] == final_message:
        return rendered_chat[: final_msg_loc + len(final_message.lstrip())]
    return rendered_chat[: final_msg_loc + len(final_message.strip())]


def main():
    templates, special = load(sys.argv[1])
    env = make_env()
    compiled = {k: env.from_string(v) for k, v in templates.items()}
    for line in sys.stdin:
        line = line.strip()
        if not line:
            continue
        req = json.loads(line)
        tools = req.get("tools")
        name = "tool_use" if tools is not None and "tool_use" in compiled else "default"
        kwargs = dict(special)
        kwargs.update({k: v for k, v in req.items()
                       if k not in ("messages", "tools", "documents", "add_generation_prompt",
                                    "continue_final_message")})
        try:
            cont = req.get("continue_final_message", False)
            if cont and req.get("add_generation_prompt"):
                raise ValueError("continue_final_message and add_generation_prompt are not compatible")
            text = compiled[name].render(messages=req.get("messages"), tools=tools,
                                         documents=req.get("documents"),
                                         add_generation_prompt=req.get("add_generation_prompt", False),
                                         **kwargs)
            if cont:
                text = continue_final(text, req["messages"])
            out = {"text": text}
        except TemplateRaised as e:
            out = {"error": str(e), "raised": True}
        except Exception as e:  # noqa: BLE001 - any template failure is a result
            out = {"error": "%s: %s" % (type(e).__name__, e), "raised": False}
        sys.stdout.write(json.dumps(out, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    main()
