// Conformance of `tern serve` with the official `openai` npm client (5.12.0):
// chat and completions, streaming and not, stop, seeds, logprobs, n > 1,
// usage, errors, /v1/models. The chat prompt is checked against an outside
// reference: the model's template rendered by @huggingface/jinja and encoded
// by HF `tokenizers`, sent as a token-array prompt to /v1/completions, must
// give the same greedy text as /v1/chat/completions.
import fs from 'node:fs';
import path from 'node:path';
import { createRequire } from 'node:module';
import { startServer, check, summary, MODEL, ROOT } from './lib.mjs';

const require = createRequire(path.join(ROOT, 'tests/oracle/package.json'));
const OpenAI = require('openai').default ?? require('openai');
const { Template } = require('@huggingface/jinja');
const { Tokenizer } = require('tokenizers');

const KEY = 'sk-test-' + Math.random().toString(36).slice(2);
const srv = await startServer(['--api-key', KEY, '--model-name', 'tern-demo']);
const client = new OpenAI({ baseURL: srv.url + '/v1', apiKey: KEY, maxRetries: 0, timeout: 60000 });
const M = 'tern-demo';
const msgs = [{ role: 'user', content: 'Hello! What is your name?' }];

async function expectError(p, status, what, param) {
  try {
    await p;
    check(false, `${what}: expected HTTP ${status}`, 'got success');
  } catch (e) {
    check(e instanceof OpenAI.APIError, `${what}: APIError`, String(e));
    check(e.status === status, `${what}: status ${status}`, e.status);
    check(e.error && typeof e.error.message === 'string' && e.error.message.length > 0, `${what}: error.message`, e.error);
    check(e.error && 'type' in e.error && 'param' in e.error && 'code' in e.error, `${what}: OpenAI error shape`, e.error);
    if (param) check(e.error && e.error.param === param, `${what}: param ${param}`, e.error && e.error.param);
  }
}

