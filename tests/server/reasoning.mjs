// The reasoning split of `tern serve` on the demo model (a thinking model,
// Qwen3-style <think> ... </think>), through the official `openai` client:
// the thought in reasoning_content (+ reasoning), the answer alone in
// content, streamed == non-streamed; the raw output of the same prompt
// (rendered by @huggingface/jinja, encoded by HF tokenizers, sent to
// /v1/completions) is exactly <think> thought </think> answer;
// chat.completions.parse with a JSON schema and with a zod schema
// (zodResponseFormat) parses the answer while thinking; include_reasoning, reasoning_effort, enable_thinking and
// --reasoning-budget (counted in tokens through logprobs).
import fs from 'node:fs';
import path from 'node:path';
import { createRequire } from 'node:module';
import { startServer, check, summary, MODEL, ROOT } from './lib.mjs';

const require = createRequire(path.join(ROOT, 'tests/oracle/package.json'));
const OpenAI = require('openai').default ?? require('openai');
const { Template } = require('@huggingface/jinja');
const { Tokenizer } = require('tokenizers');

const M = 'tern-demo';
const msgs = [{ role: 'user', content: 'Hello! What is your name?' }];
const esc = (s) => s.replace(/[.*+?^${}()|[\]\\]/g, '\\$&');

async function expect400(p, what, param) {
  try {
    await p;
    check(false, `${what}: expected 400`, 'got success');
  } catch (e) {
    check(e.status === 400 && e.error && e.error.param === param, `${what}: 400 naming ${param}`, e.error ?? String(e));
  }
}

// Tokens between the think delimiters, from a chat's logprobs entries.
function thinkTokens(lp) {
  const toks = lp.content.map((x) => x.token);
  const o = toks.indexOf('<think>'), c = toks.indexOf('</think>');
  return { open: o, close: c, n: o >= 0 && c > o ? c - o - 1 : -1 };
}

