// POST /v1/responses through the official `openai` client
// (client.responses.create / .stream / .parse) on the demo model. The
// outside reference is the chat path: the same conversation through
// /v1/chat/completions must give the same thought (reasoning item) and
// answer (message), greedy; the event stream must follow the documented
// sequence (created, in_progress, item added/done around text deltas,
// completed; sequence_number 0, 1, 2, ...) and reassemble into the
// non-streamed output; text.format json_schema output validates (ajv);
// function tools give function_call items (the tool-tuned demo model in
// auto mode, its call's output continuing the stored conversation; and
// forced by guided_grammar on a demo copy with the Qwen3 template;
// tool_choice required / named: valid calls even for a prompt that needs
// none, streamed == non-streamed);
// function_call / function_call_output
// input items render like the equivalent chat messages; previous_response_id
// continues a conversation; bad input is a 400 naming the field.
import fs from 'node:fs';
import path from 'node:path';
import { createRequire } from 'node:module';
import { startServer, check, summary, MODEL, ROOT, BUILD } from './lib.mjs';

const require = createRequire(path.join(ROOT, 'tests/oracle/package.json'));
const OpenAI = require('openai').default ?? require('openai');
const Ajv = require('ajv');

const M = 'tern-demo';
const SHARED = process.env.TERN_SHARED || path.resolve(ROOT, '../shared');

async function expectError(p, status, what, param) {
  try {
    await p;
    check(false, `${what}: expected ${status}`, 'got success');
  } catch (e) {
    check(e.status === status && (!param || e.error?.param === param), `${what}: ${status} naming ${param}`, e.error ?? String(e));
  }
}

// the demo copy with the Qwen3 template (renders tools, writes <tool_call>)
const dir = path.join(BUILD, 'responses-demo');
fs.rmSync(dir, { recursive: true, force: true });
fs.mkdirSync(dir, { recursive: true });
for (const f of fs.readdirSync(MODEL)) if (f !== 'tokenizer_config.json') fs.symlinkSync(path.join(MODEL, f), path.join(dir, f));
const cfg = JSON.parse(fs.readFileSync(path.join(MODEL, 'tokenizer_config.json'), 'utf8'));
cfg.chat_template = JSON.parse(fs.readFileSync(path.join(SHARED, 'tokenizers/qwen3/tokenizer_config.json'), 'utf8')).chat_template;
fs.writeFileSync(path.join(dir, 'tokenizer_config.json'), JSON.stringify(cfg));

