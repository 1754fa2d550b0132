#!/usr/bin/env python3
"""Synthetic function-calling conversations for models/tern-demo.

Input: the corpus JSON lines of the demo recipe (prepare_corpus.py, see
README.md); the train/held-out split of documents is the recipe's (same hash,
same 3%). Output: xz-compressed JSON lines in the recipe's chat record
format, one record per assistant turn that is trained:
  {"k": "c", "v": 0|1, "task": T, "mode": M, "p": PROMPT, "c": COMPLETION}
PROMPT is the chat-template rendering (chat_format_tools.render) up to the
point where the assistant writes; COMPLETION is what it writes (the trainer
appends <|im_end|>). Held-out records also carry "tools" (the request's tool
list), "want" (the expected calls [{"name", "arguments"}], or null when the
turn is a plain answer) and "step" (0 for the first assistant turn).

Conversation kinds (task names):
  tool_call    user asks -> one call (two parallel calls for two cities or
               two texts) -> tool response -> answer that uses the result
  tool_chain   call A -> response -> call B built from A's result ->
               response -> answer (what a client's tool loop runs)
  tool_named   a tool with a made-up name and parameter, asked for by name
               (teaches copying names from the tool list)
  tool_none    tools are offered but the request is an ordinary task of the
               recipe (json, choice, repeat, hello, continue) -> plain answer
Modes as in the recipe: think (50%: every assistant turn opens with a one
sentence think block), nothink (35%: prompts end with the empty think
block), plain (15%).

Usage: make_tool_data.py --docs docs.jsonl --recipe RECIPE_DIR --out tools.jsonl.xz
"""
import argparse
import copy
import json
import lzma
import os
import random
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from chat_format_tools import render  # noqa: E402


def fn(name, desc, props, required):
    return {'type': 'function', 'function': {'name': name, 'description': desc, 'parameters': {
        'type': 'object', 'properties': props, 'required': required}}}


TEXT = {'type': 'string', 'description': 'The text.'}
SOURCES = ['novel', 'bible', 'speech', 'docs', 'any']
TOOLS = {
    'count_words': fn('count_words', 'Count the words in a text.', {'text': TEXT}, ['text']),
    'count_chars': fn('count_chars', 'Count the characters in a text.', {'text': TEXT}, ['text']),
    'first_word': fn('first_word', 'Return the first word of a text.', {'text': TEXT}, ['text']),
    'last_word': fn('last_word', 'Return the last word of a text.', {'text': TEXT}, ['text']),
    'to_upper': fn('to_upper', 'Convert a text to upper case.', {'text': TEXT}, ['text']),
    'lookup': fn('lookup', 'Find a sentence that uses a word.', {
        'word': {'type': 'string', 'description': 'The word to look up.'},
        'source': {'type': 'string', 'enum': SOURCES}}, ['word']),
    'get_weather': fn('get_weather', 'Get the current weather in a city.', {
        'city': {'type': 'string', 'description': 'The city name.'},
        'unit': {'type': 'string', 'enum': ['celsius', 'fahrenheit']}}, ['city']),
    'add': fn('add', 'Add two numbers.', {'a': {'type': 'number'}, 'b': {'type': 'number'}}, ['a', 'b']),
    'search': fn('search', 'Search the documents for a query.', {
        'query': {'type': 'string'},
        'limit': {'type': 'integer', 'minimum': 1, 'maximum': 5}}, ['query']),
}
SRC_OF = {'austen': 'novel', 'moby-dick': 'novel', 'kjv': 'bible', 'sotu': 'speech', 'python-doc': 'docs',
          'debian-reference': 'docs', 'debian-handbook': 'docs', 'jargon': 'docs', 'fortunes': 'any'}
CITIES = ['Paris', 'London', 'Berlin', 'Rome', 'Madrid', 'Oslo', 'Vienna', 'Prague', 'Lisbon', 'Dublin', 'Boston',
          'Chicago', 'Denver', 'Seattle', 'Tokyo', 'Cairo', 'Lima', 'Sydney', 'Toronto', 'Zurich', 'Athens',
          'Warsaw', 'Helsinki', 'Munich', 'Nairobi', 'Santiago', 'Mumbai', 'Seoul', 'Bergen', 'Porto',
          'New York', 'San Francisco', 'Buenos Aires', 'Cape Town', 'Mexico City', 'Hong Kong']
