// 64 concurrent streaming chat requests over keep-alive connections, every
// fourth one cancelled mid-stream by closing its connection. Every completed
// stream must be well-formed SSE and equal (greedy) the same request run
// alone; the cancellations must reach the engine; the server's memory after
// a second identical round must be back at the level of the first (no
// leak); the server log must hold no error. Bounded in time (TIMEOUT).
import http from 'node:http';
import { startServer, check, summary, rssKiB, parseSSE } from './lib.mjs';

const N = 64, MAX_TOKENS = 20, CANCEL_EVERY = 4;
const srv = await startServer(['--kv-budget', '0.25', '--max-batch', '64']);
const agent = new http.Agent({ keepAlive: true, maxSockets: N });
const prompts = [];
for (let i = 0; i < 8; i++) prompts.push(`Tell me about topic number ${i}: ${['birds', 'rivers', 'stars', 'code', 'bread', 'music', 'snow', 'tea'][i]}.`);

function body(i) {
  return JSON.stringify({ messages: [{ role: 'user', content: prompts[i % prompts.length] }], max_tokens: MAX_TOKENS,
    temperature: 0, stream: true, stream_options: { include_usage: true } });
}

// One streaming request; cancelAfter = number of data events before closing the connection.
function stream(i, cancelAfter = 0) {
  return new Promise((resolve) => {
    const u = new URL(srv.url + '/v1/chat/completions');
    const req = http.request({ host: u.hostname, port: u.port, path: u.pathname, method: 'POST', agent,
      headers: { 'Content-Type': 'application/json' } }, (res) => {
      let raw = '', events = 0;
      res.setEncoding('utf8');
      res.on('data', (d) => {
        raw += d;
        events += (d.match(/\n\n/g) || []).length;
        if (cancelAfter && events >= cancelAfter) { req.destroy(); resolve({ i, cancelled: true }); }
      });
      res.on('end', () => resolve({ i, status: res.statusCode, ctype: res.headers['content-type'], raw }));
      res.on('error', () => resolve({ i, cancelled: true }));
    });
    req.on('error', (e) => resolve({ i, cancelled: !!cancelAfter, error: cancelAfter ? undefined : String(e) }));
    req.end(body(i));
  });
}

// Validates an SSE chat stream; returns the text or null.
function validate(r, what) {
  if (!check(r.status === 200 && /text\/event-stream/.test(r.ctype || ''), `${what}: 200 event-stream`, r.error || r.status)) return null;
  const data = parseSSE(r.raw);
  if (!check(data.length >= 4 && data[data.length - 1] === '[DONE]', `${what}: ends with [DONE]`, data.slice(-2))) return null;
  let text = '', role = false, finish = null, usage = null, ok = true, id = null;
  for (const d of data.slice(0, -1)) {
    let o;
    try { o = JSON.parse(d); } catch { ok = false; break; }
    id ??= o.id;
    ok &&= o.id === id && o.object === 'chat.completion.chunk';
    if (o.choices.length === 0) { usage = o.usage; continue; }
    const c = o.choices[0];
    if (c.delta.role) role = true;
    if (c.delta.content) text += c.delta.content;
    if (c.finish_reason) finish = c.finish_reason;
  }
  check(ok && role && finish && usage && usage.completion_tokens > 0, `${what}: well-formed chunks`, { ok, role, finish, usage });
  return text;
}

async function waitIdle() {
  for (let t = 0; t < 100; t++) {
    const st = await (await fetch(srv.url + '/stats')).json();
    if (st.server.generations_active === 0 && st.engine.queue_len === 0 && st.engine.kv_blocks_used === st.engine.kv_blocks_cached) return st;
    await new Promise((r) => setTimeout(r, 100));
  }
  return (await fetch(srv.url + '/stats')).json();
}

