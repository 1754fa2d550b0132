// Tool calls out of the model's answer, end to end through the official
// `openai` client. The demo model has not learned tools, so a copy of it
// (made here, in the build dir) gets the real Qwen3 chat template (same
// ChatML tokens; it renders tools and writes <tool_call> blocks), and the
// calls are produced by a guided_grammar in that exact text form:
// - message.tool_calls (id call_..., type function, arguments a JSON
//   string), content null, finish_reason "tool_calls"; parallel calls;
// - streamed delta.tool_calls reassemble (by hand and by the client's
//   .stream() helper) into the same calls, same seed;
// - a call after a thought: the thought in reasoning_content;
// - malformed and truncated calls come back as content (finish_reason
//   "malformed_tool_call" / "length"), never as tool_calls;
// - tool_choice none: nothing is parsed;
// - round trip: an assistant message with tool_calls and a role "tool"
//   result render as @huggingface/jinja renders the same template
//   (greedy chat == completion over the HF-rendered prompt).
import fs from 'node:fs';
import path from 'node:path';
import { createRequire } from 'node:module';
import { startServer, check, summary, MODEL, ROOT, BUILD } from './lib.mjs';

const require = createRequire(path.join(ROOT, 'tests/oracle/package.json'));
const OpenAI = require('openai').default ?? require('openai');
const { Template } = require('@huggingface/jinja');
const { Tokenizer } = require('tokenizers');

const SHARED = process.env.TERN_SHARED || path.resolve(ROOT, '../shared');
const qwenCfg = JSON.parse(fs.readFileSync(path.join(SHARED, 'tokenizers/qwen3/tokenizer_config.json'), 'utf8'));
const dir = path.join(BUILD, 'toolcalls-demo');
fs.rmSync(dir, { recursive: true, force: true });
fs.mkdirSync(dir, { recursive: true });
for (const f of fs.readdirSync(MODEL)) {
  if (f === 'tokenizer_config.json') continue;
  fs.symlinkSync(path.join(MODEL, f), path.join(dir, f));
}
const cfg = JSON.parse(fs.readFileSync(path.join(MODEL, 'tokenizer_config.json'), 'utf8'));
cfg.chat_template = qwenCfg.chat_template;
fs.writeFileSync(path.join(dir, 'tokenizer_config.json'), JSON.stringify(cfg));

const M = 'tern-demo';
const tools = [
  { type: 'function', function: { name: 'get_weather', description: 'Weather of a city', parameters: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] } } },
  { type: 'function', function: { name: 'get_time', description: 'Time in a zone', parameters: { type: 'object', properties: { zone: { type: 'string' } }, required: ['zone'] } } },
];
const CALL = (name, key) => `"<tool_call>\\n{\\"name\\": \\"${name}\\", \\"arguments\\": {\\"${key}\\": \\"" [a-zA-Z ]{1,12} "\\"}}\\n</tool_call>"`;
const G_ONE = `root ::= ${CALL('get_weather', 'city')}`;
const G_TWO = `root ::= ${CALL('get_weather', 'city')} "\\n" ${CALL('get_time', 'zone')}`;
const G_TEXT_THEN_CALL = `root ::= "Let me look." "\\n\\n" ${CALL('get_weather', 'city')}`;
const G_BAD = 'root ::= "<tool_call>\\n{\\"name\\": \\"get_weather\\", \\"arguments\\": {\\"city\\": }}\\n</tool_call>"';
const msgs = [{ role: 'user', content: 'What is the weather in Paris?' }];
const off = { chat_template_kwargs: { enable_thinking: false } };

// delta.tool_calls -> [{id, name, arguments}] by index
function reassemble(chunks) {
  const calls = [];
  let content = '', reasoning = '', finish = null;
  for (const ch of chunks) {
    const c = ch.choices[0];
    if (!c) continue;
    if (c.delta.content) content += c.delta.content;
    if (c.delta.reasoning_content) reasoning += c.delta.reasoning_content;
    for (const t of c.delta.tool_calls ?? []) {
      if (!calls[t.index]) calls[t.index] = { id: t.id, name: t.function?.name, arguments: '' };
      calls[t.index].arguments += t.function?.arguments ?? '';
    }
    if (c.finish_reason) finish = c.finish_reason;
  }
  return { calls, content, reasoning, finish };
}
const plain = (m) => (m.tool_calls ?? []).map((t) => ({ name: t.function.name, arguments: t.function.arguments }));