CONDITIONS = ['sunny', 'cloudy', 'rainy', 'windy', 'foggy', 'snowy', 'clear']
VERBS = ['get', 'find', 'check', 'make', 'show', 'read', 'send', 'save', 'list', 'open']
PARAMS = ['text', 'query', 'name', 'value', 'item', 'topic', 'title']


def tool_set(rng, needed, k_extra=None):
    """The needed tools plus 0-3 others (fewer when texts are long), shuffled."""
    names = list(dict.fromkeys(needed))
    others = [n for n in TOOLS if n not in names]
    k = rng.choice([0, 1, 1, 2, 2, 3]) if k_extra is None else k_extra
    names += rng.sample(others, k)
    rng.shuffle(names)
    return [copy.deepcopy(TOOLS[n]) for n in names]


def call(name, args):
    return {'name': name, 'arguments': args}


def msg_calls(calls, rng):
    return {'role': 'assistant', 'content': '', 'tool_calls': [
        {'id': 'call_%08x' % rng.getrandbits(32), 'type': 'function',
         'function': {'name': c['name'], 'arguments': json.dumps(c['arguments'], ensure_ascii=False)}}
        for c in calls]}


def call_text(calls):
    return '\n'.join('<tool_call>\n' + json.dumps({'name': c['name'], 'arguments': c['arguments']},
                                                    ensure_ascii=False) + '\n</tool_call>' for c in calls)


# ------------------------------------------------------------ one-call tasks
# each returns (tool names, user text, [steps]); a step is (calls or None,
# reason, results or final answer text)

def q_text_tool(rng, s, W):
    w = W.words_of(s)
    name = rng.choice(['count_words', 'count_words', 'count_chars', 'first_word', 'last_word', 'to_upper'])
    ask = {
        'count_words': ['How many words are in this text? ', 'Count the words: ', 'Use a tool to count the words in: ',
                        'Count the words in this sentence: '],
        'count_chars': ['How many characters does this text have? ', 'Count the characters: ',
                        'Count the characters in this sentence: '],
        'first_word': ['What is the first word of this text? ', 'Give me the first word: ',
                       'Find the first word of: '],
        'last_word': ['What is the last word of this text? ', 'Give me the last word: ', 'Find the last word of: '],
        'to_upper': ['Convert this text to upper case: ', 'Make this upper case: ', 'Shout this: '],
    }[name]
    user = rng.choice(ask) + s
    if name == 'count_words':
        res, ans = {'words': len(s.split())}, 'The text has %d words.' % len(s.split())
    elif name == 'count_chars':
        res, ans = {'chars': len(s)}, 'The text has %d characters.' % len(s)
    elif name == 'first_word':
        res, ans = {'first_word': w[0]}, 'The first word is "%s".' % w[0]
    elif name == 'last_word':
        res, ans = {'last_word': w[-1]}, 'The last word is "%s".' % w[-1]
    else:
        res, ans = {'text': s.upper()}, s.upper()
    why = {'count_words': 'count the words', 'count_chars': 'count the characters',
           'first_word': 'know the first word', 'last_word': 'know the last word',
           'to_upper': 'convert the text to upper case'}[name]
    return [name], user, [([call(name, {'text': s})], 'The user wants to %s, so I will call %s.' % (why, name), [res]),
                          (None, 'The tool answered, so I will report the result.', ans)]