let srv = await startServer();
try {
  const client = new OpenAI({ baseURL: srv.url + '/v1', apiKey: 'none', maxRetries: 0, timeout: 60000 });
  const ask = 'Hello! What is your name?';

  // ---- create == the chat path
  const r = await client.responses.create({ model: M, input: ask, max_output_tokens: 160, temperature: 0 });
  const chat = (await client.chat.completions.create({ model: M, messages: [{ role: 'user', content: ask }], max_tokens: 160, temperature: 0 })).choices[0].message;
  check(r.object === 'response' && /^resp_/.test(r.id) && r.status === 'completed', 'response object', r);
  const rs = r.output.find((o) => o.type === 'reasoning'), msg = r.output.find((o) => o.type === 'message');
  check(rs && rs.content?.[0]?.type === 'reasoning_text' && rs.content[0].text === chat.reasoning_content, 'reasoning item == chat reasoning_content', { rs, chat });
  check(msg && msg.role === 'assistant' && msg.content[0].type === 'output_text' && msg.content[0].text === chat.content, 'message == chat content', { msg, chat });
  check(r.output_text === chat.content, 'output_text (the client sums the message texts)', r.output_text);
  check(r.usage && r.usage.input_tokens > 0 && r.usage.output_tokens > 0 && r.usage.total_tokens === r.usage.input_tokens + r.usage.output_tokens &&
    r.usage.output_tokens_details.reasoning_tokens > 0 && r.usage.output_tokens_details.reasoning_tokens < r.usage.output_tokens, 'usage', r.usage);
  const sum = await client.responses.create({ model: M, input: ask, max_output_tokens: 160, temperature: 0, reasoning: { summary: 'auto' } });
  check(sum.output[0].summary?.[0]?.text === chat.reasoning_content, 'reasoning.summary: the thought as its summary', sum.output[0]);
  const noThink = await client.responses.create({ model: M, input: ask, max_output_tokens: 60, temperature: 0, reasoning: { effort: 'none' } });
  check(!noThink.output.some((o) => o.type === 'reasoning') && noThink.output_text.length > 0, 'reasoning.effort none: no reasoning item', noThink.output);
  const inst = await client.responses.create({ model: M, instructions: 'You are terse.', input: ask, max_output_tokens: 8, temperature: 0 });
  check(inst.instructions === 'You are terse.' && inst.usage.input_tokens > r.usage.input_tokens, 'instructions lead the prompt', inst.usage);
  const cut = await client.responses.create({ model: M, input: ask, max_output_tokens: 5, temperature: 0 });
  check(cut.status === 'incomplete' && cut.incomplete_details?.reason === 'max_output_tokens' && cut.usage.output_tokens === 5, 'max_output_tokens: incomplete', cut);

  // ---- stream: the documented sequence, reassembled == non-streamed
  const events = [];
  const st = client.responses.stream({ model: M, input: ask, max_output_tokens: 160, temperature: 0 });
  for await (const ev of st) events.push(ev);
  const fin = await st.finalResponse();
  const textOf = (x) => x.output.filter((i) => i.type === 'message').flatMap((i) => i.content).map((c) => c.text).join('');
  check(textOf(fin) === r.output_text && fin.output.find((o) => o.type === 'reasoning')?.content?.[0]?.text === rs?.content?.[0]?.text, 'stream finalResponse == create', fin);
  check(events.every((e, i) => e.sequence_number === i), 'sequence_number 0, 1, 2, ...', events.map((e) => e.sequence_number).slice(0, 12));
  const types = events.map((e) => e.type);
  check(types[0] === 'response.created' && types[1] === 'response.in_progress' && types.at(-1) === 'response.completed', 'created, in_progress ... completed', [types.slice(0, 3), types.at(-1)]);
  const want = ['response.output_item.added', 'response.content_part.added', 'response.output_text.delta', 'response.output_text.done', 'response.content_part.done', 'response.output_item.done'];
  const firstOf = (t) => types.indexOf(t), lastOf = (t) => types.lastIndexOf(t);
  check(want.every((t) => firstOf(t) > 0) && firstOf('response.content_part.added') < firstOf('response.output_text.delta') &&
    lastOf('response.output_text.delta') < firstOf('response.output_text.done') && lastOf('response.output_item.done') < types.length - 1, 'message events in order', types);
  const deltas = events.filter((e) => e.type === 'response.output_text.delta');
  check(deltas.map((d) => d.delta).join('') === r.output_text && deltas.every((d) => d.item_id === deltas[0].item_id && d.content_index === 0), 'text deltas join into the text', deltas.length);
  const added = events.filter((e) => e.type === 'response.output_item.added').map((e) => e.item.id);
  const done = events.filter((e) => e.type === 'response.output_item.done').map((e) => e.item.id);
  check(JSON.stringify(added) === JSON.stringify(done) && added.includes(deltas[0]?.item_id), 'every added item is done, deltas name their item', { added, done });
  const completed = events.at(-1).response;
  check(completed.status === 'completed' && completed.output.length === r.output.length && completed.usage?.output_tokens === r.usage.output_tokens, 'response.completed carries the whole response', completed);

  // ---- text.format json_schema (responses.parse) and json_object
  const schema = { type: 'object', properties: { name: { type: 'string', maxLength: 24 }, age: { type: 'integer', minimum: 0, maximum: 150 } }, required: ['name', 'age'], additionalProperties: false };
  const validate = new Ajv().compile(schema);
  let parsed = 0;
  for (const seed of [1, 2, 3, 4]) {
    let p;
    try {
      p = await client.responses.parse({ model: M, input: 'Describe a person as JSON.', max_output_tokens: 300, temperature: 0.7, seed,
        text: { format: { type: 'json_schema', name: 'person', schema, strict: true } } });
    } catch (e) {
      if (e instanceof SyntaxError) continue; /* cut off at max_output_tokens: the client parses it anyway */
      throw e;
    }
    if (p.status !== 'completed') continue;
    if (check(p.output_parsed && validate(p.output_parsed), `text.format json_schema seed ${seed}: output_parsed validates`, p.output_text)) parsed++;
    check(p.text?.format?.type === 'json_schema', 'the response repeats text.format', p.text);
  }
  check(parsed >= 2, 'json_schema answers parsed', parsed);
  const jo = await client.responses.create({ model: M, input: 'Give JSON.', max_output_tokens: 200, temperature: 0, text: { format: { type: 'json_object' } }, reasoning: { effort: 'none' } });
  let o = null;
  try { o = JSON.parse(jo.output_text); } catch { /* checked */ }
  check(jo.status !== 'completed' || (o && typeof o === 'object'), 'text.format json_object', jo.output_text);

  // ---- previous_response_id
  const t1 = await client.responses.create({ model: M, input: 'My name is Bob.', max_output_tokens: 40, temperature: 0 });
  const t2 = await client.responses.create({ model: M, input: 'What is my name?', previous_response_id: t1.id, max_output_tokens: 40, temperature: 0 });
  const alone = await client.responses.create({ model: M, input: 'What is my name?', max_output_tokens: 40, temperature: 0 });
  check(t2.previous_response_id === t1.id && t2.usage.input_tokens > alone.usage.input_tokens + t1.usage.input_tokens - 2, 'previous_response_id continues the conversation', [t2.usage, alone.usage, t1.usage]);
  // the same conversation as explicit items gives the same prompt
  const t1msg = t1.output.find((x) => x.type === 'message').content[0].text;
  const explicit = await client.responses.create({ model: M, input: [{ role: 'user', content: 'My name is Bob.' }, { role: 'assistant', content: t1msg }, { role: 'user', content: 'What is my name?' }], max_output_tokens: 40, temperature: 0 });
  check(explicit.usage.input_tokens === t2.usage.input_tokens && explicit.output_text === t2.output_text, 'stored conversation == the same items sent explicitly', [explicit.usage, t2.usage]);
  const nostore = await client.responses.create({ model: M, input: 'x', max_output_tokens: 4, store: false });
  await expectError(client.responses.create({ model: M, input: 'y', previous_response_id: nostore.id }), 404, 'store false: not kept', 'previous_response_id');

  // ---- the demo model's own calls (auto mode, no grammar): a call, its output, the answer
  const wtool = [{ type: 'function', name: 'get_weather', description: 'Get the current weather in a city.',
    parameters: { type: 'object', properties: { city: { type: 'string' }, unit: { type: 'string', enum: ['celsius', 'fahrenheit'] } }, required: ['city'], additionalProperties: false } }];
  const c1 = await client.responses.create({ model: M, input: 'What is the weather in Paris?', tools: wtool, max_output_tokens: 160, temperature: 0, reasoning: { effort: 'none' } });
  const call = c1.output.find((x) => x.type === 'function_call');
  check(call && call.name === 'get_weather' && JSON.stringify(JSON.parse(call.arguments)) === '{"city":"Paris"}' && /^call_/.test(call.call_id), 'demo model: a function_call item in auto mode', c1.output);
  if (call) {
    const c2 = await client.responses.create({ model: M, previous_response_id: c1.id, tools: wtool, max_output_tokens: 160, temperature: 0, reasoning: { effort: 'none' },
      input: [{ type: 'function_call_output', call_id: call.call_id, output: '{"temperature": 21, "unit": "celsius"}' }] });
    check(c2.status === 'completed' && c2.output_text.length > 0 && !c2.output.some((x) => x.type === 'function_call'), 'the call\'s output continues the stored conversation into an answer', c2.output);
    // the manual loop: the previous output items sent back as input, then the call's output
    const c3 = await client.responses.create({ model: M, tools: wtool, max_output_tokens: 160, temperature: 0, reasoning: { effort: 'none' },
      input: [{ role: 'user', content: 'What is the weather in Paris?' }, ...c1.output, { type: 'function_call_output', call_id: call.call_id, output: '{"temperature": 21, "unit": "celsius"}' }] });
    check(c3.status === 'completed' && c3.output_text === c2.output_text && c3.usage.input_tokens === c2.usage.input_tokens, 'output items echoed back as input == previous_response_id', [c3.output_text, c2.output_text]);
    const ev = [];
    for await (const e of client.responses.stream({ model: M, input: 'What is the weather in Paris?', tools: wtool, max_output_tokens: 160, temperature: 0, reasoning: { effort: 'none' } })) ev.push(e);
    const d = ev.find((e) => e.type === 'response.function_call_arguments.done');
    check(d && d.arguments === call.arguments && ev.at(-1).type === 'response.completed', 'streamed: function_call_arguments.done == the non-streamed call', d);
  }

  // ---- tool_choice required / named: the grammar forces a call, valid against the schema (ajv)
  const wv = new Ajv().compile(wtool[0].parameters);
  const ctool = { type: 'function', name: 'count_words', description: 'Count the words in a text.', parameters: { type: 'object', properties: { text: { type: 'string' } }, required: ['text'], additionalProperties: false } };
  for (const seed of [1, 2, 3]) {
    for (const [tc, want] of [['required', null], [{ type: 'function', name: 'count_words' }, 'count_words']]) {
      const body = { model: M, input: 'Tell me a joke.', tools: [...wtool, ctool], tool_choice: tc, max_output_tokens: 200, temperature: 1, seed, reasoning: { effort: 'none' } };
      const fr = await client.responses.create(body);
      const f = fr.output.find((x) => x.type === 'function_call');
      let a = null;
      try { a = JSON.parse(f?.arguments); } catch { /* checked */ }
      const ok = f && (want ? f.name === want : ['get_weather', 'count_words'].includes(f.name)) &&
        (f.name === 'get_weather' ? wv(a) : a && typeof a.text === 'string' && Object.keys(a).length === 1);
      check(ok && fr.status === 'completed', `tool_choice ${JSON.stringify(tc)} seed ${seed}: a valid call`, fr.output);
      if (seed === 1) {
        const sev = [];
        for await (const e of client.responses.stream(body)) sev.push(e);
        const d = sev.find((e) => e.type === 'response.function_call_arguments.done');
        check(d && d.arguments === f?.arguments, `tool_choice ${JSON.stringify(tc)}: streamed call == non-streamed`, d);
      }
    }
  }

  // ---- bad input
  await expectError(client.responses.create({ model: M, input: 'x', frobnicate: 1 }), 400, 'unknown field', 'frobnicate');
  await expectError(client.responses.create({ model: M }), 400, 'input missing', 'input');
  await expectError(client.responses.create({ model: M, input: [{ type: 'item_reference', id: 'x' }] }), 400, 'unsupported item', 'input[0]');
  await expectError(client.responses.create({ model: M, input: [{ role: 'user', content: [{ type: 'input_image', image_url: 'x' }] }] }), 400, 'image part', 'input[0].content[0]');
  await expectError(client.responses.create({ model: M, input: 'x', tools: [{ type: 'web_search' }] }), 400, 'non-function tool', 'tools[0]');
  await expectError(client.responses.create({ model: M, input: 'x', reasoning: { effort: 'max' } }), 400, 'bad effort', 'reasoning.effort');
  await expectError(client.responses.create({ model: M, input: 'x', text: { format: { type: 'yaml' } } }), 400, 'bad text.format', 'text.format.type');
  await expectError(client.responses.create({ model: 'gpt-5', input: 'x' }), 404, 'unknown model', 'model');
} finally {
  { const ex = await srv.stop(); check(ex.code === 0 && !/Sanitizer|runtime error|LeakSanitizer/.test(srv.log()), 'server exits cleanly (no sanitizer report)', { ex, log: srv.log().slice(-1500) }); }
}

