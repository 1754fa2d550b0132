// Speculative decoding end to end: the same 16 mixed greedy requests (plain,
// JSON schema, regex, choice, with and without thinking) against a server
// without speculation, one with the draft model and one with prompt lookup.
// Every output must be identical token for token (checked on text), alone
// and concurrently in one batch; grammar outputs must parse; speculating
// servers must report usage.speculation.
import { startServer, check, summary } from '../server/lib.mjs';

const person = {
  type: 'object',
  properties: { name: { type: 'string', maxLength: 20 }, age: { type: 'integer', minimum: 0, maximum: 120 },
    tags: { type: 'array', items: { enum: ['a', 'b', 'c'] }, maxItems: 3 } },
  required: ['name', 'age'],
};
const asks = [
  'Hello! Who are you?',
  'Answer in JSON with keys title, words: The quick brown fox jumps over the lazy dog.',
  'Repeat this text exactly: Small models are useful for testing.',
  'Continue this text: The old ship left the harbour at dawn.',
];
function request(i) {
  const base = { model: 'tern-demo', temperature: 0, max_tokens: 48,
    messages: [{ role: 'user', content: asks[i % asks.length] }] };
  switch (i % 4) {
    case 0: return base;
    case 1: return { ...base, response_format: { type: 'json_schema', json_schema: { name: 'p', schema: person } } };
    case 2: return { ...base, guided_regex: '[A-Z][a-z]+( [a-z]+){2,6}\\.' };
    default: return { ...base, guided_choice: ['yes', 'no', 'maybe'],
      chat_template_kwargs: { enable_thinking: i % 8 === 3 } };
  }
}

async function post(url, body) {
  const r = await fetch(url + '/v1/chat/completions', { method: 'POST', headers: { 'Content-Type': 'application/json' },
    body: JSON.stringify(body) });
  return { status: r.status, body: await r.json() };
}

async function runAll(url, concurrent) {
  const reqs = Array.from({ length: 16 }, (_, i) => request(i));
  if (concurrent) return Promise.all(reqs.map((b) => post(url, b)));
  const out = [];
  for (const b of reqs) out.push(await post(url, b));
  return out;
}

const servers = [
  ['plain', []],
  ['draft', ['--draft-model', process.env.TERN_ROOT ? process.env.TERN_ROOT + '/models/tern-demo-draft' : 'models/tern-demo-draft', '--num-draft-tokens', '4']],
  ['lookup', ['--spec', 'ngram', '--num-draft-tokens', '4']],
];
const results = {};
for (const [name, args] of servers) {
  const srv = await startServer(args);
  try {
    results[name] = { alone: await runAll(srv.url, false), batch: await runAll(srv.url, true) };
  } finally {
    await srv.stop();
  }
}
const ref = results.plain.alone;
for (let i = 0; i < 16; i++) {
  const want = ref[i].body.choices?.[0]?.message?.content;
  check(ref[i].status === 200 && typeof want === 'string', `plain request ${i} answered`, ref[i].body);
  if (i % 4 === 1) {
    const text = want.replace(/^<think>[\s\S]*?<\/think>\s*/, '');
    let ok = true;
    try { const v = JSON.parse(text); ok = typeof v.name === 'string' && Number.isInteger(v.age); } catch { ok = false; }
    check(ok, `request ${i}: schema output parses and conforms`, want);
  }
  for (const [name] of servers)
    for (const mode of ['alone', 'batch']) {
      const got = results[name][mode][i].body.choices?.[0];
      check(got?.message?.content === want && got?.finish_reason === ref[i].body.choices[0].finish_reason,
        `${name}/${mode} request ${i} equals the plain server alone`, { want, got: got?.message?.content });
    }
}
const spec = results.draft.alone.map((r) => r.body.usage?.speculation).filter(Boolean);
check(spec.length > 0 && spec.some((s) => s.accepted > 0), 'draft server reports usage.speculation with accepted drafts', spec[0]);
const drafted = spec.reduce((a, s) => a + s.drafted, 0), accepted = spec.reduce((a, s) => a + s.accepted, 0);
console.log(`draft model: ${accepted}/${drafted} drafts accepted over 16 requests`);
process.exit(summary('spec_server'));
