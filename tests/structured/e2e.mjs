// Structured output end to end on the demo model through the official
// `openai` npm client: 200 requests mixing json_object, JSON Schemas
// (nested objects, arrays, enums, $ref, formats), EBNF, regex and choice
// through every request field, half of them concurrent with plain
// requests. Every completed output is checked by independent validators
// (ajv + ajv-formats, JS RegExp, the choice list); greedy output must be the
// same alone and in a batch of 16; errors (unsupported keyword, malformed
// grammar, pathological schema) are 400s naming the problem while the server
// stays responsive; thinking outputs hold a free think block, then JSON.
import path from 'node:path';
import { createRequire } from 'node:module';
import { startServer, check, summary, ROOT } from '../server/lib.mjs';

const require = createRequire(path.join(ROOT, 'tests/oracle/package.json'));
const OpenAI = require('openai').default ?? require('openai');
const Ajv = require('ajv/dist/2020').default ?? require('ajv/dist/2020');
const addFormats = require('ajv-formats').default ?? require('ajv-formats');

const ajv = new Ajv({ strict: false });
addFormats(ajv);

// ---- specs and their independent validators ----
const SCHEMAS = {
  nested: {
    type: 'object',
    properties: {
      name: { type: 'string', maxLength: 20 },
      address: {
        type: 'object',
        properties: { city: { type: 'string', maxLength: 16 }, zip: { type: 'string', pattern: '^[0-9]{5}$' } },
        required: ['city', 'zip'], additionalProperties: false,
      },
    },
    required: ['name', 'address'], additionalProperties: false,
  },
  arrays: {
    type: 'object',
    properties: {
      tags: { type: 'array', items: { type: 'string', maxLength: 8 }, minItems: 1, maxItems: 3 },
      scores: { type: 'array', items: { type: 'integer', minimum: 0, maximum: 100 }, maxItems: 4 },
    },
    required: ['tags', 'scores'], additionalProperties: false,
  },
  enums: {
    type: 'object',
    properties: {
      color: { enum: ['red', 'green', 'blue'] },
      size: { type: 'string', enum: ['S', 'M', 'L'] },
      ok: { type: 'boolean' },
    },
    required: ['color', 'size', 'ok'], additionalProperties: false,
  },
  refs: {
    $defs: {
      pt: { type: 'object', properties: { x: { type: 'integer', minimum: -99, maximum: 99 }, y: { type: 'integer', minimum: -99, maximum: 99 } }, required: ['x', 'y'], additionalProperties: false },
    },
    type: 'object',
    properties: { from: { $ref: '#/$defs/pt' }, to: { $ref: '#/$defs/pt' } },
    required: ['from', 'to'], additionalProperties: false,
  },
  formats: {
    type: 'object',
    properties: { when: { type: 'string', format: 'date' }, id: { type: 'string', format: 'uuid' } },
    required: ['when', 'id'], additionalProperties: false,
  },
  list: { type: 'array', items: { type: 'number', minimum: 0, maximum: 1000 }, minItems: 1, maxItems: 4 },
};
const VALIDATE = Object.fromEntries(Object.entries(SCHEMAS).map(([k, s]) => [k, ajv.compile(s)]));
const validateObject = ajv.compile({ type: 'object' });

const GRAMMARS = [
  { ebnf: 'root ::= "(" [0-9]+ ("+" [0-9]+)* ")"', re: /^\([0-9]+(\+[0-9]+)*\)$/ },
  { ebnf: 'root ::= greet " " name "!"\ngreet ::= "hello" | "goodbye"\nname ::= [a-z]{1,8}', re: /^(hello|goodbye) [a-z]{1,8}!$/ },
];
const REGEXES = ['[A-Z][a-z]{2,8} [0-9]{1,3}', '(yes|no|maybe)!?', '[0-9]{3}-[0-9]{4}', '[a-f0-9]{8}'];
const CHOICES = [['alpha', 'beta', 'gamma delta'], ['Paris', 'London', 'Tokyo']];

