// The harmony format (gpt-oss) end to end through the official `openai`
// client. No harmony-trained model is small enough to ship, so a copy of
// the demo model (made here, in the build dir) gets a tokenizer with the
// seven harmony special tokens (<|start|> <|channel|> <|message|> <|end|>
// <|return|> <|call|> <|constrain|>, in place of seven rare merges) and
// tern's harmony test template (tests/template/templates/harmony). The
// demo model never writes harmony by itself: the structure comes from the
// grammar (response_format / tool_choice), which is what a real gpt-oss
// row gets too. What this shows: detection from the vocabulary, the
// analysis header forced and the budget closing it, the final header +
// schema JSON, forced calls to functions.NAME, the split of the real token
// stream into reasoning_content / content / tool_calls (streamed ==
// non-streamed), the Responses API items, and the prompt of a history with
// thinking, tool calls and tool results (== @huggingface/jinja + HF
// tokenizers). What it cannot show: that a trained gpt-oss writes
// harmony as the splitter expects (tests/server/test_harmony.c covers
// gpt-oss-shaped outputs split at random boundaries).
import fs from 'node:fs';
import path from 'node:path';
import { createRequire } from 'node:module';
import { startServer, check, summary, MODEL, ROOT, BUILD } from './lib.mjs';

const require = createRequire(path.join(ROOT, 'tests/oracle/package.json'));
const OpenAI = require('openai').default ?? require('openai');
const { Template } = require('@huggingface/jinja');
const { Tokenizer } = require('tokenizers');

const HARMONY = ['<|start|>', '<|channel|>', '<|message|>', '<|end|>', '<|return|>', '<|call|>', '<|constrain|>'];
const dir = path.join(BUILD, 'harmony-demo');
fs.rmSync(dir, { recursive: true, force: true });
fs.mkdirSync(dir, { recursive: true });
for (const f of fs.readdirSync(MODEL)) {
  if (f === 'tokenizer_config.json' || f === 'tokenizer.json') continue;
  fs.symlinkSync(path.join(MODEL, f), path.join(dir, f));
}
// the seven highest ids become the harmony tokens: their vocabulary entries
// and the merges that made them go (the model's logits keep their width)
const tj = JSON.parse(fs.readFileSync(path.join(MODEL, 'tokenizer.json'), 'utf8'));
const vocab = tj.model.vocab;
const byId = Object.fromEntries(Object.entries(vocab).map(([k, v]) => [v, k]));
const maxId = Math.max(...Object.values(vocab));
const freed = new Set();
HARMONY.forEach((tok, i) => {
  const id = maxId - HARMONY.length + 1 + i; // ascending, as HF tokenizers expects added tokens
  freed.add(byId[id]);
  delete vocab[byId[id]];
  tj.added_tokens.push({ id, content: tok, single_word: false, lstrip: false, rstrip: false, normalized: false, special: true });
});
tj.model.merges = tj.model.merges.filter((m) => !freed.has(Array.isArray(m) ? m.join('') : m.replace(' ', '')));
fs.writeFileSync(path.join(dir, 'tokenizer.json'), JSON.stringify(tj));
const template = fs.readFileSync(path.join(ROOT, 'tests/template/templates/harmony/chat_template.jinja'), 'utf8');
const cfg = JSON.parse(fs.readFileSync(path.join(MODEL, 'tokenizer_config.json'), 'utf8'));
cfg.chat_template = template;
delete cfg.added_tokens_decoder;
fs.writeFileSync(path.join(dir, 'tokenizer_config.json'), JSON.stringify(cfg));

