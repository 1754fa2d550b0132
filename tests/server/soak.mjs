// Soak: 64 clients hammer one `tern serve` for a bounded time with a mix a
// real deployment sees - streamed chats read to the end, streams dropped
// after a few chunks (disconnects), requests aborted mid-flight
// (cancellations), grammar-constrained answers, plain completions and
// malformed bodies - while the server's resident memory is sampled every
// half second. It holds when: every request either completed (200 with a
// finish_reason, or a whole stream ending in [DONE]) or got a JSON error, or
// was aborted by the client; nothing hung; memory in the second half stays
// within a bound of the first half's; and afterwards the server is healthy,
// idle (no active generation, stream, running or waiting request) and gives
// the same greedy answer as before the soak.
// TERN_SOAK_SECONDS sets the duration (default 30: the test suite's short
// version; e.g. 900 for the long one, a bench).
import { startServer, check, summary, rssKiB } from './lib.mjs';

const SECONDS = Number(process.env.TERN_SOAK_SECONDS || 30);
const CLIENTS = 64;
const srv = await startServer(['--max-batch', '64', '--max-queue', '4096']);
const H = { 'content-type': 'application/json' };
const rand = (n) => Math.floor(Math.random() * n);
const PROMPTS = ['Hello! Who are you?', 'Tell me a short story about a cat.', 'What can you do?',
  'Write a sentence about the sea.', 'Count the words in this text: a b c d'];
const SCHEMA = { type: 'object', properties: { name: { type: 'string', maxLength: 12 }, n: { type: 'integer', minimum: 0, maximum: 9 } }, required: ['name', 'n'], additionalProperties: false };

const count = { completed: 0, errored: 0, aborted: 0, stream_done: 0, bad: 0 };
const bad = [];

function chatBody(extra = {}) {
  return { model: 'tern-demo', messages: [{ role: 'user', content: PROMPTS[rand(PROMPTS.length)] }],
    max_tokens: 8 + rand(56), temperature: Math.random() < 0.3 ? 0 : 0.9, ...extra };
}

async function post(path, body, signal) {
  return fetch(srv.url + path, { method: 'POST', headers: H, body: typeof body === 'string' ? body : JSON.stringify(body), signal });
}

// One request of a random kind; classifies its outcome.
async function one() {
  const kind = rand(6);
  const ac = new AbortController();
  const watchdog = setTimeout(() => ac.abort(new Error('hung')), 60000);
  let dropAfter = -1;
  try {
    if (kind === 0 || kind === 1) { // a stream, read to the end or dropped after a few chunks
      if (kind === 1) dropAfter = 1 + rand(6);
      const r = await post('/v1/chat/completions', chatBody({ stream: true }), ac.signal);
      if (r.status !== 200) return classifyError(r);
      const reader = r.body.getReader();
      const dec = new TextDecoder();
      let text = '', chunks = 0;
      for (;;) {
        const { done, value } = await reader.read();
        if (done) break;
        text += dec.decode(value, { stream: true });
        chunks++;
        if (dropAfter >= 0 && chunks >= dropAfter) { ac.abort(); count.aborted++; return; }
      }
      if (/data: \[DONE\]\s*$/.test(text)) count.stream_done++;
      else { count.bad++; bad.push('stream without [DONE]: ' + text.slice(-120)); }
      return;
    }
    if (kind === 2) { // cancelled mid-flight
      setTimeout(() => ac.abort(), 5 + rand(300));
      const r = await post('/v1/chat/completions', chatBody({ max_tokens: 64 }), ac.signal);
      const j = await r.json();
      return classifyJson(r, j);
    }
    let body;
    if (kind === 3) body = chatBody({ response_format: { type: 'json_schema', json_schema: { name: 's', schema: SCHEMA } } });
    else if (kind === 4) body = { model: 'tern-demo', prompt: PROMPTS[rand(PROMPTS.length)], max_tokens: 4 + rand(40) };
    else body = ['{"messages": [', '{"messages": "nope"}', '{"model": "tern-demo", "max_tokens": -3, "prompt": "x"}'][rand(3)];
    const r = await post(kind === 4 || (kind === 5 && body.includes('prompt')) ? '/v1/completions' : '/v1/chat/completions', body, ac.signal);
    const j = await r.json();
    if (kind === 3 && r.status === 200 && j.choices?.[0]?.finish_reason === 'stop') {
      try { JSON.parse(j.choices[0].message.content); } catch { count.bad++; bad.push('invalid JSON under a schema: ' + j.choices[0].message.content); return; }
    }
    return classifyJson(r, j);
  } catch (e) {
    if (ac.signal.aborted && !(ac.signal.reason instanceof Error && ac.signal.reason.message === 'hung')) { count.aborted++; return; }
    count.bad++;
    bad.push(`kind ${kind}: ${e.message || e}`);
  } finally {
    clearTimeout(watchdog);
  }
}

