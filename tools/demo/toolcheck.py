"""Checks of generated tool calls (no third-party packages).

parse_calls() reads an assistant output in the Hermes/Qwen3 layout the demo
template teaches (optional think block, then <tool_call> blocks holding
{"name": ..., "arguments": {...}}); validate() checks a value against the
subset of JSON Schema the demo tools use (type, properties, required, enum,
minimum, maximum, items, additionalProperties).
"""
import json
import re

BLOCK = re.compile(r'<tool_call>\s*(.*?)\s*</tool_call>', re.S)


def strip_think(text):
    if '</think>' in text:
        text = text.split('</think>', 1)[1]
    return text.strip()


def parse_calls(text):
    """Returns (calls, problems): calls = [{'name', 'arguments'}] of the blocks
    that parse; problems lists what was wrong (empty when all is well)."""
    body = strip_think(text.replace('<|im_end|>', ''))
    calls, problems = [], []
    blocks = BLOCK.findall(body)
    if '<tool_call>' in body and body.count('<tool_call>') != len(blocks):
        problems.append('unterminated <tool_call>')
    rest = BLOCK.sub('', body).strip()
    if blocks and rest:
        problems.append('text outside the call blocks')
    for b in blocks:
        try:
            obj = json.loads(b)
        except ValueError:
            problems.append('call is not JSON')
            continue
        if not isinstance(obj, dict) or not isinstance(obj.get('name'), str) \
                or not isinstance(obj.get('arguments'), dict) or set(obj) != {'name', 'arguments'}:
            problems.append('call is not {"name", "arguments"}')
            continue
        calls.append(obj)
    return calls, problems


def _type_ok(t, v):
    if t == 'object':
        return isinstance(v, dict)
    if t == 'array':
        return isinstance(v, list)
    if t == 'string':
        return isinstance(v, str)
    if t == 'boolean':
        return isinstance(v, bool)
    if t == 'integer':
        return isinstance(v, int) and not isinstance(v, bool)
    if t == 'number':
        return isinstance(v, (int, float)) and not isinstance(v, bool)
    if t == 'null':
        return v is None
    raise ValueError('schema type %r not supported' % t)


def validate(schema, v, path='$'):
    """Returns a list of error strings (empty: valid)."""
    errs = []
    t = schema.get('type')
    if t is not None:
        ts = t if isinstance(t, list) else [t]
        if not any(_type_ok(x, v) for x in ts):
            return ['%s: not of type %s' % (path, t)]
    if 'enum' in schema and v not in schema['enum']:
        errs.append('%s: not in enum' % path)
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        if 'minimum' in schema and v < schema['minimum']:
            errs.append('%s: below minimum' % path)
        if 'maximum' in schema and v > schema['maximum']:
            errs.append('%s: above maximum' % path)
    if isinstance(v, dict):
        props = schema.get('properties', {})
        for r in schema.get('required', []):
            if r not in v:
                errs.append('%s: missing %s' % (path, r))
        for k, x in v.items():
            if k in props:
                errs += validate(props[k], x, path + '.' + k)
            elif schema.get('additionalProperties') is False:
                errs.append('%s: unknown property %s' % (path, k))
    if isinstance(v, list) and 'items' in schema:
        for i, x in enumerate(v):
            errs += validate(schema['items'], x, '%s[%d]' % (path, i))
    return errs


def check_calls(text, tools, want):
    """Scores one output against the expected calls (want: list of
    {'name', 'arguments'}, or None when no call is expected)."""
    calls, problems = parse_calls(text)
    r = {}
    if want is None:
        r['no_call'] = '<tool_call>' not in text
        return r
    by_name = {t['function']['name']: t['function'] for t in tools}
    r['parsed'] = not problems and len(calls) > 0
    r['valid'] = r['parsed'] and all(c['name'] in by_name and not validate(
        by_name[c['name']].get('parameters', {}), c['arguments']) for c in calls)
    r['right_names'] = r['parsed'] and [c['name'] for c in calls] == [w['name'] for w in want]
    r['exact_arguments'] = r['right_names'] and all(c['arguments'] == w['arguments'] for c, w in zip(calls, want))
    return r
