// Tool calls enforced by the grammar, end to end on the demo model (its
// template renders tools and writes calls in <tool_call> blocks, the
// Hermes/Qwen3 layout it was fine-tuned on) through the official `openai`
// client.
//
// - tool_choice "required" and a named tool, temperature 1: 100 of 100
//   sampled calls parse and their arguments validate against the tool's
//   `parameters` schema (ajv), alone, and again in batches of 16 mixed with
//   plain, auto-mode and response_format requests on a server that
//   speculates with the draft model (every row speculative: the grammar
//   must hold on that lane too);
// - streamed calls reassemble into the non-streamed ones (same seed);
// - parallel calls: every call of an answer validates;
// - auto mode: the answer is free text, and a call that starts validates;
// - bad input: OpenAI-shaped 400s naming the field; a template that cannot
//   render tools (a copy of the demo folder made in the build dir with a
//   plain ChatML template) is a 400 naming `tools`.
// The calls are read from `message.tool_calls` (the output parser); where a
// reply has none, from the content (the think block stripped, then the
// format's <tool_call> blocks), so a call the parser missed still counts
// against the grammar. finish_reason malformed_tool_call never happens.
import fs from 'node:fs';
import path from 'node:path';
import { createRequire } from 'node:module';
import { startServer, check, summary, ROOT, BUILD, MODEL } from '../server/lib.mjs';

const require = createRequire(path.join(ROOT, 'tests/oracle/package.json'));
const OpenAI = require('openai').default ?? require('openai');
const Ajv = require('ajv/dist/2020').default ?? require('ajv/dist/2020');
const ajv = new Ajv({ strict: false });

// ---- a copy of the demo model whose template renders no tools ----
const PLAIN_CHATML = "{%- for message in messages %}{{- '<|im_start|>' + message['role'] + '\\n' + " +
  "(message['content'] if message['content'] is string else '') + '<|im_end|>\\n' }}{%- endfor %}" +
  "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}";
function makeNoToolsModel() {
  const dir = path.join(BUILD, 'toolcall-notools');
  fs.rmSync(dir, { recursive: true, force: true });
  fs.mkdirSync(dir, { recursive: true });
  for (const f of fs.readdirSync(MODEL)) {
    if (f === 'tokenizer_config.json') continue;
    fs.symlinkSync(path.join(MODEL, f), path.join(dir, f));
  }
  const cfg = JSON.parse(fs.readFileSync(path.join(MODEL, 'tokenizer_config.json'), 'utf8'));
  cfg.chat_template = PLAIN_CHATML;
  fs.writeFileSync(path.join(dir, 'tokenizer_config.json'), JSON.stringify(cfg, null, 1));
  return dir;
}

// ---- tools and their validators ----
const TOOLS = [
  {
    type: 'function',
    function: {
      name: 'get_weather', description: 'Current weather of a city',
      parameters: {
        type: 'object',
        properties: { city: { type: 'string', maxLength: 24 }, unit: { enum: ['celsius', 'fahrenheit'] } },
        required: ['city', 'unit'], additionalProperties: false,
      },
    },
  },
  {
    type: 'function',
    function: {
      name: 'add', description: 'Add two integers',
      parameters: {
        type: 'object',
        properties: { a: { type: 'integer', minimum: -1000, maximum: 1000 }, b: { type: 'integer', minimum: 0, maximum: 99999 } },
        required: ['a', 'b'],
      },
    },
  },
  {
    type: 'function',
    function: {
      name: 'search', description: 'Search notes',
      parameters: {
        type: 'object',
        properties: {
          query: { type: 'string', minLength: 1, maxLength: 30 },
          tags: { type: 'array', items: { type: 'string', maxLength: 8 }, maxItems: 3 },
          limit: { type: 'integer', minimum: 1, maximum: 10 },
          exact: { type: 'boolean' },
        },
        required: ['query'], additionalProperties: false,
      },
    },
  },
  { type: 'function', function: { name: 'now', description: 'The time' } },
];
const VALIDATE = Object.fromEntries(TOOLS.map((t) => [t.function.name,
  ajv.compile(t.function.parameters ?? { type: 'object', properties: {}, additionalProperties: false })]));

const PROMPTS = ['What is the weather in Paris?', 'Add 2 and 3.', 'Find my notes about the garden.',
  'What time is it?', 'Tell me a story.', 'Weather in Oslo, in fahrenheit please.'];