try {
  // ---- /v1/models
  const models = await client.models.list();
  check(models.data.length === 1 && models.data[0].id === M && models.data[0].object === 'model', 'models.list', models.data);
  const one = await client.models.retrieve(M);
  check(one.id === M, 'models.retrieve');
  await expectError(client.models.retrieve('nope'), 404, 'models.retrieve unknown');

  // ---- chat, non-streaming, greedy
  // thinking off: the whole output is the answer (the thought's split has its own test, reasoning.mjs)
  const greedy = { model: M, messages: msgs, max_tokens: 24, temperature: 0, chat_template_kwargs: { enable_thinking: false } };
  const c1 = await client.chat.completions.create(greedy);
  check(c1.object === 'chat.completion' && /^chatcmpl-/.test(c1.id), 'chat object/id', c1);
  check(c1.choices.length === 1 && c1.choices[0].index === 0, 'chat one choice');
  const ch = c1.choices[0];
  check(ch.message.role === 'assistant' && typeof ch.message.content === 'string' && ch.message.content.length > 0, 'chat message', ch.message);
  check(['stop', 'length'].includes(ch.finish_reason), 'chat finish_reason', ch.finish_reason);
  const u = c1.usage;
  check(u && u.prompt_tokens > 0 && u.completion_tokens > 0 && u.total_tokens === u.prompt_tokens + u.completion_tokens, 'chat usage', u);
  check(u && u.prompt_tokens_details && Number.isInteger(u.prompt_tokens_details.cached_tokens), 'usage cached_tokens', u);
  check(u.completion_tokens <= 24, 'max_tokens respected', u);

  // ---- outside reference: jinja template + HF tokenizers -> token prompt
  const cfg = JSON.parse(fs.readFileSync(path.join(MODEL, 'tokenizer_config.json'), 'utf8'));
  const rendered = new Template(cfg.chat_template).render({ messages: msgs, add_generation_prompt: true, enable_thinking: false, eos_token: cfg.eos_token, bos_token: cfg.bos_token ?? '' });
  const hf = Tokenizer.fromFile(path.join(MODEL, 'tokenizer.json'));
  const ids = (await hf.encode(rendered, null, { addSpecialTokens: false })).getIds();
  check(ids.length === u.prompt_tokens, 'prompt tokens == HF template+tokenizer count', { hf: ids.length, tern: u.prompt_tokens });
  const cref = await client.completions.create({ model: M, prompt: ids, max_tokens: 24, temperature: 0 });
  check(cref.choices[0].text === ch.message.content, 'chat == completion over the HF-rendered prompt', { chat: ch.message.content, ref: cref.choices[0].text });
  // the same prompt as text
  const ctext = await client.completions.create({ model: M, prompt: rendered, max_tokens: 24, temperature: 0 });
  check(ctext.choices[0].text === ch.message.content, 'completion over rendered text == chat');
  check(ctext.object === 'text_completion' && /^cmpl-/.test(ctext.id), 'completion object/id', ctext);

  // ---- chat streaming
  const stream = await client.chat.completions.create({ ...greedy, stream: true, stream_options: { include_usage: true } });
  let text = '', first = null, finish = null, usageChunk = null, n = 0, ids2 = new Set();
  for await (const chunk of stream) {
    n++;
    ids2.add(chunk.id);
    check(chunk.object === 'chat.completion.chunk', 'chunk object');
    if (chunk.choices.length === 0) { usageChunk = chunk.usage; continue; }
    const d = chunk.choices[0].delta;
    if (first === null) first = d;
    if (d.content) text += d.content;
    if (chunk.choices[0].finish_reason) finish = chunk.choices[0].finish_reason;
  }
  check(first && first.role === 'assistant', 'stream starts with the role', first);
  check(text === ch.message.content, 'stream text == non-stream text (greedy)', { text, want: ch.message.content });
  check(finish === ch.finish_reason, 'stream finish_reason', finish);
  check(usageChunk && usageChunk.completion_tokens === u.completion_tokens && usageChunk.prompt_tokens === u.prompt_tokens, 'stream usage chunk', usageChunk);
  check(ids2.size === 1 && n >= 3, 'stream chunks share one id', [...ids2]);

  // ---- stop strings
  const full = ch.message.content;
  const cut = full.length > 8 ? full.slice(4, 7) : null;
  if (check(cut !== null, 'greedy output long enough for a stop test', full)) {
    const s1 = await client.chat.completions.create({ ...greedy, stop: [cut, 'zzzz-never'] });
    const want = full.slice(0, full.indexOf(cut));
    check(s1.choices[0].message.content === want, 'stop string truncates before it', { got: s1.choices[0].message.content, want });
    check(s1.choices[0].finish_reason === 'stop', 'stop finish_reason', s1.choices[0].finish_reason);
    const s2 = await client.completions.create({ model: M, prompt: ids, max_tokens: 24, temperature: 0, stop: cut });
    check(s2.choices[0].text === want, 'completions stop (string form)');
  }

  // ---- seeds
  const sampled = { model: M, messages: msgs, max_tokens: 16, temperature: 1.0, top_p: 0.95, chat_template_kwargs: { enable_thinking: false } };
  const a = await client.chat.completions.create({ ...sampled, seed: 1234 });
  const b = await client.chat.completions.create({ ...sampled, seed: 1234 });
  check(a.choices[0].message.content === b.choices[0].message.content, 'same seed, same text', [a.choices[0].message.content, b.choices[0].message.content]);
  const others = [];
  for (const s of [1, 2, 3]) others.push((await client.chat.completions.create({ ...sampled, seed: s, temperature: 1.5 })).choices[0].message.content);
  check(new Set(others).size > 1, 'different seeds can differ', others);

  // ---- n > 1
  const nn = await client.chat.completions.create({ ...sampled, seed: 1234, n: 3 });
  check(nn.choices.length === 3 && nn.choices.map((c) => c.index).join() === '0,1,2', 'n=3 choices indexed', nn.choices.map((c) => c.index));
  check(nn.choices[0].message.content === a.choices[0].message.content, 'choice 0 of n=3 == n=1 with the same seed');
  const sumTok = nn.usage.completion_tokens;
  check(sumTok >= 3 && sumTok <= 48 && nn.usage.prompt_tokens === a.usage.prompt_tokens, 'n=3 usage', nn.usage);
  check(new Set(nn.choices.map((c) => c.message.content)).size > 1 || nn.choices.every((c) => c.message.content === a.choices[0].message.content) === false,
    'n=3 choices use distinct seeds', nn.choices.map((c) => c.message.content));
  // n>1 streaming: every index gets a finish
  const ns = await client.chat.completions.create({ ...sampled, seed: 9, n: 2, stream: true });
  const fin = new Map(), txt = ['', ''];
  for await (const chunk of ns) for (const c of chunk.choices) { if (c.delta.content) txt[c.index] += c.delta.content; if (c.finish_reason) fin.set(c.index, c.finish_reason); }
  check(fin.size === 2, 'n=2 stream finishes both choices', [...fin]);
  const nsr = await client.chat.completions.create({ ...sampled, seed: 9, n: 2 });
  check(txt[0] === nsr.choices[0].message.content && txt[1] === nsr.choices[1].message.content, 'n=2 stream == non-stream (same seed)', { txt, ns: nsr.choices.map((c) => c.message.content) });

  // ---- logprobs (chat)
  const lp = await client.chat.completions.create({ ...greedy, logprobs: true, top_logprobs: 3 });
  const content = lp.choices[0].logprobs && lp.choices[0].logprobs.content;
  if (check(Array.isArray(content) && content.length === lp.usage.completion_tokens, 'logprobs.content per token', content && content.length)) {
    let ok = true, okTop = true, joined = [];
    for (const e of content) {
      ok &&= typeof e.token === 'string' && e.logprob <= 0 && Array.isArray(e.bytes);
      okTop &&= e.top_logprobs.length === 3 && e.top_logprobs[0].token === e.token &&
        e.top_logprobs[0].logprob >= e.top_logprobs[1].logprob && e.top_logprobs[1].logprob >= e.top_logprobs[2].logprob;
      joined.push(...e.bytes);
    }
    check(ok, 'logprob entries well-formed');
    check(okTop, 'greedy token is top_logprobs[0], sorted');
    const dec = Buffer.from(joined).toString('utf8');
    check(dec.startsWith(lp.choices[0].message.content.slice(0, 5)), 'token bytes spell the content', { dec, content: lp.choices[0].message.content });
  }
  check(lp.choices[0].message.content === full, 'logprobs do not change greedy text');
  const nolp = await client.chat.completions.create({ ...greedy, max_tokens: 2 });
  check(nolp.choices[0].logprobs === null, 'logprobs null when not requested', nolp.choices[0].logprobs);

  // ---- completions: logprobs, stream, echo
  const cl = await client.completions.create({ model: M, prompt: 'Once upon a time', max_tokens: 8, temperature: 0, logprobs: 2 });
  const L = cl.choices[0].logprobs;
  check(L && L.tokens.length === cl.usage.completion_tokens && L.token_logprobs.length === L.tokens.length &&
    L.top_logprobs.every((t) => Object.keys(t).length >= 1 && Object.keys(t).length <= 2) && L.text_offset.length === L.tokens.length,
  'completions logprobs shape', L);
  check(L && L.tokens.join('') === cl.choices[0].text, 'completion tokens spell the text');
  const cs = await client.completions.create({ model: M, prompt: 'Once upon a time', max_tokens: 8, temperature: 0, stream: true, stream_options: { include_usage: true } });
  let ctxt = '', cfin = null, cuse = null;
  for await (const chunk of cs) { if (chunk.choices.length) { ctxt += chunk.choices[0].text; if (chunk.choices[0].finish_reason) cfin = chunk.choices[0].finish_reason; } else cuse = chunk.usage; }
  check(ctxt === cl.choices[0].text && cfin && cuse && cuse.completion_tokens === cl.usage.completion_tokens, 'completions stream == non-stream', { ctxt, want: cl.choices[0].text });
  const ce = await client.completions.create({ model: M, prompt: 'Once upon a time', max_tokens: 8, temperature: 0, echo: true });
  check(ce.choices[0].text === 'Once upon a time' + cl.choices[0].text, 'echo prepends the prompt');

  // ---- extra sampling fields pass through the client
  const ext = await client.chat.completions.create({ ...greedy, max_tokens: 4, top_k: 5, min_p: 0.05, repetition_penalty: 1.1, presence_penalty: 0.5, frequency_penalty: 0.5, logit_bias: { '10': -100 }, user: 'u1', metadata: { a: 'b' }, store: false, chat_template_kwargs: { enable_thinking: false } });
  check(ext.choices[0].message.content.length >= 0, 'extra sampling fields accepted');
  const think = await client.chat.completions.create({ ...greedy, chat_template_kwargs: { enable_thinking: true } });
  check(think.usage.prompt_tokens < u.prompt_tokens, 'chat_template_kwargs reach the template (enable_thinking=false adds the empty think block)', [think.usage.prompt_tokens, u.prompt_tokens]);

  // ---- prefix cache: the same conversation again reuses its KV (the cache boundary is the end of the
  // conversation before the generation primer, which the server computes from the template)
  const longMsgs = [{ role: 'system', content: 'You are a terse assistant that answers in one line.' },
    { role: 'user', content: 'Tell me something about lighthouses, keepers, lamps and the sea at night.' }];
  const p1 = await client.chat.completions.create({ model: M, messages: longMsgs, max_tokens: 4, temperature: 0 });
  const p2 = await client.chat.completions.create({ model: M, messages: longMsgs, max_tokens: 4, temperature: 0 });
  check(p1.usage.prompt_tokens > 32 && p2.usage.prompt_tokens_details.cached_tokens >= 16 &&
    p2.usage.prompt_tokens_details.cached_tokens < p2.usage.prompt_tokens, 'repeated conversation reports cached_tokens', [p1.usage, p2.usage]);
  check(p1.choices[0].message.content === p2.choices[0].message.content, 'cached prefix gives the same greedy text');

  // ---- errors
  await expectError(client.chat.completions.create({ ...greedy, temperature: 'hot' }), 400, 'bad type', 'temperature');
  await expectError(client.chat.completions.create({ ...greedy, max_tokens: -5 }), 400, 'out of range', 'max_tokens');
  await expectError(client.chat.completions.create({ ...greedy, top_logprobs: 50, logprobs: true }), 400, 'top_logprobs too large', 'top_logprobs');
  await expectError(client.chat.completions.create({ ...greedy, model: 'gpt-4o' }), 404, 'unknown model', 'model');
  await expectError(client.chat.completions.create({ ...greedy, messages: [{ role: 'user', content: 'word '.repeat(3000) }] }), 400, 'over-long prompt', 'messages');
  await expectError(client.completions.create({ model: M, prompt: 'hi', max_tokens: 100000 }), 400, 'prompt + max_tokens over the context');
  await expectError(client.chat.completions.create({ ...greedy, response_format: { type: 'yaml' } }), 400, 'unknown response_format type');
  await expectError(client.chat.completions.create({ ...greedy, guided_regex: '(a' }), 400, 'guided_regex that does not compile', 'guided_regex');
  await expectError(client.chat.completions.create({ ...greedy, temprature: 1 }), 400, 'misspelled field named', 'temprature');
  await expectError(client.chat.completions.create({ ...greedy, messages: [] }), 400, 'empty messages', 'messages');
  await expectError(client.chat.completions.create({ ...greedy, messages: [{ role: 'user', content: [{ type: 'image_url', image_url: { url: 'x' } }] }] }), 400, 'image content part');
  const bad = new OpenAI({ baseURL: srv.url + '/v1', apiKey: 'wrong-key', maxRetries: 0 });
  await expectError(bad.chat.completions.create(greedy), 401, 'bad key');
  await expectError(bad.models.list(), 401, 'bad key on /v1/models');
  const r = await fetch(srv.url + '/v1/models');
  check(r.status === 401, 'no key -> 401', r.status);
  const h = await fetch(srv.url + '/health');
  check(h.status === 200 && (await h.json()).status === 'ok', '/health needs no key');
  const st = await (await fetch(srv.url + '/stats')).json();
  check(st.engine && st.engine.requests_total > 10 && st.server.completion_tokens > 0, '/stats counters', st);
  const met = await (await fetch(srv.url + '/metrics')).text();
  check(/^tern_tokens_decoded_total \d+/m.test(met) && /tern_http_responses_total\{route="chat_completions",status="2xx"\} \d+/.test(met), '/metrics Prometheus text', met.slice(0, 200));
  // content-part text is accepted
  const parts = await client.chat.completions.create({ ...greedy, messages: [{ role: 'user', content: [{ type: 'text', text: 'Hello! What is your name?' }] }] });
  check(parts.choices[0].message.content === full, 'text content parts == plain string');
} catch (e) {
  check(false, 'unexpected exception', e && e.stack ? e.stack : String(e));
} finally {
  const ex = await srv.stop();
  check(ex.code === 0, 'server exits cleanly on SIGTERM', ex);
  const log = srv.log();
  check(!/error|sanitizer|runtime error/i.test(log.replace(/error_log|errors?:? 0/g, '')), 'no error in the server log', log.slice(-2000));
}
process.exit(summary('openai_conformance'));
