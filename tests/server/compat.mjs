// Endpoints and fields other servers' clients send (llama-server, vLLM),
// through HTTP: POST /tokenize and /detokenize against HF `tokenizers` on the
// model's tokenizer.json, GET /version, the API key on each, and 400s naming
// the field.
import path from 'node:path';
import { createRequire } from 'node:module';
import { startServer, check, summary, MODEL, ROOT } from './lib.mjs';

const require = createRequire(path.join(ROOT, 'tests/oracle/package.json'));
const { Tokenizer } = require('tokenizers');

const KEY = 'sk-test-' + Math.random().toString(36).slice(2);
const srv = await startServer(['--api-key', KEY, '--model-name', 'tern-demo']);
const hf = Tokenizer.fromFile(path.join(MODEL, 'tokenizer.json'));
const AUTH = { Authorization: `Bearer ${KEY}`, 'Content-Type': 'application/json' };

async function post(route, body, headers = AUTH) {
  const r = await fetch(srv.url + route, { method: 'POST', headers, body: typeof body === 'string' ? body : JSON.stringify(body) });
  const text = await r.text();
  let json = null;
  try { json = JSON.parse(text); } catch { /* not JSON */ }
  return { status: r.status, json, text, headers: r.headers };
}

function expect400(res, param, what) {
  check(res.status === 400, `${what}: status 400`, res.status);
  check(res.json && res.json.error && typeof res.json.error.message === 'string', `${what}: OpenAI error shape`, res.text);
  check(res.json && res.json.error && res.json.error.param === param, `${what}: names '${param}'`, res.json && res.json.error);
}