def q_weather(rng, W):
    tools = ['get_weather']
    if rng.random() < 0.3:
        c1, c2 = rng.sample(CITIES, 2)
        user = rng.choice(['What is the weather in %s and in %s?', 'Compare the weather in %s and %s.',
                           'How is the weather in %s and %s today?']) % (c1, c2)
        calls = [call('get_weather', {'city': c1}), call('get_weather', {'city': c2})]
        unit = 'celsius'
    else:
        c1 = rng.choice(CITIES)
        unit = rng.choice(['celsius', 'fahrenheit', None])
        if unit is None:
            user = rng.choice(['What is the weather in %s?', 'Is it cold in %s today?', 'Weather in %s, please.',
                               'How warm is it in %s?']) % c1
            calls = [call('get_weather', {'city': c1})]
            unit = 'celsius'
        else:
            user = rng.choice(['What is the weather in %s in %s?', 'Tell me the temperature in %s in %s.',
                               'Weather in %s, in %s please.']) % (c1, unit)
            calls = [call('get_weather', {'city': c1, 'unit': unit})]
    results, parts = [], []
    for c in calls:
        t = rng.randint(-10, 35) if unit == 'celsius' else rng.randint(14, 95)
        cond = rng.choice(CONDITIONS)
        results.append({'city': c['arguments']['city'], 'temperature': t, 'unit': unit, 'condition': cond})
        parts.append('%d degrees %s and %s in %s' % (t, unit.capitalize(), cond, c['arguments']['city']))
    ans = 'It is ' + ' and '.join(parts) + '.'
    reason = ('The user asks about two cities, so I will call get_weather twice.' if len(calls) == 2 else
              'The user asks about the weather in %s, so I will call get_weather.' % c1)
    return tools, user, [(calls, reason, results), (None, 'I have the weather now.', ans)]


def q_add(rng, W):
    a = rng.choice([rng.randint(0, 99), rng.randint(100, 9999), round(rng.uniform(0, 100), 1)])
    b = rng.choice([rng.randint(0, 99), rng.randint(1, 999), round(rng.uniform(0, 50), 2)])
    user = rng.choice(['What is %s plus %s?', 'Add %s and %s.', 'What is the sum of %s and %s?',
                       'Compute %s + %s.']) % (a, b)
    r = round(a + b, 4)
    r = int(r) if float(r).is_integer() and isinstance(a, int) and isinstance(b, int) else r
    return ['add'], user, [([call('add', {'a': a, 'b': b})], 'I will call add with %s and %s.' % (a, b),
                            [{'result': r}]),
                           (None, 'The tool returned the sum.', 'The sum is %s.' % r)]


def q_lookup(rng, s, src, W):
    cand = [x for x in W.words_of(s) if len(x) >= 5 and x.isalpha()]
    if not cand:
        return None
    word = rng.choice(cand).lower()
    args = {'word': word}
    if rng.random() < 0.4:
        args['source'] = SRC_OF.get(src, 'any')
        user = rng.choice(['Look up the word "%s" in the %s texts.', 'Find a sentence with "%s" from the %s texts.']) % (
            word, args['source'])
    else:
        user = rng.choice(['Find a sentence that uses the word "%s".', 'Look up the word "%s".',
                           'Show me "%s" used in a sentence.']) % word
    return ['lookup'], user, [([call('lookup', args)], 'I will look up "%s" with the lookup tool.' % word,
                               [{'word': word, 'sentence': s}]),
                              (None, 'The tool found a sentence.', 'Here is a sentence with "%s": %s' % (word, s))]


def q_search(rng, s, W, pool):
    cand = [x for x in W.words_of(s) if len(x) >= 5 and x.isalpha()]
    if not cand:
        return None
    q = rng.choice(cand).lower()
    args = {'query': q}
    n = 1
    if rng.random() < 0.4:
        n = rng.randint(1, 3)
        args['limit'] = n
        user = 'Search for "%s" and show %d result%s.' % (q, n, 's' if n > 1 else '')
    else:
        user = rng.choice(['Search the documents for "%s".', 'Search for "%s".', 'Find passages about "%s".']) % q
    found = [s] + [x for x in (rng.choice(pool) for _ in range(n - 1))]
    return ['search'], user, [([call('search', args)], 'I will search for "%s".' % q, [{'results': found}]),
                              (None, 'The search returned %d result%s.' % (len(found), 's' if len(found) > 1 else ''),
                               'I found: ' + ' '.join(found))]


def q_two_texts(rng, s1, s2, W):
    user = rng.choice(['Count the words in these two texts. First: %s Second: %s',
                       'How many words does each text have? 1: %s 2: %s']) % (s1, s2)
    n1, n2 = len(s1.split()), len(s2.split())
    return ['count_words'], user, [
        ([call('count_words', {'text': s1}), call('count_words', {'text': s2})],
         'There are two texts, so I will call count_words twice.', [{'words': n1}, {'words': n2}]),
        (None, 'I have both counts.', 'The first text has %d words and the second has %d.' % (n1, n2))]