function classifyJson(r, j) {
  if (r.status === 200 && j.choices?.[0]?.finish_reason) count.completed++;
  else if (r.status >= 400 && j.error?.message) count.errored++;
  else { count.bad++; bad.push(`status ${r.status}: ${JSON.stringify(j).slice(0, 160)}`); }
}

async function classifyError(r) {
  let j = null;
  try { j = await r.json(); } catch { /* not JSON */ }
  classifyJson(r, j || {});
}

async function greedy() {
  const r = await post('/v1/chat/completions', { model: 'tern-demo', messages: [{ role: 'user', content: 'Hello! Who are you?' }], max_tokens: 32, temperature: 0 });
  return (await r.json()).choices?.[0]?.message?.content;
}

try {
  const before = await greedy();
  const samples = [];
  const t0 = Date.now();
  const sampler = setInterval(() => { try { samples.push([Date.now() - t0, rssKiB(srv.proc.pid)]); } catch { /* gone */ } }, 500);
  const end = t0 + SECONDS * 1000;
  let started = 0;
  await Promise.all(Array.from({ length: CLIENTS }, async () => {
    while (Date.now() < end) { started++; await one(); }
  }));
  clearInterval(sampler);
  const total = count.completed + count.errored + count.aborted + count.stream_done + count.bad;
  console.log(`soak ${SECONDS} s, ${CLIENTS} clients: ${started} requests - ${count.completed} completed, ${count.stream_done} streams read to [DONE], ` +
    `${count.aborted} aborted by the client, ${count.errored} JSON errors, ${count.bad} bad`);
  check(total === started && count.bad === 0, 'every request completed, errored or was aborted by its client', bad.slice(0, 5));
  check(count.completed + count.stream_done > CLIENTS && count.aborted > 10 && count.errored > 0, 'the mix really ran', count);
  const half = SECONDS * 500;
  const first = Math.max(...samples.filter(([t]) => t < half).map(([, k]) => k));
  const second = Math.max(...samples.filter(([t]) => t >= half).map(([, k]) => k));
  console.log(`RSS peak: first half ${(first / 1024).toFixed(1)} MiB, second half ${(second / 1024).toFixed(1)} MiB (${samples.length} samples)`);
  check(second <= first * 1.25 + 32 * 1024, 'resident memory bounded (second half within 1.25x + 32 MiB of the first)', { first, second });
  // settle, then healthy and idle
  let idle = false, st = null;
  for (let i = 0; i < 40 && !idle; i++) {
    await new Promise((res) => setTimeout(res, 250));
    st = await (await fetch(srv.url + '/stats')).json();
    idle = st.engine.running === 0 && st.engine.queue_len === 0 && st.server.generations_active === 0 && st.server.streams_active === 0;
  }
  check(idle, 'idle after the soak: no running or waiting request, generation or stream', st && { engine: st.engine, server: st.server });
  const t1 = Date.now();
  const h = await fetch(srv.url + '/health');
  check(h.status === 200 && Date.now() - t1 < 1000, 'healthy after the soak');
  check((await greedy()) === before, 'the same greedy answer as before the soak');
} finally {
  const r = await srv.stop();
  check(r.code === 0, 'clean shutdown after the soak', r);
  check(!/AddressSanitizer|runtime error/.test(srv.log()), 'no sanitizer report');
}
process.exit(summary('soak'));