// A request body fragment + its validator (text -> true/false), built in
// rotation over every field form. i picks the variant.
function makeSpec(i) {
  const schemaNames = Object.keys(SCHEMAS);
  const sn = schemaNames[i % schemaNames.length];
  const schema = SCHEMAS[sn];
  const jsonCheck = (v) => (t) => { try { const o = JSON.parse(t); return v(o) ? true : ajv.errorsText(v.errors); } catch (e) { return 'not JSON: ' + e.message; } };
  const g = GRAMMARS[i % GRAMMARS.length], re = REGEXES[i % REGEXES.length], ch = CHOICES[i % CHOICES.length];
  const reCheck = (t) => new RegExp('^(?:' + re + ')$').test(t) || 'regex mismatch';
  const chCheck = (t) => ch.includes(t) || 'not a choice';
  const gCheck = (t) => g.re.test(t) || 'grammar mismatch';
  const forms = [
    () => ({ kind: 'schema:' + sn, body: { response_format: { type: 'json_schema', json_schema: { name: sn, schema, strict: true } } }, ok: jsonCheck(VALIDATE[sn]) }),
    () => ({ kind: 'guided_json:' + sn, body: { guided_json: schema }, ok: jsonCheck(VALIDATE[sn]) }),
    () => ({ kind: 'so-bare:' + sn, body: { structured_outputs: schema }, ok: jsonCheck(VALIDATE[sn]) }),
    () => ({ kind: 'so-json:' + sn, body: { structured_outputs: { json: JSON.stringify(schema) } }, ok: jsonCheck(VALIDATE[sn]) }),
    () => ({ kind: 'json_object', body: { response_format: { type: 'json_object' } }, ok: jsonCheck(validateObject) }),
    () => ({ kind: 'so-json_object', body: { structured_outputs: { json_object: true } }, ok: jsonCheck(validateObject) }),
    () => ({ kind: 'grammar', body: { guided_grammar: g.ebnf }, ok: gCheck }),
    () => ({ kind: 'so-grammar', body: { structured_outputs: { grammar: g.ebnf } }, ok: gCheck }),
    () => ({ kind: 'regex', body: { guided_regex: re }, ok: reCheck }),
    () => ({ kind: 'so-regex', body: { structured_outputs: { regex: re } }, ok: reCheck }),
    () => ({ kind: 'choice', body: { guided_choice: ch }, ok: chCheck }),
    () => ({ kind: 'so-choice', body: { structured_outputs: { choice: ch } }, ok: chCheck }),
    // compact whitespace
    () => ({ kind: 'schema-compact:' + sn, body: { response_format: { type: 'json_schema', json_schema: { name: sn, schema, any_whitespace: false } } }, ok: jsonCheck(VALIDATE[sn]) }),
  ];
  return forms[Math.floor(i / 1) % forms.length]();
}

const PROMPTS = ['Describe a person.', 'List a few numbers.', 'Pick a color and size.', 'Where are you going?',
  'Give me an answer.', 'What is the date?', 'Say something short.'];
const MAX_TOKENS = 160;

const srv = await startServer(['--max-batch', '128']);
const client = new OpenAI({ baseURL: srv.url + '/v1', apiKey: 'none', maxRetries: 0, timeout: 120000 });
const M = 'tern-demo';

// The answer of a chat message: the server splits the think block into
// reasoning_content, so content must hold no block; [text, hadThink] or null.
function stripThink(m) {
  if (m.content.includes('<think>') || m.content.includes('</think>')) return null;
  return [m.content, typeof m.reasoning_content === 'string' && m.reasoning_content.length > 0];
}