// The calls of a message: tool_calls when the server fills them, else the
// <tool_call> blocks of the content after the think block.
function callsOf(msg) {
  if (Array.isArray(msg.tool_calls) && msg.tool_calls.length) {
    return { calls: msg.tool_calls.map((c) => ({ name: c.function.name, argsText: c.function.arguments })),
      rest: msg.content ?? '' };
  }
  let text = msg.content ?? '';
  text = text.replace(/^\s*<think>[\s\S]*?<\/think>/, '');
  const calls = [];
  const re = /<tool_call>\n([\s\S]*?)\n<\/tool_call>/g;
  let m, last = 0, rest = '';
  while ((m = re.exec(text))) {
    rest += text.slice(last, m.index);
    last = re.lastIndex;
    let obj = null;
    try { obj = JSON.parse(m[1]); } catch { obj = null; }
    calls.push(obj && typeof obj === 'object' ? { name: obj.name, args: obj.arguments, raw: m[1] } : { raw: m[1] });
  }
  rest += text.slice(last);
  return { calls, rest };
}

// Checks one call; returns an error string or null.
function badCall(c, only) {
  let args = c.args;
  if (c.argsText !== undefined) {
    try { args = JSON.parse(c.argsText); } catch { return `arguments are not JSON: ${c.argsText}`; }
  }
  if (c.name === undefined) return `not a call object: ${c.raw}`;
  if (only && c.name !== only) return `called ${c.name}, not ${only}`;
  const v = VALIDATE[c.name];
  if (!v) return `unknown tool ${c.name}`;
  if (!v(args)) return `${c.name} arguments ${JSON.stringify(args)}: ${ajv.errorsText(v.errors)}`;
  return null;
}

// A forced answer: only calls (separators aside), at least one, all valid;
// one when parallel calls are off.
function checkForced(choice, { only, single }) {
  const { calls, rest } = callsOf(choice.message);
  if (!['stop', 'tool_calls'].includes(choice.finish_reason)) return `finish_reason ${choice.finish_reason}: ${JSON.stringify(choice.message.content)}`;
  if (!calls.length) return `no call in ${JSON.stringify(choice.message.content)}`;
  if (rest.trim() !== '') return `text around the calls: ${JSON.stringify(rest)}`;
  if (single && calls.length !== 1) return `${calls.length} calls with parallel_tool_calls false`;
  for (const c of calls) {
    const why = badCall(c, only);
    if (why) return why;
  }
  return null;
}

function forcedRequest(i, kind, extra = {}) {
  const body = {
    messages: [{ role: 'user', content: PROMPTS[i % PROMPTS.length] }],
    tools: TOOLS,
    temperature: 1,
    seed: 1000 + i,
    max_tokens: 240,
    parallel_tool_calls: false,
    ...extra,
  };
  if (kind === 'required') body.tool_choice = 'required';
  else body.tool_choice = { type: 'function', function: { name: TOOLS[i % TOOLS.length].function.name } };
  // a quarter of the rows think first (the demo model opens a think block;
  // the constraint caps it at max_tokens / 2), the others answer at once
  if (i % 4) body.chat_template_kwargs = { enable_thinking: false };
  return body;
}

async function runForced(client, label, kind, n, concurrency) {
  let ok = 0;
  const failures = [];
  let next = 0;
  async function worker() {
    while (next < n) {
      const i = next++;
      const body = forcedRequest(i, kind);
      const only = kind === 'named' ? body.tool_choice.function.name : null;
      try {
        const r = await client.chat.completions.create(body);
        const why = checkForced(r.choices[0], { only, single: true });
        if (why) failures.push(`#${i}: ${why}`);
        else ok++;
      } catch (err) {
        failures.push(`#${i}: ${err.status ?? ''} ${err.message}`);
      }
    }
  }
  await Promise.all(Array.from({ length: concurrency }, worker));
  check(ok === n, `${label}: ${ok} of ${n} calls parse and validate`, failures.slice(0, 3).join(' | '));
  return ok;
}

