#!/usr/bin/python3
"""Generates chat requests for the template oracle comparison: a fixed,
seeded mix of conversations (system/user/assistant turns, multi-turn, tools,
tool calls with arguments as object and as string, tool results, thinking on
and off, reasoning_content, <think> blocks, multimodal content lists, odd
characters) plus requests that make templates raise. Deterministic for a
given seed, so failures reproduce.

Usage: gen_cases.py [--seed N] [--count N] > cases.jsonl"""
import argparse
import json
import random

WORDS = ["hello", "weather", "Paris", "tokens", "ünïcödé", "中文", "😀", "a\"quote", "it's",
         "back\\slash", "tab\there", "{{ x }}", "{% if %}", "<tag>", "&amp;", "  spaced  ",
         "line\nbreak", "\u2028sep", "x" * 40, "naïve café", "$100", "42", "-1.5e3", "null"]

TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "Get the current weather in a city",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string", "description": "City name, e.g. Paris"},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
            "required": ["city"]}}},
    {"type": "function", "function": {
        "name": "add", "description": "Add two numbers (déjà vu: \"quoted\")",
        "parameters": {"type": "object", "properties": {
            "a": {"type": "number"}, "b": {"type": "integer", "default": 1}},
            "required": ["a", "b"]}, "return": {"type": "number"}}},
    {"type": "function", "function": {
        "name": "search", "description": "Search the web",
        "parameters": {"type": "object", "properties": {
            "query": {"type": "string"}, "limit": {"type": "integer", "minimum": 1, "maximum": 10},
            "filters": {"type": "array", "items": {"type": "string"}}, "safe": {"type": "boolean"}},
            "required": ["query"]}}},
]


def text(rng, lo=1, hi=8):
    n = rng.randint(lo, hi)
    s = " ".join(rng.choice(WORDS) for _ in range(n))
    r = rng.random()
    if r < 0.1:
        s = "\n" + s + "\n"
    elif r < 0.15:
        s = "  " + s + "  "
    elif r < 0.18:
        s = ""
    return s


def call_id(rng):
    return "".join(rng.choice("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789") for _ in range(9))


def tool_call(rng, as_string):
    fn = rng.choice(TOOLS)["function"]["name"]
    args = {"get_weather": {"city": rng.choice(["Paris", "Zürich", "東京"]), "unit": "celsius"},
            "add": {"a": rng.choice([1, 2.5, -3, 1e21, 0.1]), "b": rng.randint(0, 9)},
            "search": {"query": text(rng, 1, 3), "limit": 3, "filters": ["news", "x\"y"], "safe": True}}[fn]
    return {"id": call_id(rng), "type": "function",
            "function": {"name": fn, "arguments": json.dumps(args, ensure_ascii=False) if as_string else args}}


def assistant(rng, think_style):
    content = text(rng)
    msg = {"role": "assistant", "content": content}
    if think_style == "inline":
        msg["content"] = "<think>\n" + text(rng) + "\n</think>\n\n" + content
    elif think_style == "field":
        msg["reasoning_content"] = text(rng)
    return msg


def conversation(rng, kind):
    msgs = []
    if rng.random() < 0.5:
        msgs.append({"role": "system", "content": text(rng)})
    req = {}
    turns = rng.randint(1, 4)
    think = rng.choice(["none", "none", "inline", "field"])
    for t in range(turns):
        msgs.append({"role": "user", "content": text(rng)})
        if kind == "tools" and rng.random() < 0.6:
            n_calls = 1 if rng.random() < 0.7 else 2
            calls = [tool_call(rng, rng.random() < 0.5) for _ in range(n_calls)]
            m = {"role": "assistant", "content": "" if rng.random() < 0.5 else text(rng), "tool_calls": calls}
            if think == "field":
                m["reasoning_content"] = text(rng)
            msgs.append(m)
            for c in calls:
                result = json.dumps({"temp": 21.5, "ok": True}) if rng.random() < 0.5 else text(rng)
                msgs.append({"role": "tool", "tool_call_id": c["id"], "name": c["function"]["name"],
                             "content": result})
            msgs.append(assistant(rng, think))
        elif t < turns - 1 or rng.random() < 0.3:
            msgs.append(assistant(rng, think))
    if kind == "tools":
        req["tools"] = rng.sample(TOOLS, rng.randint(1, len(TOOLS)))
    req["messages"] = msgs
    req["add_generation_prompt"] = msgs[-1]["role"] != "assistant" or rng.random() < 0.2
    if msgs[-1]["role"] == "assistant" and not req["add_generation_prompt"] and rng.random() < 0.5:
        req["continue_final_message"] = True
    r = rng.random()
    if r < 0.3:
        req["enable_thinking"] = False
    elif r < 0.5:
        req["enable_thinking"] = True
    return req