let srv = await startServer([]);
let ref = null; // the greedy split of the plain demo, for the special-delimiter copy
try {
  const client = new OpenAI({ baseURL: srv.url + '/v1', apiKey: 'none', maxRetries: 0, timeout: 60000 });
  const greedy = { model: M, messages: msgs, max_tokens: 160, temperature: 0 };

  // ---- non-streamed split
  const r = await client.chat.completions.create(greedy);
  const m = r.choices[0].message;
  ref = m;
  check(typeof m.reasoning_content === 'string' && m.reasoning_content.length > 0, 'reasoning_content holds the thought', m);
  check(m.reasoning === m.reasoning_content, 'reasoning is an alias of reasoning_content', m);
  check(!m.content.includes('<think>') && !m.content.includes('</think>') && !m.reasoning_content.includes('think>'), 'no delimiters left in either part', m);

  // ---- outside reference: the raw output of the same prompt
  const cfg = JSON.parse(fs.readFileSync(path.join(MODEL, 'tokenizer_config.json'), 'utf8'));
  const rendered = new Template(cfg.chat_template).render({ messages: msgs, add_generation_prompt: true, eos_token: cfg.eos_token, bos_token: '' });
  const hf = Tokenizer.fromFile(path.join(MODEL, 'tokenizer.json'));
  const ids = (await hf.encode(rendered, null, { addSpecialTokens: false })).getIds();
  const raw = (await client.completions.create({ model: M, prompt: ids, max_tokens: 160, temperature: 0 })).choices[0].text;
  const shape = new RegExp('^\\s*<think>\\s*' + esc(m.reasoning_content) + '\\s*</think>\\s*' + esc(m.content) + '$', 's');
  check(shape.test(raw), 'raw output == <think> reasoning_content </think> content', { raw, m });

  // ---- streamed == non-streamed
  const s = await client.chat.completions.create({ ...greedy, stream: true });
  let sr = '', sa = '', sal = '', leaked = false;
  for await (const ch of s) {
    const d = ch.choices[0]?.delta ?? {};
    if (d.reasoning_content) sr += d.reasoning_content;
    if (d.reasoning) sal += d.reasoning;
    if (d.content) sa += d.content;
    if ((d.content ?? '').includes('think>')) leaked = true;
  }
  check(sr === m.reasoning_content && sal === sr, 'streamed reasoning == non-streamed', { sr, want: m.reasoning_content });
  check(sa === m.content && !leaked, 'streamed content == non-streamed', { sa, want: m.content });
  // sampled, several seeds: streamed and non-streamed reassemble identically
  for (const seed of [1, 2, 3]) {
    const b = { model: M, messages: [{ role: 'user', content: 'Tell me about the sea.' }], max_tokens: 120, temperature: 1, seed };
    const a = (await client.chat.completions.create(b)).choices[0].message;
    let r2 = '', c2 = '';
    for await (const ch of await client.chat.completions.create({ ...b, stream: true })) {
      const d = ch.choices[0]?.delta ?? {};
      r2 += d.reasoning_content ?? '';
      c2 += d.content ?? '';
    }
    check(r2 === (a.reasoning_content ?? '') && c2 === a.content, `seed ${seed}: stream reassembles the message`, { r2, c2, a });
  }

  // ---- include_reasoning false: the thought is dropped, the answer unchanged
  const nr = (await client.chat.completions.create({ ...greedy, include_reasoning: false })).choices[0].message;
  check(nr.reasoning_content === undefined && nr.content === m.content, 'include_reasoning false drops the thought only', nr);

  // ---- thinking off: enable_thinking false / reasoning_effort none (the template's empty block)
  const off = await client.chat.completions.create({ ...greedy, chat_template_kwargs: { enable_thinking: false } });
  const none = await client.chat.completions.create({ ...greedy, reasoning_effort: 'none' });
  check(off.choices[0].message.reasoning_content === undefined && off.usage.prompt_tokens > r.usage.prompt_tokens, 'enable_thinking false: no thought', off);
  check(none.usage.prompt_tokens === off.usage.prompt_tokens && none.choices[0].message.content === off.choices[0].message.content, 'reasoning_effort none == enable_thinking false', [none.choices[0].message, off.choices[0].message]);
  const low = await client.chat.completions.create({ ...greedy, reasoning_effort: 'high' });
  check(low.choices[0].message.reasoning_content === m.reasoning_content, 'reasoning_effort high (no cap) leaves a short thought alone', low.choices[0].message);

  // ---- chat.completions.parse: the schema applies to the answer; the thought stays apart
  const schema = { type: 'object', properties: { name: { type: 'string' }, age: { type: 'integer' } }, required: ['name', 'age'], additionalProperties: false };
  let parsed = 0, thought = 0;
  for (const seed of [1, 2, 3, 4, 5, 6]) {
    let p;
    try {
      p = await client.chat.completions.parse({ model: M, messages: [{ role: 'user', content: 'Describe a person as JSON.' }], max_tokens: 300, temperature: 0.7, seed,
        response_format: { type: 'json_schema', json_schema: { name: 'person', schema, strict: true } } });
    } catch (e) {
      if (e && e.constructor && e.constructor.name === 'LengthFinishReasonError') continue; /* a toy model may ramble past max_tokens */
      throw e;
    }
    const pm = p.choices[0].message;
    if (check(pm.parsed && typeof pm.parsed.name === 'string' && Number.isInteger(pm.parsed.age), `parse seed ${seed}: parsed object`, pm)) parsed++;
    if (pm.reasoning_content) thought++;
  }
  check(parsed >= 3 && thought >= 1, 'chat.completions.parse with thinking on: parsed answers, a non-empty thought', { parsed, thought });
  // the same with a zod schema (the client's zodResponseFormat helper)
  const { z } = require('zod');
  const { zodResponseFormat } = require('openai/helpers/zod');
  const Person = z.object({ name: z.string().max(24), age: z.number().int().min(0).max(150) });
  let zParsed = 0, zThought = 0;
  for (const seed of [1, 2, 3, 4, 5, 6]) {
    let p;
    try {
      p = await client.chat.completions.parse({ model: M, messages: [{ role: 'user', content: 'Describe a person as JSON.' }], max_tokens: 300, temperature: 0.7, seed,
        response_format: zodResponseFormat(Person, 'person') });
    } catch (e) {
      if (e && e.constructor && e.constructor.name === 'LengthFinishReasonError') continue;
      throw e;
    }
    const pm = p.choices[0].message;
    if (check(Person.safeParse(pm.parsed).success, `zod seed ${seed}: parsed object passes the zod schema`, pm)) zParsed++;
    if (pm.reasoning_content) zThought++;
  }
  check(zParsed >= 3 && zThought >= 1, 'chat.completions.parse with a zod schema, thinking on', { zParsed, zThought });

  // ---- bad input
  await expect400(client.chat.completions.create({ ...greedy, reasoning_effort: 'max' }), 'unknown reasoning_effort', 'reasoning_effort');
  await expect400(client.chat.completions.create({ ...greedy, include_reasoning: 'yes' }), 'include_reasoning not a boolean', 'include_reasoning');
} finally {
  { const ex = await srv.stop(); check(ex.code === 0 && !/Sanitizer|runtime error|LeakSanitizer/.test(srv.log()), 'server exits cleanly (no sanitizer report)', { ex, log: srv.log().slice(-1500) }); }
}