const stats = { total: 0, completed: 0, length: 0, bad: 0, thinking: 0 };
async function runOne(i, { chat = i % 5 !== 4, think = i % 10 === 3, temperature = 0.8, seed = i } = {}) {
  const sp = makeSpec(i);
  const prompt = PROMPTS[i % PROMPTS.length];
  let text, finish, usage, msg;
  if (chat) {
    const kw = think ? {} : { chat_template_kwargs: { enable_thinking: false } };
    const r = await client.chat.completions.create({
      model: M, messages: [{ role: 'user', content: prompt }], max_tokens: MAX_TOKENS, temperature, seed, ...kw, ...sp.body,
    });
    text = r.choices[0].message.content; finish = r.choices[0].finish_reason; usage = r.usage;
    msg = r.choices[0].message;
  } else {
    const r = await client.completions.create({ model: M, prompt: prompt + '\n', max_tokens: MAX_TOKENS, temperature, seed, ...sp.body });
    text = r.choices[0].text; finish = r.choices[0].finish_reason; usage = r.usage;
  }
  stats.total++;
  if (finish === 'length') {
    stats.length++;
    check(usage.completion_tokens === MAX_TOKENS, `#${i} ${sp.kind}: length finish at max_tokens`, usage);
    return { i, text, finish };
  }
  check(finish === 'stop', `#${i} ${sp.kind}: finish_reason stop`, finish);
  let body = text, had = false;
  if (chat && think) {
    const st = stripThink(msg);
    if (!check(st !== null, `#${i}: think block split off the answer`, msg)) return { i, text, finish };
    [body, had] = st;
    if (had) stats.thinking++;
  }
  stats.completed++;
  const v = sp.ok(body);
  if (!check(v === true, `#${i} ${sp.kind} (${chat ? 'chat' : 'completions'}): output conforms`, { v, text })) stats.bad++;
  return { i, text, finish };
}

async function expect400(body, what, needle, { chat = true } = {}) {
  const t0 = Date.now();
  try {
    if (chat) await client.chat.completions.create({ model: M, messages: [{ role: 'user', content: 'x' }], max_tokens: 8, ...body });
    else await client.completions.create({ model: M, prompt: 'x', max_tokens: 8, ...body });
    check(false, `${what}: expected 400`, 'got success');
  } catch (e) {
    check(e.status === 400, `${what}: status 400`, e.status ?? String(e));
    const msg = e.error?.message ?? '';
    if (needle) check(msg.includes(needle), `${what}: message names '${needle}'`, msg);
  }
  return Date.now() - t0;
}

