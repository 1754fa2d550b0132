// The demo model's own tool calls, end to end through the official `openai`
// client, with no grammar: models/tern-demo was fine-tuned to call tools in
// the Hermes/Qwen3 layout of its chat template (tools/demo/README.md), so
// this is auto mode as a client uses it.
// - one call: name and arguments copied from the prompt, valid against the
//   tool's schema (ajv), finish_reason tool_calls;
// - thinking on: the thought in reasoning_content, then the call;
// - two cities: two parallel calls;
// - the client's runTools completes a two-tool loop (count_words on the
//   text, then add on its result) and answers with the final result;
// - tools offered but not needed: a plain answer, no tool_calls.
import path from 'node:path';
import { createRequire } from 'node:module';
import { startServer, check, summary, ROOT } from './lib.mjs';

const require = createRequire(path.join(ROOT, 'tests/oracle/package.json'));
const OpenAI = require('openai').default ?? require('openai');
const Ajv = require('ajv').default ?? require('ajv');

const M = 'tern-demo';
const schemas = {
  get_weather: { type: 'object', properties: { city: { type: 'string' }, unit: { type: 'string', enum: ['celsius', 'fahrenheit'] } }, required: ['city'], additionalProperties: false },
  count_words: { type: 'object', properties: { text: { type: 'string' } }, required: ['text'], additionalProperties: false },
  add: { type: 'object', properties: { a: { type: 'number' }, b: { type: 'number' } }, required: ['a', 'b'], additionalProperties: false },
};
const desc = { get_weather: 'Get the current weather in a city.', count_words: 'Count the words in a text.', add: 'Add two numbers.' };
const tool = (name) => ({ type: 'function', function: { name, description: desc[name], parameters: schemas[name] } });
const tools = [tool('get_weather'), tool('count_words'), tool('add')];
const ajv = new Ajv({ strict: false });
const validators = Object.fromEntries(Object.entries(schemas).map(([k, s]) => [k, ajv.compile(s)]));
const off = { chat_template_kwargs: { enable_thinking: false } };

function callsOf(m) {
  return (m.tool_calls ?? []).map((t) => {
    let args = null;
    try { args = JSON.parse(t.function.arguments); } catch { /* checked by the caller */ }
    return { name: t.function.name, args, valid: args !== null && validators[t.function.name]?.(args) === true };
  });
}

const srv = await startServer(['--model-name', M]);
try {
  const client = new OpenAI({ baseURL: srv.url + '/v1', apiKey: 'none', maxRetries: 0, timeout: 60000 });
  check(/tool calls: hermes/.test(srv.log()), 'the server detects the hermes format of the demo template', srv.log().slice(-600));

  // ---- one call per request, greedy, thinking off and on
  const asks = [['What is the weather in Paris?', 'get_weather', { city: 'Paris' }],
    ['What is the weather in Oslo in fahrenheit?', 'get_weather', { city: 'Oslo', unit: 'fahrenheit' }],
    ['Count the words in this text: The quick brown fox jumps over the lazy dog.', 'count_words', { text: 'The quick brown fox jumps over the lazy dog.' }],
    ['What is 12 plus 30?', 'add', { a: 12, b: 30 }]];
  for (const [user, name, want] of asks) {
    for (const think of [false, true]) {
      const r = await client.chat.completions.create({ model: M, messages: [{ role: 'user', content: user }], tools, max_tokens: 160, temperature: 0, ...(think ? {} : off) });
      const c = r.choices[0];
      const calls = callsOf(c.message);
      const what = `${name}${think ? ' (thinking)' : ''}`;
      check(c.finish_reason === 'tool_calls' && calls.length === 1 && c.message.content === null, `${what}: one call, content null`, c);
      check(calls[0]?.name === name && calls[0]?.valid, `${what}: right tool, arguments valid against its schema`, calls);
      check(JSON.stringify(calls[0]?.args) === JSON.stringify(want), `${what}: arguments copied from the prompt`, { got: calls[0]?.args, want });
      if (think) check((c.message.reasoning_content ?? '').length > 0, `${what}: the thought in reasoning_content`, c.message);
    }
  }

  // ---- parallel calls
  const two = await client.chat.completions.create({ model: M, messages: [{ role: 'user', content: 'What is the weather in Rome and in Lima?' }], tools, max_tokens: 160, temperature: 0, ...off });
  const tc = callsOf(two.choices[0].message);
  check(tc.length === 2 && tc.every((x) => x.name === 'get_weather' && x.valid) && tc[0].args.city === 'Rome' && tc[1].args.city === 'Lima', 'two parallel calls', tc);
  check(new Set(two.choices[0].message.tool_calls?.map((t) => t.id)).size === 2, 'two call ids', two.choices[0].message.tool_calls);

  // ---- runTools: a two-tool loop
  for (const think of [false, true]) {
    const seen = [];
    const runner = client.chat.completions.runTools({
      model: M, max_tokens: 200, temperature: 0, ...(think ? {} : off),
      messages: [{ role: 'user', content: 'Count the words in this text and add 5 to the count: The old ship left the harbour at dawn.' }],
      tools: [
        { type: 'function', function: { name: 'count_words', description: desc.count_words, parameters: schemas.count_words, parse: JSON.parse,
          function: ({ text }) => { seen.push(['count_words', text]); return `{"words": ${text.split(/\s+/).filter(Boolean).length}}`; } } },
        { type: 'function', function: { name: 'add', description: desc.add, parameters: schemas.add, parse: JSON.parse,
          function: ({ a, b }) => { seen.push(['add', a, b]); return `{"result": ${a + b}}`; } } },
      ],
    });
    const final = await runner.finalContent();
    const what = `runTools${think ? ' (thinking)' : ''}`;
    check(JSON.stringify(seen) === JSON.stringify([['count_words', 'The old ship left the harbour at dawn.'], ['add', 8, 5]]), `${what}: count_words then add on its result`, seen);
    check(typeof final === 'string' && final.includes('13') && !final.includes('<tool_call>'), `${what}: the answer uses the last result`, final);
  }

  // ---- tools offered, not needed
  for (const user of ['Hello! Who are you?', 'Repeat this text exactly: Small models are useful for testing.']) {
    const r = await client.chat.completions.create({ model: M, messages: [{ role: 'user', content: user }], tools, max_tokens: 80, temperature: 0, ...off });
    const c = r.choices[0];
    check(c.finish_reason === 'stop' && !c.message.tool_calls && (c.message.content ?? '').length > 0, `no call needed: plain answer (${user.slice(0, 20)})`, c);
  }
} finally {
  await srv.stop();
}
process.exit(summary('demo_tools'));