async function round(ref, label) {
  const t0 = Date.now();
  const res = await Promise.all(Array.from({ length: N }, (_, i) => stream(i, i % CANCEL_EVERY === CANCEL_EVERY - 1 ? 3 : 0)));
  let done = 0, cancelled = 0, equal = 0;
  for (const r of res) {
    if (r.cancelled) { cancelled++; continue; }
    const text = validate(r, `${label} stream ${r.i}`);
    if (text === null) continue;
    done++;
    if (check(text === ref[r.i % prompts.length], `${label} stream ${r.i} == alone`, { got: text, want: ref[r.i % prompts.length] })) equal++;
  }
  console.log(`${label}: ${done} completed (${equal} equal to solo runs), ${cancelled} cancelled in ${Date.now() - t0} ms`);
  return { done, cancelled };
}

try {
  // references: each prompt alone
  const ref = [];
  for (let i = 0; i < prompts.length; i++) ref.push(validate(await stream(i), `solo ${i}`));
  const base0 = await waitIdle();
  const r1 = await round(ref, 'round 1');
  check(r1.done === N - N / CANCEL_EVERY && r1.cancelled === N / CANCEL_EVERY, 'round 1 counts', r1);
  const st1 = await waitIdle();
  check(st1.server.generations_active === 0 && st1.server.streams_active === 0, 'no generation left after round 1', st1.server);
  check(st1.engine.requests_cancelled - base0.engine.requests_cancelled >= 1, 'client disconnects cancel engine requests', st1.engine);
  check(st1.server.generations_disconnected - base0.server.generations_disconnected === N / CANCEL_EVERY, 'disconnects counted', st1.server);
  const rss1 = rssKiB(srv.proc.pid);
  const r2 = await round(ref, 'round 2');
  check(r2.done === N - N / CANCEL_EVERY, 'round 2 counts', r2);
  await waitIdle();
  await new Promise((r) => setTimeout(r, 300));
  const rss2 = rssKiB(srv.proc.pid);
  console.log(`rss after round 1: ${rss1} KiB, after round 2: ${rss2} KiB`);
  check(rss2 <= rss1 * 1.05 + 8192, 'memory back at baseline after a second round', { rss1, rss2 });
  // a client that stops reading (its socket buffers fill, the server's writes to it block) must
  // not stall anyone else
  let slowReq = null, slowBytes = 0;
  const slowDone = new Promise((resolve) => {
    const u = new URL(srv.url + '/v1/chat/completions');
    slowReq = http.request({ host: u.hostname, port: u.port, path: u.pathname, method: 'POST',
      headers: { 'Content-Type': 'application/json' } }, (res) => {
      res.once('data', (d) => { slowBytes += d.length; res.pause(); resolve(true); });
    });
    slowReq.on('error', () => resolve(false));
    slowReq.end(JSON.stringify({ messages: [{ role: 'user', content: 'Tell me a long story.' }], max_tokens: 1500,
      ignore_eos: true, temperature: 0, stream: true, logprobs: true, top_logprobs: 20 }));
  });
  check(await slowDone, 'slow client started', slowBytes);
  await new Promise((r) => setTimeout(r, 1500));
  const t0 = Date.now();
  const others = await Promise.all(prompts.map((_, i) => stream(i)));
  const okOthers = others.filter((r, i) => validate(r, `beside a slow client ${i}`) === ref[i]).length;
  check(okOthers === prompts.length, 'streams beside a non-reading client complete and are correct', okOthers);
  console.log(`beside a non-reading client: ${okOthers}/${prompts.length} streams in ${Date.now() - t0} ms`);
  slowReq.destroy();
  const st3 = await waitIdle();
  check(st3.server.generations_active === 0, 'the slow client\'s generation is released when it leaves', st3.server);
  // the server still answers
  const h = await fetch(srv.url + '/health');
  check(h.status === 200, 'server still up');
} catch (e) {
  check(false, 'unexpected exception', e && e.stack ? e.stack : String(e));
} finally {
  agent.destroy();
  const ex = await srv.stop();
  check(ex.code === 0, 'server exits cleanly', ex);
  check(!/error|sanitizer|leak/i.test(srv.log()), 'no error in the server log', srv.log().slice(-2000));
}
process.exit(summary('concurrency'));