function jsonSchemaFormat() {
  return {
    type: 'json_schema',
    json_schema: {
      name: 'answer', strict: true,
      schema: { type: 'object', properties: { answer: { type: 'string', maxLength: 20 }, sure: { type: 'boolean' } },
        required: ['answer', 'sure'], additionalProperties: false },
    },
  };
}
const validateAnswer = ajv.compile(jsonSchemaFormat().json_schema.schema);

// One wave of 16 concurrent requests: 10 forced calls, 2 plain, 2 auto, 2 response_format.
async function mixedWave(client, w) {
  const jobs = [];
  let calls = 0;
  for (let k = 0; k < 16; k++) {
    const i = w * 16 + k;
    if (k < 10) {
      const kind = k % 2 ? 'named' : 'required';
      const body = forcedRequest(i, kind);
      const only = kind === 'named' ? body.tool_choice.function.name : null;
      jobs.push(client.chat.completions.create(body).then((r) => {
        const why = checkForced(r.choices[0], { only, single: true });
        calls++;
        return why ? `forced #${i}: ${why}` : null;
      }));
    } else if (k < 12) {
      jobs.push(client.chat.completions.create({
        messages: [{ role: 'user', content: PROMPTS[i % PROMPTS.length] }], temperature: 1, seed: i, max_tokens: 32,
      }).then((r) => (['stop', 'length'].includes(r.choices[0].finish_reason) ? null
        : `plain #${i}: finish ${r.choices[0].finish_reason}`)));
    } else if (k < 14) {
      jobs.push(client.chat.completions.create({
        messages: [{ role: 'user', content: PROMPTS[i % PROMPTS.length] }], tools: TOOLS, tool_choice: 'auto',
        temperature: 1, seed: i, max_tokens: 48,
      }).then((r) => {
        const c = r.choices[0];
        if (!['stop', 'length', 'tool_calls'].includes(c.finish_reason)) return `auto #${i}: finish ${c.finish_reason}`;
        const { calls: cs } = callsOf(c.message);
        for (const x of cs) { const why = badCall(x, null); if (why) return `auto #${i}: ${why}`; }
        return null;
      }));
    } else {
      jobs.push(client.chat.completions.create({
        messages: [{ role: 'user', content: PROMPTS[i % PROMPTS.length] }], temperature: 1, seed: i, max_tokens: 300,
        response_format: jsonSchemaFormat(), chat_template_kwargs: { enable_thinking: false },
      }).then((r) => {
        const c = r.choices[0];
        if (c.finish_reason !== 'stop') return `response_format #${i}: finish ${c.finish_reason}`;
        let o;
        try { o = JSON.parse(c.message.content.replace(/^\s*<think>[\s\S]*?<\/think>/, '')); } catch { return `response_format #${i}: not JSON: ${c.message.content}`; }
        return validateAnswer(o) ? null : `response_format #${i}: ${ajv.errorsText(validateAnswer.errors)}`;
      }));
    }
  }
  const res = await Promise.all(jobs.map((p) => p.catch((err) => `error ${err.status ?? ''} ${err.message}`)));
  return { errors: res.filter(Boolean), calls };
}

async function expect400(client, body, param, what) {
  try {
    await client.chat.completions.create({ messages: [{ role: 'user', content: 'hi' }], max_tokens: 4, ...body });
    check(false, `${what}: 400`, 'got 200');
  } catch (err) {
    check(err.status === 400 && err.error?.param === param, `${what}: 400 naming ${param}`,
      `${err.status} ${JSON.stringify(err.error)}`);
  }
}