try {
  // ---- 1. 100 requests concurrently in one batch with 20 plain ones
  const t0 = Date.now();
  const plain = Array.from({ length: 20 }, (_, k) => client.chat.completions.create({
    model: M, messages: [{ role: 'user', content: 'Tell me a story ' + k }], max_tokens: 64, temperature: 0.8, seed: k,
  }));
  const conc = await Promise.all(Array.from({ length: 100 }, (_, k) => runOne(k)));
  const plainRes = await Promise.all(plain);
  for (const r of plainRes) check(['stop', 'length'].includes(r.choices[0].finish_reason), 'plain request finished', r.choices[0]);
  console.log(`concurrent phase: ${conc.length} structured + ${plain.length} plain in ${Date.now() - t0} ms`);

  // ---- 2. 100 more at low concurrency (8 at a time)
  const t1 = Date.now();
  for (let k = 100; k < 200; k += 8)
    await Promise.all(Array.from({ length: Math.min(8, 200 - k) }, (_, d) => runOne(k + d)));
  console.log(`low-concurrency phase: 100 in ${Date.now() - t1} ms`);
  console.log(`outputs: ${JSON.stringify(stats)}`);
  check(stats.total === 200, '200 structured requests ran', stats);
  check(stats.completed >= 120, 'most structured requests completed within max_tokens', stats);
  check(stats.bad === 0, 'every completed output conforms', stats);

  // ---- 3. greedy: alone == in a batch of 16 mixed requests
  const idx = Array.from({ length: 16 }, (_, k) => k * 7 + 1);
  const alone = [];
  for (const k of idx) alone.push((await runOne(k, { temperature: 0 })).text);
  const batch = await Promise.all(idx.map((k) => runOne(k, { temperature: 0 })));
  idx.forEach((k, j) => check(batch[j].text === alone[j], `greedy #${k} same alone and in a batch of 16`, { alone: alone[j], batch: batch[j].text }));

  // ---- 4. thinking on: a free think block, then valid JSON
  let thought = 0;
  for (let k = 0; k < 4; k++) {
    const r = await client.chat.completions.create({
      model: M, messages: [{ role: 'user', content: 'Describe a person.' }], max_tokens: 300, temperature: 0.7,
      response_format: { type: 'json_schema', json_schema: { name: 'p', schema: SCHEMAS.enums, any_whitespace: false } }, seed: k,
    });
    const t = r.choices[0].message;
    if (r.choices[0].finish_reason !== 'stop') continue;
    const st = stripThink(t);
    check(st !== null && st[1], 'thinking: the thought in reasoning_content, the answer in content', t);
    if (st && st[1]) {
      thought++;
      let o = null;
      try { o = JSON.parse(st[0]); } catch { /* checked below */ }
      check(o !== null && VALIDATE.enums(o), 'thinking: valid JSON after </think>', t);
    }
  }
  check(thought >= 1, 'thinking: at least one request thought and completed', thought);
  // thinking off: the grammar starts at once
  {
    const r = await client.chat.completions.create({
      model: M, messages: [{ role: 'user', content: 'Pick.' }], max_tokens: 20, temperature: 0,
      chat_template_kwargs: { enable_thinking: false }, guided_choice: ['left', 'right'],
    });
    check(['left', 'right'].includes(r.choices[0].message.content), 'thinking off: grammar from the first token', r.choices[0].message.content);
  }

  // ---- 5. precedence: grammar > json_schema > json_object > structured_outputs > regex > choice
  const prec = [
    [{ guided_grammar: 'root ::= "G"', response_format: { type: 'json_schema', json_schema: { name: 'x', schema: { const: 1 } } } }, 'G'],
    [{ response_format: { type: 'json_schema', json_schema: { name: 'x', schema: { const: 'S' } } }, guided_regex: 'R' }, '"S"'],
    [{ structured_outputs: { regex: 'O' }, guided_regex: 'R', guided_choice: ['C'] }, 'O'],
    [{ guided_regex: 'R', guided_choice: ['C'] }, 'R'],
    [{ guided_choice: ['C'] }, 'C'],
  ];
  for (const [b, want] of prec) {
    const r = await client.chat.completions.create({ model: M, messages: [{ role: 'user', content: 'x' }], max_tokens: 10, chat_template_kwargs: { enable_thinking: false }, ...b });
    check(r.choices[0].message.content === want && r.choices[0].finish_reason === 'stop', `precedence ${JSON.stringify(Object.keys(b))} -> ${want}`, r.choices[0]);
  }
  {
    const r = await client.chat.completions.create({ model: M, messages: [{ role: 'user', content: 'x' }], max_tokens: 60, temperature: 0, chat_template_kwargs: { enable_thinking: false }, response_format: { type: 'json_object' }, structured_outputs: { regex: 'R' } });
    check(r.choices[0].message.content !== 'R', 'precedence: json_object over structured_outputs', r.choices[0].message.content);
  }

  // ---- 6. truncation: length, with exactly max_tokens sampled
  {
    const r = await client.chat.completions.create({ model: M, messages: [{ role: 'user', content: 'x' }], max_tokens: 3, temperature: 0, chat_template_kwargs: { enable_thinking: false }, guided_json: SCHEMAS.nested });
    check(r.choices[0].finish_reason === 'length' && r.usage.completion_tokens === 3, 'max_tokens: finish length after 3 tokens', r);
    check(r.choices[0].message.content.startsWith('{'), 'max_tokens: the truncated output is a prefix of the grammar', r.choices[0].message.content);
  }

  // ---- 7. streaming
  {
    const s = await client.chat.completions.create({ model: M, messages: [{ role: 'user', content: 'Go' }], max_tokens: MAX_TOKENS, stream: true, temperature: 0, chat_template_kwargs: { enable_thinking: false }, response_format: { type: 'json_schema', json_schema: { name: 'e', schema: SCHEMAS.enums } } });
    let t = '', fin = null;
    for await (const ch of s) { t += ch.choices[0]?.delta?.content ?? ''; fin = ch.choices[0]?.finish_reason ?? fin; }
    if (fin === 'stop') { let o = null; try { o = JSON.parse(t); } catch { /* */ } check(o && VALIDATE.enums(o), 'streaming: deltas join into conforming JSON', t); }
    else check(fin === 'length', 'streaming: finish reason', fin);
  }

  // ---- 8. errors: named, 400, and the server stays responsive
  await expect400({ response_format: { type: 'json_schema', json_schema: { name: 'h', schema: { type: 'string', format: 'idn-hostname' } } } }, 'unsupported format', 'idn-hostname');
  await expect400({ guided_json: { type: 'object', properties: { a: { type: 'string', maxlength: 3 } } } }, 'unsupported keyword', 'maxlength');
  await expect400({ guided_grammar: 'root ::= ("a"' }, 'malformed EBNF', 'guided_grammar');
  await expect400({ guided_grammar: 'root ::= other' }, 'undefined rule', 'other');
  await expect400({ guided_regex: 'a(?=b)' }, 'regex lookahead');
  await expect400({ guided_choice: [] }, 'empty choice', 'guided_choice');
  await expect400({ response_format: { type: 'xml' } }, 'unknown response_format type', 'xml');
  await expect400({ guided_json: '{not json' }, 'guided_json text that is not JSON', 'guided_json', { chat: false });
  {
    let maxHealth = 0, stop = false;
    const poll = (async () => {
      while (!stop) {
        const t = Date.now();
        const r = await fetch(srv.url + '/health');
        await r.text();
        maxHealth = Math.max(maxHealth, Date.now() - t);
        await new Promise((res) => setTimeout(res, 50));
      }
    })();
    const ms = await expect400({ guided_json: { type: 'string', minLength: 200000, maxLength: 400000 } }, 'pathological schema', 'cannot compile');
    const ms2 = await expect400({ guided_json: { type: 'string', pattern: '((a{0,100}){0,100}){0,100}' } }, 'pathological pattern', 'cannot compile');
    stop = true;
    await poll;
    console.log(`pathological: ${ms} ms and ${ms2} ms to 400; slowest /health meanwhile ${maxHealth} ms`);
    check(ms < 10000 && ms2 < 10000, 'pathological schemas fail within the time bound', [ms, ms2]);
    check(maxHealth < 1000, 'server responsive during a pathological compile', maxHealth);
    const again = await expect400({ guided_json: { type: 'string', minLength: 200000, maxLength: 400000 } }, 'pathological schema again (cached failure)', 'cannot compile');
    check(again < 1000, 'a failed compile is cached', again);
  }
} catch (e) {
  check(false, 'unexpected exception', String(e.stack || e));
} finally {
  await srv.stop();
}