// ---- thought delimiters that are special tokens (detokenization would drop them): a demo
// copy whose tokenizer.json marks <think> / </think> special must split the same way
{
  const dir = path.join(process.env.TERN_BUILD || path.join(ROOT, 'build'), 'reasoning-special');
  fs.rmSync(dir, { recursive: true, force: true });
  fs.mkdirSync(dir, { recursive: true });
  for (const f of fs.readdirSync(MODEL)) if (f !== 'tokenizer.json') fs.symlinkSync(path.join(MODEL, f), path.join(dir, f));
  const tj = JSON.parse(fs.readFileSync(path.join(MODEL, 'tokenizer.json'), 'utf8'));
  for (const a of tj.added_tokens) if (a.content === '<think>' || a.content === '</think>') a.special = true;
  fs.writeFileSync(path.join(dir, 'tokenizer.json'), JSON.stringify(tj));
  srv = await startServer(['--model-name', M], { model: dir });
  try {
    const client = new OpenAI({ baseURL: srv.url + '/v1', apiKey: 'none', maxRetries: 0, timeout: 60000 });
    const x = (await client.chat.completions.create({ model: M, messages: msgs, max_tokens: 160, temperature: 0 })).choices[0].message;
    check(ref && x.reasoning_content === ref.reasoning_content && x.content === ref.content, 'special-token delimiters: the same split', { x, ref });
  } finally {
    { const ex = await srv.stop(); check(ex.code === 0 && !/Sanitizer|runtime error|LeakSanitizer/.test(srv.log()), 'server exits cleanly (no sanitizer report)', { ex, log: srv.log().slice(-1500) }); }
    fs.rmSync(dir, { recursive: true, force: true });
  }
}

// ---- --reasoning-budget: the engine closes the block itself
for (const budget of [0, 3]) {
  srv = await startServer(['--reasoning-budget', String(budget)]);
  try {
    const client = new OpenAI({ baseURL: srv.url + '/v1', apiKey: 'none', maxRetries: 0, timeout: 60000 });
    let seen = 0;
    for (const seed of [1, 2, 3, 4]) {
      const b = { model: M, messages: msgs, max_tokens: 80, temperature: 1, seed, logprobs: true };
      const x = await client.chat.completions.create(b);
      const t = thinkTokens(x.choices[0].logprobs);
      if (t.open < 0) continue; /* the model did not think this time */
      seen++;
      check(t.close > t.open && t.n <= budget, `budget ${budget}, seed ${seed}: block closed within the budget`, t);
      check(!x.choices[0].message.content.includes('think>'), `budget ${budget}: the answer holds no delimiter`, x.choices[0].message);
      // a grammar row takes the same cap
      const g = await client.chat.completions.create({ ...b, response_format: { type: 'json_object' } });
      const tg = thinkTokens(g.choices[0].logprobs);
      check(tg.open < 0 || (tg.close > tg.open && tg.n <= budget), `budget ${budget}, seed ${seed}: json_object row capped too`, tg);
      if (g.choices[0].finish_reason === 'stop') {
        let o = null;
        try { o = JSON.parse(g.choices[0].message.content); } catch { /* checked */ }
        check(o !== null && typeof o === 'object', `budget ${budget}: the answer is JSON`, g.choices[0].message);
      }
    }
    check(seen >= 1, `budget ${budget}: some request opened a block`, seen);
    // a request's effort is bounded by the server's budget
    const eff = await client.chat.completions.create({ model: M, messages: msgs, max_tokens: 80, temperature: 0, logprobs: true, reasoning_effort: 'high' });
    const te = thinkTokens(eff.choices[0].logprobs);
    check(te.open < 0 || te.n <= budget, `budget ${budget}: reasoning_effort high stays under the server's cap`, te);
  } finally {
    { const ex = await srv.stop(); check(ex.code === 0 && !/Sanitizer|runtime error|LeakSanitizer/.test(srv.log()), 'server exits cleanly (no sanitizer report)', { ex, log: srv.log().slice(-1500) }); }
  }
}

process.exit(summary('reasoning'));