async function main() {
  const t0 = Date.now();

  // ---- alone ----
  let srv = await startServer(['--max-batch', '16']);
  try {
    const client = new OpenAI({ baseURL: srv.url + '/v1', apiKey: 'x', maxRetries: 0, timeout: 120000 });
    await runForced(client, 'required, alone', 'required', 100, 1);
    await runForced(client, 'named, alone', 'named', 100, 1);
    console.log(`alone: ${((Date.now() - t0) / 1000).toFixed(1)} s`);

    // streamed: delta.tool_calls reassemble into the non-streamed calls (same seed)
    let diff = [];
    for (let i = 0; i < 4; i++) {
      const body = forcedRequest(i, i % 2 ? 'named' : 'required', { parallel_tool_calls: i >= 2 });
      const r = await client.chat.completions.create(body);
      const want = (r.choices[0].message.tool_calls ?? []).map((t) => [t.function.name, t.function.arguments]);
      const got = [];
      let finish = null;
      for await (const ch of await client.chat.completions.create({ ...body, stream: true })) {
        const c = ch.choices[0];
        if (!c) continue;
        for (const t of c.delta.tool_calls ?? []) {
          if (!got[t.index]) got[t.index] = [t.function?.name, ''];
          got[t.index][1] += t.function?.arguments ?? '';
        }
        if (c.finish_reason) finish = c.finish_reason;
      }
      if (!want.length || JSON.stringify(got) !== JSON.stringify(want) || finish !== r.choices[0].finish_reason)
        diff.push(`#${i}: ${JSON.stringify(want)} vs streamed ${JSON.stringify(got)} (${finish})`);
    }
    check(diff.length === 0, 'forced calls: streamed == non-streamed', diff.slice(0, 2).join(' | '));

    // parallel calls: every call of every answer validates
    let bad = [];
    for (let i = 0; i < 12; i++) {
      const body = forcedRequest(i, 'required', { parallel_tool_calls: true, max_tokens: 200 });
      const r = await client.chat.completions.create(body);
      const c = r.choices[0];
      const { calls } = callsOf(c.message);
      // a length finish may cut the last call: the complete ones must validate
      for (const x of calls) { const why = badCall(x, null); if (why) bad.push(`#${i}: ${why}`); }
      if (c.finish_reason === 'malformed_tool_call') bad.push(`#${i}: malformed`);
      if (['stop', 'tool_calls'].includes(c.finish_reason) && !calls.length) bad.push(`#${i}: no call`);
    }
    check(bad.length === 0, 'parallel calls: every call validates', bad.slice(0, 3).join(' | '));

    // auto: free text, calls that start validate (the lazy grammar), rows end normally
    bad = [];
    let autoCalls = 0;
    for (let i = 0; i < 8; i++) {
      const r = await client.chat.completions.create({
        messages: [{ role: 'user', content: PROMPTS[i % PROMPTS.length] }], tools: TOOLS, temperature: 1, seed: i,
        max_tokens: 96,
      });
      const c = r.choices[0];
      if (!['stop', 'length', 'tool_calls'].includes(c.finish_reason)) bad.push(`#${i}: finish ${c.finish_reason}`);
      for (const x of callsOf(c.message).calls) {
        autoCalls++;
        const why = badCall(x, null);
        if (why) bad.push(`#${i}: ${why}`);
      }
    }
    check(bad.length === 0, 'auto: answers end normally, calls validate', bad.slice(0, 3).join(' | '));
    check(autoCalls > 0, 'auto: the demo model called tools (the lazy grammar ran)', autoCalls);

    // auto + response_format: a call or the schema'd answer
    bad = [];
    for (let i = 0; i < 6; i++) {
      const r = await client.chat.completions.create({
        messages: [{ role: 'user', content: PROMPTS[i % PROMPTS.length] }], tools: TOOLS, temperature: 1, seed: i,
        max_tokens: 300, response_format: jsonSchemaFormat(), chat_template_kwargs: { enable_thinking: false },
      });
      const c = r.choices[0];
      const { calls, rest } = callsOf(c.message);
      if (!['stop', 'tool_calls'].includes(c.finish_reason)) { bad.push(`#${i}: finish ${c.finish_reason}`); continue; }
      if (calls.length) {
        for (const x of calls) { const why = badCall(x, null); if (why) bad.push(`#${i}: ${why}`); }
      } else {
        let o = null;
        try { o = JSON.parse(rest); } catch { bad.push(`#${i}: neither a call nor JSON: ${rest}`); continue; }
        if (!validateAnswer(o)) bad.push(`#${i}: ${ajv.errorsText(validateAnswer.errors)}`);
      }
    }
    check(bad.length === 0, 'auto + response_format: a valid call or a valid answer', bad.slice(0, 3).join(' | '));

    // ---- bad input ----
    const badSchema = [{ type: 'function', function: { name: 'f', parameters: { type: 'object', properties: { a: { type: 'nonsense' } } } } }];
    await expect400(client, { tools: badSchema, tool_choice: 'required' }, 'tools[0].function.parameters', 'invalid schema (required)');
    await expect400(client, { tools: badSchema }, 'tools[0].function.parameters', 'invalid schema (auto)');
    await expect400(client, { tools: [TOOLS[0], { type: 'function', function: { name: 'f', parameters: { $ref: '#/nowhere' } } }] },
      'tools[1].function.parameters', 'unresolvable $ref');
    await expect400(client, { tools: TOOLS, tool_choice: { type: 'function', function: { name: 'nope' } } },
      'tool_choice.function.name', 'unknown tool_choice name');
    await expect400(client, { tools: [TOOLS[0], TOOLS[1], TOOLS[0]] }, 'tools[2].function.name', 'duplicate tool names');
    await expect400(client, { tool_choice: 'required' }, 'tool_choice', 'tool_choice without tools');
    await expect400(client, { tool_choice: 'auto', tools: [] }, 'tool_choice', 'tool_choice with empty tools');
    await expect400(client, { tools: TOOLS, tool_choice: 'sometimes' }, 'tool_choice', 'unknown tool_choice');
    await expect400(client, { tools: TOOLS, tool_choice: { type: 'function' } }, 'tool_choice.function.name', 'tool_choice without a name');
    await expect400(client, { tools: [{ type: 'function', function: { name: 'two words' } }] }, 'tools[0].function.name', 'bad function name');
    await expect400(client, { tools: [{ type: 'function', function: { description: 'x' } }] }, 'tools[0].function.name', 'missing function name');
    await expect400(client, { tools: [{ type: 'function', function: { name: 'f', parameters: 'x' } }] }, 'tools[0].function.parameters', 'parameters not an object');
    await expect400(client, { tools: [{ type: 'function', function: { name: 'f', examples: [] } }] }, 'tools[0].function.examples', 'unknown function field');
    await expect400(client, { tools: TOOLS, parallel_tool_calls: 'yes' }, 'parallel_tool_calls', 'parallel_tool_calls not a boolean');
    // the server answers normally after all that
    const r = await client.chat.completions.create({ messages: [{ role: 'user', content: 'hi' }], max_tokens: 8 });
    check(r.choices.length === 1, 'server still answers after the 400s');
  } finally {
    await srv.stop();
  }

  // ---- a template that cannot render tools ----
  srv = await startServer([], { model: makeNoToolsModel() });
  try {
    const client = new OpenAI({ baseURL: srv.url + '/v1', apiKey: 'x', maxRetries: 0 });
    await expect400(client, { tools: TOOLS }, 'tools', 'tools on a template without tools');
    await expect400(client, { tools: TOOLS, tool_choice: 'required' }, 'tools', 'required on a template without tools');
    const r = await client.chat.completions.create({ messages: [{ role: 'user', content: 'hi' }], tools: TOOLS,
      tool_choice: 'none', max_tokens: 4 });
    check(r.choices.length === 1, 'tool_choice none hides the tools: 200');
  } finally {
    await srv.stop();
  }

  // ---- mixed batches of 16 on a speculating server ----
  srv = await startServer(['--max-batch', '16', '--draft-model', path.join(ROOT, 'models/tern-demo-draft')]);
  try {
    const client = new OpenAI({ baseURL: srv.url + '/v1', apiKey: 'x', maxRetries: 0, timeout: 300000 });
    const t1 = Date.now();
    let calls = 0;
    const errors = [];
    for (let w = 0; w < 10; w++) {
      const res = await mixedWave(client, w);
      calls += res.calls;
      errors.push(...res.errors);
    }
    const stats = await (await fetch(srv.url + '/stats')).json();
    console.log(`mixed: ${((Date.now() - t1) / 1000).toFixed(1)} s, spec drafted ${stats.engine?.spec_drafted ?? stats.spec_drafted}, accepted ${stats.engine?.spec_accepted ?? stats.spec_accepted}`);
    check(calls === 100 && errors.length === 0, `mixed batches of 16 with speculation: ${calls - errors.filter((e) => e.startsWith('forced')).length} of 100 calls valid, other rows fine`,
      errors.slice(0, 4).join(' | '));
    const drafted = stats.engine?.spec_drafted ?? stats.spec_drafted ?? 0;
    check(drafted > 0, 'the rows speculated', JSON.stringify(stats).slice(0, 300));
  } finally {
    await srv.stop();
  }
  process.exit(summary('toolcall.e2e'));
}

main().catch((err) => { console.error(err); process.exit(1); });
