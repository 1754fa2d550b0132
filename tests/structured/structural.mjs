// Structural tags end to end on the demo model through the official `openai`
// client: free text in which a trigger starts a tagged segment (begin, a
// JSON Schema / regex / constant content, end), then free text again. Every
// output is checked by an independent reading of the text: each trigger
// occurrence outside a segment must start a segment whose content validates
// (ajv, JS RegExp, the constant) and ends with its end; the first form
// (structures + triggers), xgrammar's triggered_tags (at_least_one,
// stop_after_first) and tag, as response_format and as
// structured_outputs.structural_tag (object and JSON text). Greedy outputs
// are the same on a server that speculates with the draft model (rollback
// across a segment's end), streamed equals non-streamed, and malformed tags
// are 400s naming the field.
import path from 'node:path';
import { createRequire } from 'node:module';
import { startServer, check, summary, ROOT } from '../server/lib.mjs';

const require = createRequire(path.join(ROOT, 'tests/oracle/package.json'));
const OpenAI = require('openai').default ?? require('openai');
const Ajv = require('ajv/dist/2020').default ?? require('ajv/dist/2020');
const ajv = new Ajv({ strict: false });

const NUM = { type: 'object', properties: { n: { type: 'integer', minimum: 0, maximum: 99 } }, required: ['n'], additionalProperties: false };
const WORD = { enum: ['cat', 'dog', 'bird'] };

// content -> a checker of the text between begin and end
function contentCheck(c) {
  if (c.type === 'json_schema') {
    const v = ajv.compile(c.json_schema);
    return (t) => { try { return v(JSON.parse(t)); } catch { return false; } };
  }
  if (c.type === 'const_string') return (t) => t === c.value;
  if (c.type === 'regex') { const re = new RegExp('^(?:' + c.pattern + ')$', 'u'); return (t) => re.test(t); }
  throw new Error('no checker for ' + c.type);
}

// A tag object -> {triggers, tags: [{begin, end, ok}], free, once, atLeastOne}
function readTag(tag) {
  if (tag.structures) {
    return {
      triggers: tag.triggers, free: true, once: false, atLeastOne: false,
      tags: tag.structures.map((s) => ({ begin: s.begin, end: s.end, ok: contentCheck({ type: 'json_schema', json_schema: s.schema }) })),
    };
  }
  const f = tag.format;
  if (f.type === 'tag') return { triggers: [], free: false, tags: [{ begin: f.begin, end: f.end, ok: contentCheck(f.content) }] };
  return {
    triggers: f.triggers, free: true, once: !!f.stop_after_first, atLeastOne: !!f.at_least_one,
    tags: f.tags.map((t) => ({ begin: t.begin, end: t.end, ok: contentCheck(t.content) })),
  };
}

// Reads text as the tag allows; returns {ok, segments, why}. A text cut by
// max_tokens (complete = false) may end inside a segment.
function validate(tagObj, text, complete) {
  const T = readTag(tagObj);
  let pos = 0, segments = 0;
  const segmentAt = (at) => {
    for (const tg of T.tags) {
      if (!text.startsWith(tg.begin, at)) continue;
      const from = at + tg.begin.length;
      // the first end after a valid content (no end: the shortest valid content)
      for (let e = text.indexOf(tg.end, from); e >= 0 && e <= text.length; e = tg.end.length ? text.indexOf(tg.end, e + 1) : e + 1) {
        if (tg.ok(text.slice(from, e))) return e + tg.end.length;
      }
    }
    return -1;
  };
  if (!T.free) {
    const end = segmentAt(0);
    return end === text.length ? { ok: true, segments: 1 } : { ok: !complete, segments: 0, why: 'not one tag' };
  }
  for (;;) {
    let next = -1;
    for (const tr of T.triggers) {
      const i = text.indexOf(tr, pos);
      if (i >= 0 && (next < 0 || i < next)) next = i;
    }
    if (next < 0) break;
    const end = segmentAt(next);
    if (end < 0) return complete ? { ok: false, segments, why: `trigger at ${next} starts no valid tag` } : { ok: true, segments };
    segments++;
    pos = end;
    if (T.once) {
      if (pos !== text.length && complete) return { ok: false, segments, why: 'text after stop_after_first' };
      break;
    }
  }
  if (complete && T.atLeastOne && segments === 0) return { ok: false, segments, why: 'no tag with at_least_one' };
  return { ok: true, segments };
}