const M = 'harmony-demo';
const ask = [{ role: 'user', content: 'Is the sky blue? Answer in JSON.' }];
const SCHEMA = { type: 'object', properties: { answer: { type: 'string', enum: ['yes', 'no'] } }, required: ['answer'], additionalProperties: false };
const RF = { type: 'json_schema', json_schema: { name: 'yesno', schema: SCHEMA, strict: true } };
const TOOLS = [
  { type: 'function', function: { name: 'get_weather', description: 'Weather of a city', parameters: { type: 'object', properties: { city: { type: 'string', enum: ['Tokyo', 'Paris'] } }, required: ['city'], additionalProperties: false } } },
  { type: 'function', function: { name: 'get_time', description: 'Local time', parameters: { type: 'object', properties: { zone: { type: 'string', enum: ['UTC', 'JST'] } }, required: ['zone'], additionalProperties: false } } },
];
const tryJSON = (s) => { try { return JSON.parse(s); } catch { return null; } };
const noMarks = (s) => typeof s !== 'string' || !/<\|(start|channel|message|end|return|call|constrain)\|>/.test(s);

// streamed chunks -> {reasoning, content, calls, finish}
function collect(chunks) {
  let reasoning = '', content = '', finish = null;
  const calls = [];
  for (const ch of chunks) {
    const c = ch.choices?.[0];
    if (!c) continue;
    reasoning += c.delta?.reasoning_content ?? '';
    content += c.delta?.content ?? '';
    for (const t of c.delta?.tool_calls ?? []) {
      if (!calls[t.index]) calls[t.index] = { name: t.function?.name, arguments: '' };
      calls[t.index].arguments += t.function?.arguments ?? '';
    }
    if (c.finish_reason) finish = c.finish_reason;
  }
  return { reasoning, content, calls, finish };
}