# ------------------------------------------------------------ chains

def q_chain(rng, s, src, W):
    k = rng.random()
    w = W.words_of(s)
    if k < 0.4:
        b = rng.randint(1, 20)
        n = len(s.split())
        user = rng.choice(['Count the words in this text and add %d to the count: %s',
                           'Take the number of words in this text plus %d: %s']) % (b, s)
        return ['count_words', 'add'], user, [
            ([call('count_words', {'text': s})], 'First I need the word count, so I will call count_words.',
             [{'words': n}]),
            ([call('add', {'a': n, 'b': b})], 'The text has %d words; now I will add %d with the add tool.' % (n, b),
             [{'result': n + b}]),
            (None, 'The tools gave me the answer.', 'The result is %d.' % (n + b))]
    cand = [x for x in w if len(x) >= 5 and x.isalpha()]
    if not cand:
        return None
    word = rng.choice(cand).lower()
    second = rng.choice(['count_words', 'first_word', 'to_upper'])
    what = {'count_words': 'count its words', 'first_word': 'tell me its first word',
            'to_upper': 'convert it to upper case'}[second]
    user = rng.choice(['Find a sentence with the word "%s" and %s.', 'Look up "%s", then %s.']) % (word, what)
    if second == 'count_words':
        res, ans = {'words': len(s.split())}, 'The sentence "%s" has %d words.' % (s, len(s.split()))
    elif second == 'first_word':
        res, ans = {'first_word': w[0]}, 'The first word of the sentence is "%s".' % w[0]
    else:
        res, ans = {'text': s.upper()}, s.upper()
    return ['lookup', second], user, [
        ([call('lookup', {'word': word})], 'First I will look up "%s".' % word, [{'word': word, 'sentence': s}]),
        ([call(second, {'text': s})], 'I have the sentence; now I will call %s on it.' % second, [res]),
        (None, 'The tools gave me the answer.', ans)]


def q_named(rng, s, W, vocab):
    noun = rng.choice(vocab).lower()
    name = '%s_%s' % (rng.choice(VERBS), noun)
    param = rng.choice(PARAMS)
    tool = fn(name, 'The %s tool.' % noun.capitalize(), {param: {'type': 'string'}}, [param])
    val = s if rng.random() < 0.5 else ' '.join(s.split()[:rng.randint(1, 4)]).strip('.,;:!?')
    user = rng.choice(['Call %s with %s "%s".', 'Use %s on this %s: %s', 'Run the %s tool with %s: %s']) % (
        name, param, val)
    out = rng.choice(['done', 'ok', 'saved', 'sent'])
    return [tool], user, [([call(name, {param: val})], 'The user asks for the %s tool.' % name,
                           [{'status': out}]),
                          (None, 'The tool finished.', 'Done: %s returned "%s".' % (name, out))]


# ------------------------------------------------------------ assembly