const TAGS = [
  { type: 'structural_tag', structures: [{ begin: 'Tern<', schema: NUM, end: '>' }], triggers: ['Tern'] },
  { type: 'structural_tag', structures: [{ begin: 'a <', schema: WORD, end: '>' }, { begin: 'a [', schema: NUM, end: ']' }], triggers: ['a '] },
  { type: 'structural_tag', format: { type: 'triggered_tags', triggers: ['I '], tags: [{ begin: 'I <', content: { type: 'regex', pattern: '[a-z]{2,6}' }, end: '>' }] } },
  { type: 'structural_tag', format: { type: 'triggered_tags', triggers: ['the ', 'The '], tags: [{ begin: 'the ', content: { type: 'const_string', value: 'tern' }, end: '' }, { begin: 'The ', content: { type: 'json_schema', json_schema: WORD }, end: '!' }] } },
  { type: 'structural_tag', format: { type: 'triggered_tags', triggers: ['a '], stop_after_first: true, tags: [{ begin: 'a ', content: { type: 'json_schema', json_schema: NUM }, end: '.' }] } },
  { type: 'structural_tag', format: { type: 'triggered_tags', triggers: ['<n>'], at_least_one: true, tags: [{ begin: '<n>', content: { type: 'json_schema', json_schema: NUM }, end: '</n>' }] } },
  { type: 'structural_tag', format: { type: 'triggered_tags', triggers: [' a'], tags: [{ begin: ' a ', content: { type: 'regex', pattern: '[a-z]{1,8}' }, end: ' ' }] } },
  { type: 'structural_tag', format: { type: 'tag', begin: '<answer>', content: { type: 'json_schema', json_schema: NUM }, end: '</answer>' } },
  { type: 'structural_tag', format: { type: 'tag', begin: 'Code: ', content: { type: 'regex', pattern: '[0-9]{3}-[A-Z]{2}' }, end: '' } },
];
const PROMPTS = ['Hello! Who are you?', 'Tell me a short story about a cat.', 'Write a sentence about the sea.',
  'What can you do?', 'Continue: The old lighthouse'];

// The request forms one tag can travel in.
function bodyFor(tag, form) {
  if (form === 0) return { response_format: tag };
  if (form === 1) return { structured_outputs: { structural_tag: tag } };
  return { structured_outputs: { structural_tag: JSON.stringify(tag) } };
}

const srv = await startServer(['--max-batch', '32']);
const draftSrv = await startServer(['--draft-model', path.join(ROOT, 'models', 'tern-demo-draft'), '--num-draft-tokens', '6']);
const clients = [srv, draftSrv].map((s) => new OpenAI({ baseURL: s.url + '/v1', apiKey: 'none', maxRetries: 0 }));

async function ask(client, tag, prompt, i, extra = {}) {
  return client.chat.completions.create({
    model: 'tern-demo', messages: [{ role: 'user', content: prompt }], temperature: 0, max_tokens: 96,
    chat_template_kwargs: { enable_thinking: i % 4 === 3 }, ...bodyFor(tag, i % 3), ...extra,
  });
}