const srv = await startServer([], { model: dir });
try {
  check(/harmony format/.test(srv.log()), 'the server logs the harmony format', srv.log().slice(-600));
  const client = new OpenAI({ baseURL: srv.url + '/v1', apiKey: 'none', maxRetries: 0, timeout: 120000 });

  // ---- response_format: free analysis (closed at the budget), then the final message is the schema's JSON
  for (const seed of [1, 2, 3]) {
    const body = { model: M, messages: ask, response_format: RF, max_tokens: 400, temperature: 0.9, seed, reasoning_effort: 'minimal', logprobs: true };
    const r = await client.chat.completions.create(body);
    const m = r.choices[0].message;
    const toks = r.choices[0].logprobs.content.map((x) => x.token);
    delete r.choices[0].logprobs; // keep failure details short
    let parsed = null;
    try { parsed = JSON.parse(m.content); } catch { /* checked */ }
    check(parsed && ['yes', 'no'].includes(parsed.answer) && Object.keys(parsed).length === 1, `seed ${seed}: content is the schema's JSON`, m);
    check(typeof m.reasoning_content === 'string' && m.reasoning_content.length > 0 && m.reasoning === m.reasoning_content, `seed ${seed}: the analysis is reasoning_content`, m);
    check(noMarks(m.content) && noMarks(m.reasoning_content), `seed ${seed}: no harmony token left in either part`, m);
    check(r.choices[0].finish_reason === 'stop' && !m.tool_calls, `seed ${seed}: finish_reason stop, no calls`, r.choices[0]);
    // the token stream: the opening forced, at most 64 analysis tokens (minimal), <|end|>, the final header
    const open = toks.indexOf('<|message|>');
    check(toks[0] === '<|channel|>' && toks.slice(0, open + 1).join('') === '<|channel|>analysis<|message|>', `seed ${seed}: the analysis header opens the row`, toks.slice(0, 8));
    const end = toks.indexOf('<|end|>');
    check(end > open && end - open - 1 <= 64, `seed ${seed}: the analysis within the budget (64)`, end - open - 1);
    check(toks.slice(end + 1).join('').startsWith('<|start|>assistant<|channel|>final'), `seed ${seed}: then the final header`, toks.slice(end + 1, end + 8));
    const marks = toks.slice(end + 1).filter((x) => HARMONY.includes(x));
    check(marks[0] === '<|start|>' && marks[1] === '<|channel|>' && marks.at(-1) === '<|message|>' && marks.length <= 4 &&
      !toks.slice(end + 1).some((x) => x.startsWith('<|') && !HARMONY.includes(x)), `seed ${seed}: the header written with its special tokens, not spelt`, marks);
    // streamed == non-streamed
    const chunks = [];
    for await (const ch of await client.chat.completions.create({ ...body, logprobs: false, stream: true })) chunks.push(ch);
    const s = collect(chunks);
    check(s.reasoning === m.reasoning_content && s.content === m.content && s.finish === 'stop', `seed ${seed}: streamed == non-streamed`, { s, m });
  }
  // reasoning_effort none: a budget of 0 closes the analysis at once
  const none = await client.chat.completions.create({ model: M, messages: ask, response_format: RF, max_tokens: 300, temperature: 0, reasoning_effort: 'none' });
  check(!none.choices[0].message.reasoning_content && tryJSON(none.choices[0].message.content)?.answer !== undefined, 'effort none: empty analysis, the JSON answer', none.choices[0].message);
  // include_reasoning false drops the analysis
  const hidden = await client.chat.completions.create({ model: M, messages: ask, response_format: RF, max_tokens: 300, reasoning_effort: 'minimal', temperature: 0, include_reasoning: false });
  check(!hidden.choices[0].message.reasoning_content && tryJSON(hidden.choices[0].message.content)?.answer !== undefined, 'include_reasoning false: no reasoning_content', hidden.choices[0].message);
  // the client's parse helper
  const parsed = await client.chat.completions.parse({ model: M, messages: ask, response_format: RF, max_tokens: 300, temperature: 0, reasoning_effort: 'minimal' });
  check(['yes', 'no'].includes(parsed.choices[0].message.parsed?.answer), 'chat.completions.parse reads the final message', parsed.choices[0].message);

  // ---- tool_choice required / named: a forced call to functions.NAME after the analysis
  for (const [choice, want] of [['required', null], [{ type: 'function', function: { name: 'get_time' } }, 'get_time']]) {
    const body = { model: M, messages: [{ role: 'user', content: 'Weather in Tokyo?' }], tools: TOOLS, tool_choice: choice, max_tokens: 400, temperature: 0.7, seed: 5, reasoning_effort: 'minimal' };
    const r = await client.chat.completions.create(body);
    const c = r.choices[0], m = c.message;
    const tc = m.tool_calls?.[0];
    let args = null;
    try { args = JSON.parse(tc.function.arguments); } catch { /* checked */ }
    const name = tc?.function?.name;
    check(m.tool_calls?.length === 1 && (want ? name === want : ['get_weather', 'get_time'].includes(name)) && /^call_[A-Za-z0-9]{24}$/.test(tc.id), `${JSON.stringify(choice)}: one call`, m);
    check(args && (name === 'get_weather' ? ['Tokyo', 'Paris'].includes(args.city) : ['UTC', 'JST'].includes(args.zone)), `${JSON.stringify(choice)}: arguments valid for the tool's schema`, tc);
    check(c.finish_reason === 'tool_calls' && m.content === null && noMarks(m.reasoning_content), `${JSON.stringify(choice)}: finish_reason tool_calls, content null`, c);
    const chunks = [];
    for await (const ch of await client.chat.completions.create({ ...body, stream: true })) chunks.push(ch);
    const s = collect(chunks);
    check(JSON.stringify(s.calls) === JSON.stringify(m.tool_calls.map((t) => ({ name: t.function.name, arguments: t.function.arguments }))) &&
      s.reasoning === (m.reasoning_content ?? '') && s.finish === 'tool_calls', `${JSON.stringify(choice)}: streamed calls == non-streamed`, { s, m });
  }

  // ---- tool_choice auto: nothing is forced; the demo writes plain text, which is content
  const auto = await client.chat.completions.create({ model: M, messages: ask, tools: TOOLS, max_tokens: 24, temperature: 0 });
  check(typeof auto.choices[0].message.content === 'string' && auto.choices[0].message.content.length > 0 && !auto.choices[0].message.tool_calls, 'auto: plain text is content', auto.choices[0]);

  // ---- history: thinking, a tool call and its result reach the template as gpt-oss's expects
  const history = [
    { role: 'system', content: 'Answer briefly.' },
    { role: 'user', content: 'Weather in Tokyo?' },
    { role: 'assistant', content: null, reasoning_content: 'The user wants the weather; call the tool.', tool_calls: [{ id: 'call_1', type: 'function', function: { name: 'get_weather', arguments: '{"city":"Tokyo"}' } }] },
    { role: 'tool', tool_call_id: 'call_1', content: '{"temp": 21}' },
  ];
  const hf = Tokenizer.fromFile(path.join(dir, 'tokenizer.json'));
  for (const effort of [undefined, 'high', 'none']) {
    const tplMsgs = history.map((m) => m.role === 'assistant'
      ? { role: 'assistant', content: '', thinking: m.reasoning_content, reasoning_content: m.reasoning_content, tool_calls: m.tool_calls.map((t) => ({ ...t, function: { name: t.function.name, arguments: JSON.parse(t.function.arguments) } })) }
      : m);
    const ctx = { messages: tplMsgs, tools: TOOLS, add_generation_prompt: true };
    if (effort) ctx.reasoning_effort = effort === 'none' ? 'low' : effort; // none reaches the template as low
    const rendered = new Template(template).render(ctx);
    check(rendered.includes('<|start|>assistant<|channel|>analysis<|message|>The user wants the weather') && rendered.includes('<|start|>functions.get_weather to=assistant'), `history (${effort}): the HF render has the thought and the result`, rendered.slice(-400));
    const ids = (await hf.encode(rendered, null, { addSpecialTokens: false })).getIds();
    const body = { model: M, messages: history, tools: TOOLS, max_tokens: 16, temperature: 0 }; // auto: no grammar on a harmony model
    if (effort) body.reasoning_effort = effort;
    const chat = await client.chat.completions.create(body);
    const raw = await client.completions.create({ model: M, prompt: ids, max_tokens: 16, temperature: 0 });
    check(chat.usage.prompt_tokens === ids.length, `history (${effort}): prompt tokens == HF render + HF tokenizers`, { tern: chat.usage.prompt_tokens, hf: ids.length });
    // (effort none: its budget of 0 forces an empty analysis first, so the outputs differ by design)
    if (effort !== 'none')
      check(chat.choices[0].message.content === raw.choices[0].text, `history (${effort}): greedy chat == completion of the HF-rendered prompt`, { chat: chat.choices[0].message.content, raw: raw.choices[0].text });
  }

  // a preamble echoed back with its thought and call: the template has one analysis slot (gpt-oss's refuses
  // both); the preamble joins the thought
  const echoed = [history[0], history[1], { ...history[2], content: 'Let me check.' }, history[3]];
  const folded = history.map((m) => m.role === 'assistant'
    ? { role: 'assistant', content: '', thinking: m.reasoning_content + '\n\nLet me check.', tool_calls: m.tool_calls.map((t) => ({ ...t, function: { name: t.function.name, arguments: JSON.parse(t.function.arguments) } })) }
    : m);
  const fIds = (await hf.encode(new Template(template).render({ messages: folded, tools: TOOLS, add_generation_prompt: true }), null, { addSpecialTokens: false })).getIds();
  const ec = await client.chat.completions.create({ model: M, messages: echoed, tools: TOOLS, max_tokens: 4, temperature: 0 });
  check(ec.usage.prompt_tokens === fIds.length, 'history: preamble + thought + call render as one analysis', { tern: ec.usage.prompt_tokens, hf: fIds.length });

  // ---- the Responses API: reasoning + message items; a function_call item
  const rr = await client.responses.create({ model: M, input: 'Is the sky blue?', max_output_tokens: 400, temperature: 0, reasoning: { effort: 'minimal' }, text: { format: { type: 'json_schema', name: 'yesno', schema: SCHEMA, strict: true } } });
  const types = rr.output.map((o) => o.type);
  check(types[0] === 'reasoning' && types.includes('message'), 'responses: a reasoning item, then the message', types);
  check(['yes', 'no'].includes(tryJSON(rr.output_text)?.answer), 'responses: output_text is the JSON', rr.output_text);
  const rs = client.responses.stream({ model: M, input: 'Is the sky blue?', max_output_tokens: 400, temperature: 0, reasoning: { effort: 'minimal' }, text: { format: { type: 'json_schema', name: 'yesno', schema: SCHEMA, strict: true } } });
  let rDelta = '';
  for await (const ev of rs) if (ev.type === 'response.reasoning_text.delta') rDelta += ev.delta;
  const fin = await rs.finalResponse();
  const rItem = rr.output.find((o) => o.type === 'reasoning');
  const textOf = (x) => x.output.filter((i) => i.type === 'message').flatMap((i) => i.content).map((c) => c.text).join('');
  check(textOf(fin) === rr.output_text && rDelta === (rItem?.content?.[0]?.text ?? ''), 'responses: streamed == non-streamed (answer and reasoning)', { fin: textOf(fin), rr: rr.output_text, rDelta });
  const rc = await client.responses.create({ model: M, input: 'Time?', max_output_tokens: 400, temperature: 0, reasoning: { effort: 'minimal' }, tools: TOOLS.map((t) => ({ type: 'function', ...t.function })), tool_choice: 'required' });
  const fc = rc.output.find((o) => o.type === 'function_call');
  check(fc && ['get_weather', 'get_time'].includes(fc.name) && tryJSON(fc.arguments) && noMarks(fc.arguments), 'responses: a function_call item', rc.output);
  // a reasoning item before a function_call reaches the template as that turn's thought, as in chat
  const items = [
    { role: 'user', content: 'Weather in Tokyo?' },
    { type: 'reasoning', id: 'rs_1', summary: [], content: [{ type: 'reasoning_text', text: 'The user wants the weather; call the tool.' }] },
    { type: 'function_call', call_id: 'call_1', name: 'get_weather', arguments: '{"city":"Tokyo"}' },
    { type: 'function_call_output', call_id: 'call_1', output: '{"temp": 21}' },
  ];
  const ri = await client.responses.create({ model: M, input: items, instructions: 'Answer briefly.', max_output_tokens: 8, temperature: 0, tools: TOOLS.map((t) => ({ type: 'function', ...t.function })) });
  const ci = await client.chat.completions.create({ model: M, messages: history, tools: TOOLS, max_tokens: 8, temperature: 0 });
  check(ri.usage.input_tokens === ci.usage.prompt_tokens, 'responses: a reasoning item renders as the chat thought', { responses: ri.usage.input_tokens, chat: ci.usage.prompt_tokens });
} finally {
  await srv.stop();
}