try {
  // ---- /tokenize against HF tokenizers
  const texts = ['Hello, world! How are you?', '  leading spaces and ünïcödé 🦀 text\nnew line', 'x'];
  for (const t of texts) {
    for (const add of [false, true]) {
      const want = (await hf.encode(t, null, { addSpecialTokens: add })).getIds();
      const r = await post('/tokenize', { content: t, add_special: add });
      check(r.status === 200, `tokenize ${JSON.stringify(t)} add_special=${add}: 200`, r.text);
      check(JSON.stringify(r.json && r.json.tokens) === JSON.stringify(Array.from(want)),
        `tokenize ${JSON.stringify(t)} add_special=${add} == HF`, { got: r.json, want: Array.from(want) });
    }
  }
  // add_special defaults to false (llama-server)
  {
    const t = texts[0];
    const want = Array.from((await hf.encode(t, null, { addSpecialTokens: false })).getIds());
    const r = await post('/tokenize', { content: t });
    check(JSON.stringify(r.json && r.json.tokens) === JSON.stringify(want), 'tokenize: add_special defaults to false', r.json);
  }
  // with_pieces: [{id, piece}], the pieces concatenate to the text
  {
    const t = 'Pieces of a sentence, with ümlauts.';
    const want = Array.from((await hf.encode(t, null, { addSpecialTokens: false })).getIds());
    const r = await post('/tokenize', { content: t, with_pieces: true });
    const toks = (r.json && r.json.tokens) || [];
    check(toks.length === want.length && toks.every((x, i) => x.id === want[i]), 'with_pieces: ids == HF', toks);
    const bytes = [];
    for (const x of toks) {
      if (typeof x.piece === 'string') bytes.push(...Buffer.from(x.piece, 'utf8'));
      else if (Array.isArray(x.piece)) bytes.push(...x.piece);
    }
    check(Buffer.from(bytes).toString('utf8') === t, 'with_pieces: pieces join to the text', toks);
  }
  // ---- /detokenize against HF decode (special tokens kept)
  for (const t of texts) {
    const ids = Array.from((await hf.encode(t, null, { addSpecialTokens: true })).getIds());
    const want = await hf.decode(ids, false);
    const r = await post('/detokenize', { tokens: ids });
    check(r.status === 200 && r.json && r.json.content === want, `detokenize ${JSON.stringify(t)} == HF`, { got: r.json, want });
  }
  {
    const r = await post('/detokenize', { tokens: [] });
    check(r.status === 200 && r.json && r.json.content === '', 'detokenize []: ""', r.text);
  }
  // ---- bad input: 400 naming the field
  expect400(await post('/tokenize', {}), 'content', 'tokenize without content');
  expect400(await post('/tokenize', { content: 5 }), 'content', 'tokenize content not a string');
  expect400(await post('/tokenize', { content: 'a', add_special: 'yes' }), 'add_special', 'add_special not a boolean');
  expect400(await post('/tokenize', { content: 'a', with_pieces: 1 }), 'with_pieces', 'with_pieces not a boolean');
  expect400(await post('/tokenize', { content: 'a', bogus: 1 }), 'bogus', 'tokenize unknown field');
  {
    const r = await post('/tokenize', { content: 'a', model: 'other' }); // an unknown model: OpenAI's 404
    check(r.status === 404 && r.json && r.json.error && r.json.error.code === 'model_not_found' &&
      r.json.error.param === 'model', 'tokenize other model: 404 model_not_found', r.text);
  }
  expect400(await post('/detokenize', {}), 'tokens', 'detokenize without tokens');
  expect400(await post('/detokenize', { tokens: 'abc' }), 'tokens', 'detokenize tokens not an array');
  expect400(await post('/detokenize', { tokens: [1, -1] }), 'tokens', 'detokenize negative id');
  expect400(await post('/detokenize', { tokens: [1, 1e9] }), 'tokens', 'detokenize id past the vocabulary');
  expect400(await post('/detokenize', { tokens: [1, 'a'] }), 'tokens', 'detokenize id not an integer');
  {
    const r = await post('/tokenize', '{"content": ');
    check(r.status === 400 && r.json && r.json.error, 'tokenize bad JSON: 400 OpenAI shape', r.text);
  }
  // ---- the API key, as on /v1
  for (const [route, method, body] of [['/tokenize', 'POST', '{"content":"a"}'], ['/detokenize', 'POST', '{"tokens":[1]}'], ['/version', 'GET', undefined]]) {
    const r = await fetch(srv.url + route, { method, body, headers: body ? { 'Content-Type': 'application/json' } : {} });
    const j = await r.json().catch(() => null);
    check(r.status === 401 && j && j.error, `${route} without the key: 401`, r.status);
  }
  // ---- /version
  {
    const r = await fetch(srv.url + '/version', { headers: AUTH });
    const j = await r.json().catch(() => null);
    check(r.status === 200 && j && typeof j.version === 'string' && /^\d+\.\d+\.\d+/.test(j.version), '/version: {version}', j);
    check(!j || j.commit === undefined || /^[0-9a-f]{7,40}$/.test(j.commit), '/version: commit is a hash when given', j);
    const g = await fetch(srv.url + '/tokenize', { headers: AUTH });
    check(g.status === 405, 'GET /tokenize: 405', g.status);
  }
  // ---- fields llama-server and vLLM clients send
  const comp = async (body) => post('/v1/completions', { prompt: 'The capital of France is', temperature: 0, ...body });
  const chat = async (body) => post('/v1/chat/completions', { messages: [{ role: 'user', content: 'Say hello.' }], temperature: 0, ...body });
  const base = await comp({ max_tokens: 24 });
  const G = base.json && base.json.choices[0].text;
  check(base.status === 200 && typeof G === 'string' && G.length > 8, 'greedy reference completion', base.text);
  {
    const r = await comp({ n_predict: 5 });
    check(r.status === 200 && r.json.usage.completion_tokens === 5 && r.json.choices[0].finish_reason === 'length', 'n_predict: 5 tokens', r.text);
    check(G.startsWith(r.json.choices[0].text), 'n_predict: the greedy prefix', r.json.choices[0].text);
    const c = await comp({ max_tokens: 24, cache_prompt: true });
    check(c.status === 200 && c.json.choices[0].text === G, 'cache_prompt: accepted, same text', c.text);
    const a = await comp({ max_tokens: 16, repeat_penalty: 1.8 });
    const b = await comp({ max_tokens: 16, repetition_penalty: 1.8 });
    check(a.status === 200 && b.status === 200 && a.json.choices[0].text === b.json.choices[0].text, 'repeat_penalty == repetition_penalty', [a.text, b.text]);
  }
  // stop strings: include_stop_str_in_output keeps the matched string
  {
    const stop = G.slice(6, 9);
    const at = G.indexOf(stop);
    const off = await comp({ max_tokens: 24, stop: [stop] });
    const on = await comp({ max_tokens: 24, stop: [stop], include_stop_str_in_output: true });
    check(off.json && off.json.choices[0].text === G.slice(0, at), 'stop: cut before the stop string', off.json && off.json.choices[0]);
    check(on.json && on.json.choices[0].text === G.slice(0, at + stop.length), 'include_stop_str_in_output: ends with the stop string', on.json && on.json.choices[0]);
    check(on.json && on.json.choices[0].finish_reason === 'stop', 'include_stop_str_in_output: finish stop', on.json && on.json.choices[0]);
  }
  // stop_token_ids: a token of the greedy text ends the choice there
  {
    const pieces = (await post('/tokenize', { content: G, with_pieces: true })).json.tokens;
    const t = pieces[3];
    const r = await comp({ max_tokens: 24, stop_token_ids: [t.id] });
    const text = r.json && r.json.choices[0].text;
    check(r.status === 200 && r.json.choices[0].finish_reason === 'stop' && G.startsWith(text) && text.length < G.length,
      'stop_token_ids: stops on the token, a prefix of the greedy text', { text, t, G });
    check(r.status === 200 && r.json.usage.completion_tokens < 24, 'stop_token_ids: fewer tokens', r.json && r.json.usage);
    expect400(await comp({ stop_token_ids: [1e9] }), 'stop_token_ids', 'stop_token_ids past the vocabulary');
  }
  // min_tokens: EOS held off (a short greedy chat answer that ends by EOS)
  {
    const short = await chat({ max_tokens: 64 });
    const c0 = short.json && short.json.choices[0];
    if (check(c0 && c0.finish_reason === 'stop' && short.json.usage.completion_tokens < 40, 'a short answer that ends by EOS', short.text)) {
      const k = short.json.usage.completion_tokens;
      const r = await chat({ max_tokens: 64, min_tokens: k + 8 });
      check(r.status === 200 && r.json.usage.completion_tokens >= k + 8, `min_tokens ${k + 8}: at least that many tokens`, r.json && r.json.usage);
      check(r.status === 200 && r.json.choices[0].message.content.startsWith(c0.message.content), 'min_tokens: continues the greedy answer', r.json && r.json.choices[0]);
      const s = await chat({ max_tokens: 64, min_tokens: k + 8, stream: true });
      const txt = await s.text;
      check(s.status === 200 && txt.includes('[DONE]'), 'min_tokens streamed', txt.slice(0, 200));
    }
    expect400(await chat({ max_tokens: 4, min_tokens: 5 }), 'min_tokens', 'min_tokens above max_tokens');
  }
  // grammar / json_schema: llama-server's names for guided_grammar / a JSON schema
  {
    const r = await comp({ max_tokens: 8, grammar: 'root ::= "yes" | "no"' });
    check(r.status === 200 && ['yes', 'no'].includes(r.json.choices[0].text), 'grammar: constrained', r.text);
    const schema = { type: 'object', properties: { a: { type: 'integer' } }, required: ['a'], additionalProperties: false };
    const j = await chat({ max_tokens: 48, json_schema: schema });
    let parsed = null;
    try { parsed = JSON.parse(j.json.choices[0].message.content); } catch { /* checked below */ }
    check(j.status === 200 && parsed && Number.isInteger(parsed.a) && Object.keys(parsed).length === 1, 'json_schema: the answer matches the schema', j.text);
    expect400(await comp({ grammar: 'root ::= "a"', guided_grammar: 'root ::= "b"' }), 'grammar', 'grammar and guided_grammar');
    expect400(await comp({ n_predict: 0 }), 'n_predict', 'n_predict 0');
  }
  // unknown fields: ignored with a Warning header naming them; misspellings stay 400s
  {
    const r = await comp({ max_tokens: 24, frobnicate: 1, x_client_trace: 'abc' });
    const w = r.headers.get('warning') || '';
    check(r.status === 200 && r.json.choices[0].text === G, 'unknown fields: ignored, same text', r.text);
    check(/frobnicate/.test(w) && /x_client_trace/.test(w) && /^299 /.test(w), 'unknown fields: Warning header names them', w);
    const plain = await comp({ max_tokens: 2 });
    check(!plain.headers.get('warning'), 'no Warning without unknown fields', plain.headers.get('warning'));
    const m = await comp({ max_tokens: 4, temperatur: 0.5 });
    expect400(m, 'temperatur', 'misspelled temperature');
    check(/did you mean 'temperature'/.test(m.json && m.json.error.message), 'misspelling: did you mean', m.json);
    expect400(await comp({ max_tokens: 4, messages: [] }), 'messages', "chat's field on completions");
  }
  // batched prompts on /v1/completions: one choice per prompt (x n), each as if sent alone
  {
    const P = ['The capital of France is', 'Once upon a time', 'def add(a, b):'];
    const solo = [];
    for (const p of P) solo.push((await post('/v1/completions', { prompt: p, temperature: 0, max_tokens: 8 })).json);
    const r = await post('/v1/completions', { prompt: P, temperature: 0, max_tokens: 8, n: 2 });
    const chs = (r.json && r.json.choices) || [];
    check(r.status === 200 && chs.length === 6, 'batch: 3 prompts x n=2 -> 6 choices', r.text);
    chs.sort((a, b) => a.index - b.index);
    for (let i = 0; i < chs.length; i++)
      check(chs[i].index === i && chs[i].text === solo[Math.floor(i / 2)].choices[0].text, `batch choice ${i} == its prompt alone`, [chs[i], solo[Math.floor(i / 2)].choices[0]]);
    const pt = solo.reduce((a, x) => a + x.usage.prompt_tokens, 0);
    check(r.json && r.json.usage.prompt_tokens === pt, 'batch: prompt_tokens summed', r.json && r.json.usage);
    const ids = await Promise.all(P.map(async (p) => (await post('/tokenize', { content: p, add_special: true })).json.tokens));
    const t = await post('/v1/completions', { prompt: ids, temperature: 0, max_tokens: 8, echo: true });
    const tc = ((t.json && t.json.choices) || []).sort((a, b) => a.index - b.index);
    check(t.status === 200 && tc.length === 3 && tc.every((c, i) => c.text === P[i] + solo[i].choices[0].text), 'batch of id lists with echo', t.text);
    const s = await post('/v1/completions', { prompt: P.slice(0, 2), temperature: 0, max_tokens: 8, stream: true });
    const got = ['', ''];
    for (const line of s.text.split('\n')) {
      if (!line.startsWith('data: {')) continue;
      const ch = JSON.parse(line.slice(6)).choices || [];
      for (const c of ch) got[c.index] += c.text || '';
    }
    check(s.status === 200 && got[0] === solo[0].choices[0].text && got[1] === solo[1].choices[0].text, 'batch streamed', got);
    expect400(await post('/v1/completions', { prompt: ['a', [1]] }), 'prompt', 'batch of mixed kinds');
    expect400(await post('/v1/completions', { prompt: ['a', 'b', 'c', 'd', 'e'], n: 4 }), 'prompt', 'batch over 16 choices');
  }
} finally {
  await srv.stop();
}
process.exit(summary('compat'));