try {
  let n = 0, segs = 0, complete = 0, multi = 0;
  const jobs = [];
  for (let t = 0; t < TAGS.length; t++) {
    for (let p = 0; p < PROMPTS.length; p++) {
      const i = t * PROMPTS.length + p;
      jobs.push((async () => {
        const [a, b] = await Promise.all(clients.map((c) => ask(c, TAGS[t], PROMPTS[p], i)));
        const text = a.choices[0].message.content ?? '';
        const done = a.choices[0].finish_reason === 'stop';
        const r = validate(TAGS[t], text, done);
        n++;
        segs += r.segments;
        multi += r.segments >= 2;
        complete += done;
        check(r.ok, `tag ${t} prompt ${p}: valid`, { why: r.why, text });
        check(b.choices[0].message.content === text, `tag ${t} prompt ${p}: same output while speculating`,
          { plain: text, spec: b.choices[0].message.content });
      })());
    }
  }
  await Promise.all(jobs);
  console.log(`${n} structural outputs, ${complete} ended by the model, ${segs} tags in them, ${multi} with several`);
  check(segs >= 6, 'the triggers really started tags', segs);
  check(multi >= 1, 'free text goes on after a tag: some answer holds two tags or more', multi);

  // stop_after_first ends the answer with the tag; at_least_one never ends without one
  const once = await ask(clients[0], TAGS[4], PROMPTS[0], 0);
  const ot = once.choices[0].message.content;
  check(once.choices[0].finish_reason === 'stop' && /\.$/.test(ot) && validate(TAGS[4], ot, true).segments === 1,
    'stop_after_first: the answer ends after its one tag', ot);

  // streamed = non-streamed
  const stream = await clients[0].chat.completions.create({
    model: 'tern-demo', messages: [{ role: 'user', content: PROMPTS[1] }], temperature: 0, max_tokens: 96,
    chat_template_kwargs: { enable_thinking: false }, response_format: TAGS[1], stream: true,
  });
  let streamed = '';
  for await (const ch of stream) streamed += ch.choices[0]?.delta?.content ?? '';
  const whole = await clients[0].chat.completions.create({
    model: 'tern-demo', messages: [{ role: 'user', content: PROMPTS[1] }], temperature: 0, max_tokens: 96,
    chat_template_kwargs: { enable_thinking: false }, response_format: TAGS[1],
  });
  check(streamed === whole.choices[0].message.content, 'streamed equals non-streamed', { streamed, whole: whole.choices[0].message.content });

  // sampled: still valid
  for (let i = 0; i < 16; i++) {
    const t = TAGS[i % TAGS.length];
    const r = await ask(clients[0], t, PROMPTS[i % PROMPTS.length], i, { temperature: 1.0, seed: i });
    const text = r.choices[0].message.content ?? '';
    const v = validate(t, text, r.choices[0].finish_reason === 'stop');
    check(v.ok, `sampled ${i}: valid`, { why: v.why, text });
  }

  // malformed tags: 400 naming the field
  const BAD = [
    [{ type: 'structural_tag', structures: [{ begin: 'x', schema: NUM, end: '>' }], triggers: ['y'] }, 'response_format.structures[0].begin'],
    [{ type: 'structural_tag', structures: [], triggers: ['y'] }, 'response_format.structures'],
    [{ type: 'structural_tag', structures: [{ begin: 'y', schema: NUM, end: '>' }], triggers: [] }, 'response_format.triggers'],
    [{ type: 'structural_tag', structures: [{ begin: 'y', schema: NUM, end: '>', extra: 1 }], triggers: ['y'] }, 'response_format.structures[0].extra'],
    [{ type: 'structural_tag', format: { type: 'sequence', elements: [] } }, 'response_format.format.type'],
    [{ type: 'structural_tag', format: { type: 'triggered_tags', triggers: ['a'], tags: [{ begin: 'a', content: { type: 'any_text' }, end: '' }] } }, 'response_format.format.tags[0].content.type'],
    [{ type: 'structural_tag', format: { type: 'tag', begin: 'a', content: { type: 'regex', pattern: '(' }, end: '' } }, 'response_format.format.content'],
    [{ type: 'structural_tag', format: { type: 'tag', begin: 'a', content: { type: 'json_schema', json_schema: { type: 'object', properties: { x: { type: 'nonsense' } } } }, end: '' } }, 'response_format.format.content'],
    [{ type: 'structural_tag', format: { type: 'triggered_tags', triggers: ['a'], tags: [{ begin: 'a', content: { type: 'const_string', value: 'b' }, end: '' }], at_least_one: 'yes' } }, 'response_format.format.at_least_one'],
  ];
  for (const [tag, param] of BAD) {
    const r = await fetch(srv.url + '/v1/chat/completions', {
      method: 'POST', headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ messages: [{ role: 'user', content: 'hi' }], max_tokens: 4, response_format: tag }),
    });
    const j = await r.json();
    check(r.status === 400 && j.error?.param === param, `bad tag -> 400 naming ${param}`, { status: r.status, error: j.error });
  }
  const badJson = await fetch(srv.url + '/v1/chat/completions', {
    method: 'POST', headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ messages: [{ role: 'user', content: 'hi' }], structured_outputs: { structural_tag: '{"type": ' } }),
  });
  check(badJson.status === 400 && (await badJson.json()).error?.param === 'structured_outputs.structural_tag', 'structural_tag text that is not JSON -> 400');
  const withTools = await fetch(srv.url + '/v1/chat/completions', {
    method: 'POST', headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ messages: [{ role: 'user', content: 'hi' }], response_format: TAGS[0],
      tools: [{ type: 'function', function: { name: 'f', parameters: { type: 'object' } } }] }),
  });
  check(withTools.status === 400, 'a structural tag with tools -> 400', withTools.status);
} finally {
  await srv.stop();
  await draftSrv.stop();
}
process.exit(summary('structural tags'));