// ---- 9. --grammar-fallback prompt: a warning instead of the 400
const srv2 = await startServer(['--grammar-fallback', 'prompt']).catch((e) => { check(false, 'fallback server starts', String(e)); return null; });
if (srv2) {
  try {
    const r = await fetch(srv2.url + '/v1/chat/completions', {
      method: 'POST', headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ messages: [{ role: 'user', content: 'x' }], max_tokens: 8, response_format: { type: 'json_schema', json_schema: { name: 'h', schema: { type: 'string', format: 'idn-hostname' } } } }),
    });
    check(r.status === 200, 'fallback: 200 instead of 400', r.status);
    const w = r.headers.get('warning') || '';
    check(/^299 tern ".*idn-hostname.*"$/.test(w), 'fallback: Warning header (RFC 7234 shape) names the problem', w);
    await r.text();
    const r2 = await fetch(srv2.url + '/v1/chat/completions', {
      method: 'POST', headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ messages: [{ role: 'user', content: 'x' }], max_tokens: 4, guided_choice: ['a'] }),
    });
    check(r2.status === 200 && !r2.headers.get('warning'), 'fallback: a good grammar is still enforced without a warning', r2.status);
    await r2.text();
  } finally {
    await srv2.stop();
  }
}
process.exit(summary('structured.e2e'));