def special_cases():
    """Hand-written requests for paths random mixing rarely reaches."""
    u = {"role": "user", "content": "Hi"}
    a = {"role": "assistant", "content": "Hello!"}
    return [
        {"messages": [u], "add_generation_prompt": True},
        {"messages": [u]},
        {"messages": [{"role": "system", "content": "Be brief."}, u, a, u], "add_generation_prompt": True},
        # multimodal content list (Gemma 3 handles it; others may raise)
        {"messages": [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": " What is this? "}]}],
         "add_generation_prompt": True},
        {"messages": [{"role": "system", "content": [{"type": "text", "text": "Sys as list"}]}, u],
         "add_generation_prompt": True},
        # Qwen multi-step tool detection: user turn that is a tool response
        {"messages": [u, {"role": "assistant", "content": "<think>plan</think>ok"},
                      {"role": "user", "content": "<tool_response>\nx\n</tool_response>"},
                      {"role": "assistant", "content": "<think>\nmore\n</think>\n\ndone"}]},
        # non-alternating roles: Gemma and Mistral raise
        {"messages": [u, u], "add_generation_prompt": True},
        {"messages": [a], "add_generation_prompt": True},
        # unknown role: Mistral raises
        {"messages": [u, {"role": "critic", "content": "meh"}]},
        # tool call id of the wrong length: Mistral raises
        {"messages": [u, {"role": "assistant", "content": "",
                          "tool_calls": [{"id": "call_1", "type": "function",
                                          "function": {"name": "add", "arguments": {"a": 1, "b": 2}}}]},
                      {"role": "tool", "tool_call_id": "call_1", "content": "3"}], "tools": TOOLS},
        # Llama 3.1: extra kwargs, builtin tools, two tool calls (raises)
        {"messages": [u], "date_string": "01 Jan 2025", "add_generation_prompt": True, "tools": TOOLS[:1]},
        {"messages": [{"role": "system", "content": "S"}, u], "builtin_tools": ["brave_search", "code_interpreter"],
         "add_generation_prompt": True},
        {"messages": [u, {"role": "assistant", "content": "",
                          "tool_calls": [tool_call(random.Random(1), False), tool_call(random.Random(2), False)]}],
         "tools": TOOLS},
        {"messages": [u], "tools": TOOLS, "tools_in_user_message": False, "add_generation_prompt": True},
        {"messages": [u, {"role": "tool", "content": {"result": [1, 2, {"k": "v"}]}}]},
        # content None on an assistant tool-call turn
        {"messages": [u, {"role": "assistant", "content": None,
                          "tool_calls": [{"id": "abcdefghi", "type": "function",
                                          "function": {"name": "add", "arguments": "{\"a\": 1}"}}]}]},
        {"messages": [{"role": "user", "content": "ünïcödé \u00a0nbsp 𝄞 \x01ctl"}], "add_generation_prompt": True},
        {"messages": [], "add_generation_prompt": True},
        # continue_final_message: prefill the assistant turn
        {"messages": [u, {"role": "assistant", "content": "  The answer is"}], "continue_final_message": True},
        {"messages": [u, {"role": "assistant", "content": "Partial \n"}], "continue_final_message": True},
        {"messages": [u, {"role": "assistant", "content": "x"}], "continue_final_message": True,
         "add_generation_prompt": True},
    ]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--count", type=int, default=60)
    args = ap.parse_args()
    rng = random.Random(args.seed)
    cases = special_cases()
    for i in range(args.count):
        cases.append(conversation(rng, "tools" if i % 3 == 0 else "chat"))
    for c in cases:
        print(json.dumps(c, ensure_ascii=False))


if __name__ == "__main__":
    main()