// ---- --reasoning-budget without a grammar: the analysis is opened and closed at the budget, the rest is free
const srv2 = await startServer(['--reasoning-budget', '5'], { model: dir });
try {
  const client = new OpenAI({ baseURL: srv2.url + '/v1', apiKey: 'none', maxRetries: 0, timeout: 120000 });
  for (const seed of [1, 2]) {
    const r = await client.chat.completions.create({ model: M, messages: ask, max_tokens: 40, temperature: 0.8, seed, logprobs: true });
    const toks = r.choices[0].logprobs.content.map((x) => x.token);
    const open = toks.indexOf('<|message|>'), end = toks.indexOf('<|end|>');
    check(toks.slice(0, open + 1).join('') === '<|channel|>analysis<|message|>' && end > open && end - open - 1 <= 5,
      `--reasoning-budget 5 (seed ${seed}): the analysis opened, closed within 5 tokens`, toks.slice(0, end + 2));
    check(typeof r.choices[0].message.reasoning_content === 'string' && r.choices[0].message.reasoning_content.length > 0 && noMarks(r.choices[0].message.reasoning_content),
      `--reasoning-budget 5 (seed ${seed}): those tokens are reasoning_content`, r.choices[0].message);
  }
} finally {
  await srv2.stop();
}
process.exit(summary('harmony'));