const tsrv = await startServer(['--model-name', M], { model: dir });

try {
  const client = new OpenAI({ baseURL: tsrv.url + '/v1', apiKey: 'none', maxRetries: 0, timeout: 60000 });
  check(/hermes/.test(tsrv.log()), 'the server detects the hermes format of the Qwen3 template', tsrv.log().slice(-800));

  // ---- one call, sampled; streamed == non-streamed (same seed)
  let n = 0;
  for (const seed of [1, 2, 3, 4, 5]) {
    const body = { model: M, messages: msgs, tools, max_tokens: 80, temperature: 1, seed, guided_grammar: G_ONE, ...off };
    const r = await client.chat.completions.create(body);
    const c = r.choices[0], m = c.message;
    const tc = m.tool_calls?.[0];
    check(c.finish_reason === 'tool_calls', `seed ${seed}: finish_reason tool_calls`, c);
    check(m.content === null && m.tool_calls?.length === 1, `seed ${seed}: one call, content null`, m);
    if (!tc) continue;
    check(/^call_[A-Za-z0-9]{24}$/.test(tc.id) && tc.type === 'function' && tc.function.name === 'get_weather', `seed ${seed}: call id/type/name`, tc);
    let args = null;
    try { args = JSON.parse(tc.function.arguments); } catch { /* checked */ }
    check(typeof tc.function.arguments === 'string' && args && typeof args.city === 'string' && Object.keys(args).length === 1, `seed ${seed}: arguments a JSON string`, tc.function.arguments);
    const chunks = [];
    for await (const ch of await client.chat.completions.create({ ...body, stream: true })) chunks.push(ch);
    const s = reassemble(chunks);
    check(JSON.stringify(s.calls.map((x) => ({ name: x.name, arguments: x.arguments }))) === JSON.stringify(plain(m)), `seed ${seed}: streamed calls == non-streamed`, { s: s.calls, m: plain(m) });
    check(s.calls[0] && /^call_/.test(s.calls[0].id) && s.content === '' && s.finish === 'tool_calls', `seed ${seed}: stream id, no content, finish`, s);
    const pieces = chunks.filter((ch) => ch.choices[0]?.delta?.tool_calls).length;
    check(pieces >= 2, `seed ${seed}: id+name first, then arguments pieces`, pieces);
    // the client's own accumulator
    const helper = client.chat.completions.stream(body);
    const fin = await helper.finalChatCompletion();
    check(JSON.stringify(plain(fin.choices[0].message)) === JSON.stringify(plain(m)), `seed ${seed}: .stream() helper assembles the same call`, fin.choices[0].message);
    n++;
  }
  check(n === 5, 'five sampled calls parsed', n);

  // ---- parallel calls, text before a call
  const two = await client.chat.completions.create({ model: M, messages: msgs, tools, max_tokens: 120, temperature: 1, seed: 7, guided_grammar: G_TWO, ...off });
  check(two.choices[0].message.tool_calls?.length === 2 && two.choices[0].message.tool_calls[1].function.name === 'get_time', 'two parallel calls', two.choices[0].message);
  const ids = new Set(two.choices[0].message.tool_calls?.map((t) => t.id));
  check(ids.size === 2, 'distinct call ids', [...ids]);
  const tx = await client.chat.completions.create({ model: M, messages: msgs, tools, max_tokens: 120, temperature: 0, guided_grammar: G_TEXT_THEN_CALL, ...off });
  check(tx.choices[0].message.content === 'Let me look.' && tx.choices[0].message.tool_calls?.length === 1, 'text before a call stays content (the whitespace before the call dropped)', tx.choices[0].message);

  // ---- thinking on: a thought, then the call
  let thoughtCall = 0;
  for (const seed of [1, 2, 3, 4]) {
    const r = await client.chat.completions.create({ model: M, messages: msgs, tools, max_tokens: 200, temperature: 0.8, seed, guided_grammar: G_ONE });
    const m = r.choices[0].message;
    if (r.choices[0].finish_reason !== 'tool_calls') continue;
    check(!(m.content ?? '').includes('<tool_call>') && m.tool_calls.length === 1, `thinking seed ${seed}: the call parsed after the thought`, m);
    if (m.reasoning_content) thoughtCall++;
  }
  check(thoughtCall >= 1, 'a call after a non-empty thought', thoughtCall);

  // ---- malformed / truncated: content, never tool_calls
  const bad = await client.chat.completions.create({ model: M, messages: msgs, tools, max_tokens: 80, temperature: 0, guided_grammar: G_BAD, ...off });
  check(bad.choices[0].finish_reason === 'malformed_tool_call' && !bad.choices[0].message.tool_calls &&
    bad.choices[0].message.content === '<tool_call>\n{"name": "get_weather", "arguments": {"city": }}\n</tool_call>', 'malformed call -> content + finish_reason malformed_tool_call', bad.choices[0]);
  const badS = [];
  for await (const ch of await client.chat.completions.create({ model: M, messages: msgs, tools, max_tokens: 80, temperature: 0, guided_grammar: G_BAD, ...off, stream: true })) badS.push(ch);
  const bs = reassemble(badS);
  check(bs.calls.length === 0 && bs.content === bad.choices[0].message.content && bs.finish === 'malformed_tool_call', 'malformed call streamed: content only, same', bs);
  const cut = await client.chat.completions.create({ model: M, messages: msgs, tools, max_tokens: 12, temperature: 0, guided_grammar: G_ONE, ...off });
  check(cut.choices[0].finish_reason === 'length' && !cut.choices[0].message.tool_calls && cut.choices[0].message.content.startsWith('<tool_call>'), 'truncated call -> content, length', cut.choices[0]);

  // ---- tool_choice none: the tools are hidden and nothing is parsed
  const none = await client.chat.completions.create({ model: M, messages: msgs, tools, tool_choice: 'none', max_tokens: 80, temperature: 0, guided_grammar: G_ONE, ...off });
  check(!none.choices[0].message.tool_calls && none.choices[0].message.content.startsWith('<tool_call>') && none.choices[0].finish_reason === 'stop', 'tool_choice none: no parsing', none.choices[0]);

  // ---- round trip through the template, against @huggingface/jinja
  const convo = [
    { role: 'user', content: 'What is the weather in Paris?' },
    { role: 'assistant', content: null, tool_calls: [{ id: 'call_abc', type: 'function', function: { name: 'get_weather', arguments: '{"city": "Paris"}' } }] },
    { role: 'tool', tool_call_id: 'call_abc', content: '{"temperature": 21, "sky": "clear"}' },
  ];
  const rt = await client.chat.completions.create({ model: M, messages: convo, tools, max_tokens: 24, temperature: 0, ...off });
  const hfMsgs = convo.map((m) => m.tool_calls ? { ...m, content: '', tool_calls: m.tool_calls.map((t) => ({ ...t, function: { name: t.function.name, arguments: JSON.parse(t.function.arguments) } })) } : m);
  const rendered = new Template(qwenCfg.chat_template).render({ messages: hfMsgs, tools, add_generation_prompt: true, enable_thinking: false });
  check(rendered.includes('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>') && rendered.includes('<tool_response>'), 'HF render holds the call and the result', rendered);
  const hf = Tokenizer.fromFile(path.join(MODEL, 'tokenizer.json'));
  const idsHF = (await hf.encode(rendered, null, { addSpecialTokens: false })).getIds();
  check(rt.usage.prompt_tokens === idsHF.length, 'round trip: prompt tokens == HF render', { tern: rt.usage.prompt_tokens, hf: idsHF.length });
  const ref = await client.completions.create({ model: M, prompt: idsHF, max_tokens: 24, temperature: 0 });
  check(ref.choices[0].text === rt.choices[0].message.content, 'round trip: greedy chat == completion over the HF-rendered prompt', { chat: rt.choices[0].message.content, ref: ref.choices[0].text });

  // ---- bad input in messages
  try {
    await client.chat.completions.create({ model: M, messages: [msgs[0], { role: 'assistant', content: null, tool_calls: [{ id: 'x', type: 'function', function: { name: 'f', arguments: '{oops' } }] }], max_tokens: 4 });
    check(false, 'arguments that are not JSON: 400');
  } catch (e) {
    check(e.status === 400 && /tool_calls\[0\]/.test(e.error?.param ?? ''), 'arguments that are not JSON: 400 naming the call', e.error);
  }
} finally {
  { const ex = await tsrv.stop(); check(ex.code === 0 && !/Sanitizer|runtime error|LeakSanitizer/.test(tsrv.log()), 'server exits cleanly (no sanitizer report)', { ex, log: tsrv.log().slice(-1500) }); }
  fs.rmSync(dir, { recursive: true, force: true });
}
process.exit(summary('toolcalls'));