def conversation(rng, W, system, tools, user, steps):
    """Records for every assistant turn of one conversation."""
    msgs = [{'role': 'system', 'content': system}] if system else []
    msgs.append({'role': 'user', 'content': user})
    m = rng.random()
    mode = 'think' if m < 0.5 else ('nothink' if m < 0.85 else 'plain')
    recs = []
    for i, (calls, reason, outcome) in enumerate(steps):
        prompt = render(msgs, tools, add_generation_prompt=True,
                        enable_thinking=(False if mode == 'nothink' else (True if mode == 'think' else None)))
        body = call_text(calls) if calls else outcome
        comp = ('<think>\n%s\n</think>\n\n' % reason if mode == 'think' else '') + body
        recs.append(dict(p=prompt, c=comp, mode=mode, step=i, want=calls))
        if calls:
            msgs.append(msg_calls(calls, rng))
            for c, r in zip(calls, outcome):
                msgs.append({'role': 'tool', 'content': json.dumps(r, ensure_ascii=False)})
    return recs


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument('--docs', required=True)
    ap.add_argument('--recipe', required=True, help='folder of the recipe scripts (make_data.py)')
    ap.add_argument('--out', required=True)
    ap.add_argument('--conversations', type=int, default=30000, help='train conversations (held out: 3%%)')
    ap.add_argument('--seed', type=int, default=4321)
    a = ap.parse_args()
    sys.path.insert(0, a.recipe)
    import make_data as W  # the recipe's sentence helpers and ordinary tasks
    rng = random.Random(a.seed)
    pools = {0: [], 1: []}
    for line in open(a.docs, encoding='utf-8'):
        d = json.loads(line)
        v = W.split_of(d['src'], d['id'], 3.0)
        for par in W.sentences_of(d['src'], d['text']):
            pools[v].append((d['src'], par))
    out, stats = [], {}
    for v in (0, 1):
        single = [(src, s) for src, par in pools[v] for s in par if W.clean_sentence(s, 25, 160)]
        cont = [(src, par, i) for src, par in pools[v] for i in range(len(par) - 1)
                if W.clean_sentence(par[i], 25, 200)]
        vocab = [w for _, s in single[:20000] for w in W.words_of(s) if w.isalpha() and 4 <= len(w) <= 9]
        sents = [s for _, s in single]
        n_conv = a.conversations if v == 0 else max(200, a.conversations * 3 // 100)
        made = 0
        while made < n_conv:
            src, s = rng.choice(single)
            r = rng.random()
            q = None
            if r < 0.24:
                task, q = 'tool_call', q_text_tool(rng, s, W)
            elif r < 0.36:
                task, q = 'tool_call', q_weather(rng, W)
            elif r < 0.43:
                task, q = 'tool_call', q_add(rng, W)
            elif r < 0.50:
                task, q = 'tool_call', q_lookup(rng, s, src, W)
            elif r < 0.55:
                task, q = 'tool_call', q_search(rng, s, W, sents)
            elif r < 0.58:
                task, q = 'tool_call', q_two_texts(rng, s, rng.choice(sents), W)
            elif r < 0.72:
                task, q = 'tool_chain', q_chain(rng, s, src, W)
            elif r < 0.82:
                task, q = 'tool_named', q_named(rng, s, W, vocab)
            else:
                task = 'tool_none'
                k = rng.random()
                if k < 0.3:
                    sub = 'json'
                    t = W.t_json(rng, s)
                elif k < 0.55:
                    sub = 'choice'
                    t = W.t_choice(rng, s, vocab)
                elif k < 0.7:
                    sub = 'repeat'
                    t = W.t_repeat(rng, s)
                elif k < 0.85:
                    sub = 'hello'
                    t = W.t_hello(rng)
                else:
                    sub = 'continue'
                    c = rng.choice(cont)
                    t = W.t_continue(rng, c[0], c[1], c[2])
                if t is None:
                    continue
                q = ([], t[0], [(None, t[2], t[1])])
            if q is None:
                continue
            needed, user, steps = q
            if needed and isinstance(needed[0], dict):  # a made-up tool
                tools = tool_set(rng, [], rng.choice([0, 1, 1, 2]))
                tools.insert(rng.randint(0, len(tools)), needed[0])
            elif task == 'tool_none':
                tools = tool_set(rng, [], rng.choice([1, 2, 2, 3]))
            else:
                tools = tool_set(rng, needed, 0 if len(user) > 200 else None)
            system = rng.choice(W.SYSTEM_PROMPTS) if rng.random() < 0.3 else None
            for rec in conversation(rng, W, system, tools, user, steps):
                r2 = {'k': 'c', 'v': v, 'task': task, 'mode': rec['mode'], 'p': rec['p'], 'c': rec['c']}
                if v == 1:
                    r2.update(tools=tools, want=rec['want'], step=rec['step'])
                out.append(r2)
                key = (v, task, rec['mode'])
                stats[key] = stats.get(key, 0) + 1
            made += 1
    for k in sorted(stats):
        print('split=%d task=%-10s mode=%-7s %6d' % (k + (stats[k],)), file=sys.stderr)
    rng.shuffle(out)
    with lzma.open(a.out, 'wt', encoding='utf-8', preset=6) as f:
        for r in out:
            f.write(json.dumps(r, ensure_ascii=False) + '\n')
    print('wrote %d records' % len(out), file=sys.stderr)


if __name__ == '__main__':
    main()
