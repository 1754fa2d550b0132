"""Chat format of models/tern-demo with function calling.

ChatML with the Qwen3 thinking switch (as before) plus tools in the
Hermes/Qwen3 layout:

  - `tools` go into the system turn: the system message (if any), a blank
    line, a short instruction, then one JSON line per tool between <tools>
    and </tools>;
  - an assistant message with `tool_calls` is its content followed by one
    block per call:  <tool_call>\\n{"name": NAME, "arguments": {...}}\\n</tool_call>
    (blocks separated by a newline; arguments given as a JSON string are
    copied verbatim, as objects they are serialised with tojson);
  - consecutive `tool` messages become one user turn holding one
    <tool_response>\\n...\\n</tool_response> block each;
  - assistant messages lose everything up to the last </think>; with
    add_generation_prompt the prompt ends at "<|im_start|>assistant\\n", plus
    the empty think block when enable_thinking is false.

Without tools the rendering is byte-identical to the previous template, so
the original synthetic chats stay valid training data.

CHAT_TEMPLATE is the Jinja text written to tokenizer_config.json; render()
is the same logic in plain Python (used to build training prompts). The two
are compared under jinja2, transformers' apply_chat_template and tern's own
template engine (see README.md).
"""
import json

TOOLS_INTRO = ('# Tools\n\nYou can call the functions below. Each line inside <tools></tools> is the '
               'signature of one function:\n<tools>')
TOOLS_OUTRO = ('\n</tools>\n\nTo call a function, answer with a JSON object holding its name and its '
               'arguments inside <tool_call></tool_call> tags, one block per call:\n<tool_call>\n'
               '{"name": "function_name", "arguments": {"argument_name": "value"}}\n</tool_call>')


def _jinja_str(s):
    """A Jinja string literal (single quotes) for s."""
    return "'" + s.replace('\\', '\\\\').replace("'", "\\'").replace('\n', '\\n') + "'"


CHAT_TEMPLATE = (
    "{%- if tools %}"
    "{{- '<|im_start|>system\\n' }}"
    "{%- if messages and messages[0]['role'] == 'system' and messages[0]['content'] is string %}"
    "{{- messages[0]['content'] + '\\n\\n' }}"
    "{%- endif %}"
    "{{- " + _jinja_str(TOOLS_INTRO) + " }}"
    "{%- for tool in tools %}"
    "{{- '\\n' + (tool | tojson) }}"
    "{%- endfor %}"
    "{{- " + _jinja_str(TOOLS_OUTRO + '<|im_end|>\n') + " }}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- set content = message['content'] if message['content'] is string else '' %}"
    "{%- if message['role'] == 'system' and tools and loop.first %}"
    "{%- elif message['role'] == 'tool' %}"
    "{%- if loop.first or messages[loop.index0 - 1]['role'] != 'tool' %}"
    "{{- '<|im_start|>user' }}"
    "{%- endif %}"
    "{{- '\\n<tool_response>\\n' + content + '\\n</tool_response>' }}"
    "{%- if loop.last or messages[loop.index0 + 1]['role'] != 'tool' %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- elif message['role'] == 'assistant' %}"
    "{%- if '</think>' in content %}"
    "{%- set content = content.split('</think>')[-1].lstrip('\\n') %}"
    "{%- endif %}"
    "{{- '<|im_start|>assistant\\n' + content }}"
    "{%- if message['tool_calls'] is defined and message['tool_calls'] %}"
    "{%- for call in message['tool_calls'] %}"
    "{%- set fn = call['function'] if call['function'] is defined else call %}"
    "{%- if content or not loop.first %}"
    "{{- '\\n' }}"
    "{%- endif %}"
    "{{- '<tool_call>\\n{\"name\": ' + (fn['name'] | tojson) + ', \"arguments\": ' }}"
    "{%- if fn['arguments'] is string %}"
    "{{- fn['arguments'] }}"
    "{%- else %}"
    "{{- fn['arguments'] | tojson }}"
    "{%- endif %}"
    "{{- '}\\n</tool_call>' }}"
    "{%- endfor %}"
    "{%- endif %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- else %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + content + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}"
    "{{- '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}"
    "{{- '<think>\\n\\n</think>\\n\\n' }}"
    "{%- endif %}"
    "{%- endif %}"
)


def tojson(x):
    """transformers' tojson filter: no HTML escaping, non-ASCII kept."""
    return json.dumps(x, ensure_ascii=False)


def call_block(name, arguments):
    """One <tool_call> block (arguments: dict, or a JSON string kept verbatim)."""
    args = arguments if isinstance(arguments, str) else tojson(arguments)
    return '<tool_call>\n{"name": ' + tojson(name) + ', "arguments": ' + args + '}\n</tool_call>'


def render(messages, tools=None, add_generation_prompt=False, enable_thinking=None):
    """Python twin of CHAT_TEMPLATE (enable_thinking None = undefined)."""
    out = []
    if tools:
        out.append('<|im_start|>system\n')
        if messages and messages[0]['role'] == 'system' and isinstance(messages[0].get('content'), str):
            out.append(messages[0]['content'] + '\n\n')
        out.append(TOOLS_INTRO)
        for t in tools:
            out.append('\n' + tojson(t))
        out.append(TOOLS_OUTRO + '<|im_end|>\n')
    for i, m in enumerate(messages):
        content = m.get('content') if isinstance(m.get('content'), str) else ''
        role = m['role']
        if role == 'system' and tools and i == 0:
            continue
        if role == 'tool':
            if i == 0 or messages[i - 1]['role'] != 'tool':
                out.append('<|im_start|>user')
            out.append('\n<tool_response>\n' + content + '\n</tool_response>')
            if i == len(messages) - 1 or messages[i + 1]['role'] != 'tool':
                out.append('<|im_end|>\n')
        elif role == 'assistant':
            if '</think>' in content:
                content = content.split('</think>')[-1].lstrip('\n')
            out.append('<|im_start|>assistant\n' + content)
            for j, c in enumerate(m.get('tool_calls') or []):
                fn = c.get('function', c)
                if content or j > 0:
                    out.append('\n')
                out.append(call_block(fn['name'], fn['arguments']))
            out.append('<|im_end|>\n')
        else:
            out.append('<|im_start|>' + role + '\n' + content + '<|im_end|>\n')
    if add_generation_prompt:
        out.append('<|im_start|>assistant\n')
        if enable_thinking is False:
            out.append('<think>\n\n</think>\n\n')
    return ''.join(out)
