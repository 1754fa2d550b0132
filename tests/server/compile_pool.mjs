// Grammar compiles run on a bounded worker pool (src/server/compile_pool.c):
//  - a 100,000-value enum answers (200 or 400) within the compile time
//    limit (2 s) plus 1 s;
//  - with --compile-threads 1, three heavy compiles at once never run more
//    than one at a time (the others queue), while /health stays quick;
//  - a client that disconnects mid-compile cancels it at once;
//  - SIGTERM during a compile exits within 2 s.
// Each heavy request's enum differs (a per-request prefix), so no compile
// is served from the cache (failures are cached too).
import net from 'node:net';
import { startServer, check, summary } from './lib.mjs';

const LIMIT_MS = 2000;
let serial = 0;
function enumBody(n = 100000) {
  const tag = `r${serial++}_${process.pid}_`;
  const vals = [];
  for (let i = 0; i < n; i++) vals.push(`${tag}${i.toString(36)}_${((i * 2654435761) >>> 0).toString(36)}`);
  return JSON.stringify({
    messages: [{ role: 'user', content: 'pick one' }], max_tokens: 4,
    response_format: { type: 'json_schema', json_schema: { name: 'e', schema: { enum: vals } } },
  });
}
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

async function post(url, body, signal) {
  const t0 = performance.now();
  try {
    const r = await fetch(url, { method: 'POST', headers: { 'Content-Type': 'application/json' }, body, signal });
    const text = await r.text();
    return { status: r.status, text, ms: performance.now() - t0 };
  } catch (e) {
    return { error: String(e), ms: performance.now() - t0 };
  }
}
const stats = async (url) => (await fetch(`${url}/stats`).then((r) => r.json())).server;

// Sends body on a raw socket and resolves once the server has read it all
// (the socket's write callback) with the socket, for the caller to close.
function sendRaw(port, path, body) {
  return new Promise((resolve) => {
    const s = net.connect(port, '127.0.0.1');
    s.on('error', () => {});
    const b = Buffer.from(body);
    s.write(`POST ${path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: ${b.length}\r\n\r\n`);
    s.write(b, () => resolve(s));
  });
}

// ---- 1. the time limit, end to end ----
{
  const srv = await startServer([]);
  const url = `${srv.url}/v1/chat/completions`;
  const r = await post(url, enumBody());
  console.log(`100k enum: ${r.status} in ${r.ms.toFixed(0)} ms`);
  check(r.status === 200 || r.status === 400, '100k-value enum: 200 or 400', r);
  check(r.ms < LIMIT_MS + 1000, '100k-value enum answered within the compile limit + 1 s', r.ms);
  if (r.status === 400) check(/grammar_too_complex/.test(r.text), 'a 400 says the grammar is too complex', r.text.slice(0, 300));

  // ---- 3. a disconnect cancels the compile ----
  const before = await stats(srv.url);
  const s = await sendRaw(srv.port, '/v1/chat/completions', enumBody());
  let mid;
  for (let i = 0; i < 300; i++) { // until its compile runs (the body is parsed first)
    mid = await stats(srv.url);
    if (mid.grammar_compiles_running > 0) break;
    await sleep(10);
  }
  check(mid.grammar_compiles_running === 1, 'the compile runs on a worker', mid);
  await sleep(100);
  const tGone = performance.now();
  s.destroy();
  let after = mid;
  while (performance.now() - tGone < 1500) {
    after = await stats(srv.url);
    if (after.grammar_compiles_running === 0) break;
    await sleep(20);
  }
  const cancelMs = performance.now() - tGone;
  console.log(`disconnect: compile ended ${cancelMs.toFixed(0)} ms after the client left`);
  check(after.grammar_compiles_running === 0 && cancelMs < 500, 'the compile stops within 0.5 s of the disconnect', { cancelMs, after });
  check(after.grammar_compiles_cancelled === before.grammar_compiles_cancelled + 1, 'counted as cancelled', after);
  const ok = await fetch(`${srv.url}/health`);
  check(ok.status === 200, 'healthy after', ok.status);
  const rs = await srv.stop();
  check(rs.code === 0, 'clean exit', rs);
}

// ---- 2. the pool is bounded ----
{
  const srv = await startServer(['--compile-threads', '1']);
  const url = `${srv.url}/v1/chat/completions`;
  const bodies = [enumBody(), enumBody(), enumBody()];
  const reqs = bodies.map((b) => post(url, b));
  let maxRunning = 0, maxQueued = 0, worstHealth = 0, samples = 0;
  let settled = false;
  Promise.all(reqs).then(() => { settled = true; });
  while (!settled) {
    const st = await stats(srv.url);
    maxRunning = Math.max(maxRunning, st.grammar_compiles_running);
    maxQueued = Math.max(maxQueued, st.grammar_compiles_queued);
    const t0 = performance.now();
    await fetch(`${srv.url}/health`);
    worstHealth = Math.max(worstHealth, performance.now() - t0);
    samples++;
    await sleep(50);
  }
  const rs = await Promise.all(reqs);
  console.log(`pool of 1: ${rs.map((r) => `${r.status}/${r.ms.toFixed(0)}ms`).join(' ')}; max running ${maxRunning}, max queued ${maxQueued}, worst /health ${worstHealth.toFixed(0)} ms over ${samples} samples`);
  check(rs.every((r) => r.status === 200 || r.status === 400), 'every queued compile answers', rs.map((r) => r.status));
  check(maxRunning === 1, 'never more than --compile-threads compiles at once', maxRunning);
  check(maxQueued >= 1, 'the others waited in the queue', maxQueued);
  check(worstHealth < 1000, '/health stays quick meanwhile', worstHealth);
  const r2 = await srv.stop();
  check(r2.code === 0, 'clean exit', r2);
}

// ---- 4. SIGTERM during a compile ----
{
  const srv = await startServer([]);
  const pending = post(`${srv.url}/v1/chat/completions`, enumBody());
  let st;
  for (let i = 0; i < 100; i++) { // until the compile runs
    st = await stats(srv.url);
    if (st.grammar_compiles_running > 0) break;
    await sleep(10);
  }
  check(st.grammar_compiles_running > 0, 'a compile is running when the signal comes', st);
  const t0 = performance.now();
  const r = await srv.stop();
  const ms = performance.now() - t0;
  console.log(`SIGTERM during a compile: exit ${r.code} after ${ms.toFixed(0)} ms`);
  check(r.code === 0, 'exit code 0', r);
  check(ms < 2000, 'SIGTERM during a compile exits within 2 s', ms);
  const pr = await pending;
  check(pr.status === 503 || pr.error !== undefined, 'the request in flight gets 503 or a closed connection', pr);
}

process.exit(summary('compile_pool'));