// ---- function tools on the Qwen3-template copy
srv = await startServer(['--model-name', M], { model: dir });
try {
  const client = new OpenAI({ baseURL: srv.url + '/v1', apiKey: 'none', maxRetries: 0, timeout: 60000 });
  const tools = [{ type: 'function', name: 'get_weather', description: 'Weather of a city', parameters: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] } }];
  const G = 'root ::= "<tool_call>\\n{\\"name\\": \\"get_weather\\", \\"arguments\\": {\\"city\\": \\"" [a-zA-Z ]{1,12} "\\"}}\\n</tool_call>"';
  const body = { model: M, input: 'Weather in Paris?', tools, max_output_tokens: 200, temperature: 1, seed: 5, guided_grammar: G };
  const r = await client.responses.create(body);
  const fc = r.output.find((x) => x.type === 'function_call');
  let args = null;
  try { args = JSON.parse(fc?.arguments); } catch { /* checked */ }
  check(fc && /^call_/.test(fc.call_id) && fc.name === 'get_weather' && args && typeof args.city === 'string' && fc.status === 'completed', 'function_call item', r.output);
  check(!r.output.some((x) => x.type === 'message'), 'a reply of calls only has no message', r.output);
  const events = [];
  const st = client.responses.stream(body);
  for await (const ev of st) events.push(ev);
  const fin = await st.finalResponse();
  const sfc = fin.output.find((x) => x.type === 'function_call');
  check(sfc && sfc.name === fc?.name && sfc.arguments === fc?.arguments, 'streamed function_call == non-streamed', { sfc, fc });
  const ad = events.filter((e) => e.type === 'response.function_call_arguments.delta');
  const dn = events.find((e) => e.type === 'response.function_call_arguments.done');
  check(ad.length >= 1 && ad.map((e) => e.delta).join('') === fc?.arguments && dn?.arguments === fc?.arguments, 'arguments deltas join, .done has them whole', { ad: ad.length, dn });

  // the call and its output as input items == the equivalent chat messages
  const items = [{ role: 'user', content: 'Weather in Paris?' },
    { type: 'function_call', call_id: 'call_1', name: 'get_weather', arguments: '{"city": "Paris"}' },
    { type: 'function_call_output', call_id: 'call_1', output: '{"temp": 21}' }];
  const rr = await client.responses.create({ model: M, input: items, tools, max_output_tokens: 16, temperature: 0, reasoning: { effort: 'none' } });
  const cc = await client.chat.completions.create({ model: M, max_tokens: 16, temperature: 0, reasoning_effort: 'none',
    tools: [{ type: 'function', function: { name: 'get_weather', description: 'Weather of a city', parameters: tools[0].parameters } }],
    messages: [{ role: 'user', content: 'Weather in Paris?' },
      { role: 'assistant', content: null, tool_calls: [{ id: 'call_1', type: 'function', function: { name: 'get_weather', arguments: '{"city": "Paris"}' } }] },
      { role: 'tool', tool_call_id: 'call_1', content: '{"temp": 21}' }] });
  check(rr.usage.input_tokens === cc.usage.prompt_tokens && rr.output_text === (cc.choices[0].message.content ?? ''), 'function_call items render as the chat messages', [rr.usage, cc.usage]);
} finally {
  { const ex = await srv.stop(); check(ex.code === 0 && !/Sanitizer|runtime error|LeakSanitizer/.test(srv.log()), 'server exits cleanly (no sanitizer report)', { ex, log: srv.log().slice(-1500) }); }
  fs.rmSync(dir, { recursive: true, force: true });
}
process.exit(summary('responses'));
