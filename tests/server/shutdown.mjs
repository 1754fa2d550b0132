// Stopping the server (SIGTERM) while clients are in every state a
// connection can be in: streaming and reading, cancelling mid-stream (some
// exactly at the moment of the signal), not reading at all (full socket
// buffers), waiting for a non-streaming answer, queued behind a full batch,
// idle on keep-alive, and half-way through sending a body. Each round must
// end with exit code 0 (no crash; a hang ends in lib.mjs's SIGKILL after
// 15 s) and a log without errors or sanitizer reports. Rounds are short and
// the signal comes at a different moment in each (seeded), so the many
// orderings of shutdown against the connections' completion callbacks, the
// content readers' free callbacks and the engine's per-token notifications
// get exercised. TERN_SHUTDOWN_ROUNDS / TERN_SHUTDOWN_SEED for longer hunts.
import http from 'node:http';
import net from 'node:net';
import { startServer, check, summary } from './lib.mjs';

const ROUNDS = Number(process.env.TERN_SHUTDOWN_ROUNDS || 4);
let seed = Number(process.env.TERN_SHUTDOWN_SEED || 12345);
function rand() { // xorshift32: reproducible rounds
  seed ^= seed << 13; seed >>>= 0; seed ^= seed >>> 17; seed ^= seed << 5; seed >>>= 0;
  return seed / 4294967296;
}
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

function chatBody(i, extra = {}) {
  return JSON.stringify({ messages: [{ role: 'user', content: `Tell me a story about number ${i}.` }],
    max_tokens: 400, ignore_eos: true, temperature: 0, ...extra });
}

// A streaming request; cancelAfter > 0: destroy the socket after that many SSE events;
// noRead: read one chunk, then stop reading (the server's writes back up).
function stream(url, agent, i, { cancelAfter = 0, noRead = false, extra = {} } = {}) {
  let req;
  const done = new Promise((resolve) => {
    const u = new URL(url + '/v1/chat/completions');
    req = http.request({ host: u.hostname, port: u.port, path: u.pathname, method: 'POST', agent,
      headers: { 'Content-Type': 'application/json' } }, (res) => {
      let events = 0;
      res.on('data', (d) => {
        if (noRead) { res.pause(); return; }
        events += (d.toString().match(/\n\n/g) || []).length;
        if (cancelAfter && events >= cancelAfter) { req.destroy(); resolve('cancelled'); }
      });
      res.on('end', () => resolve('end'));
      res.on('error', () => resolve('error'));
      res.on('aborted', () => resolve('aborted'));
    });
    req.on('error', () => resolve('error'));
    req.end(chatBody(i, { stream: true, ...extra }));
  });
  return { req, done };
}

function plain(url, agent, i) {
  let req;
  const done = new Promise((resolve) => {
    const u = new URL(url + '/v1/chat/completions');
    req = http.request({ host: u.hostname, port: u.port, path: u.pathname, method: 'POST', agent,
      headers: { 'Content-Type': 'application/json' } }, (res) => {
      res.resume();
      res.on('end', () => resolve('end'));
      res.on('error', () => resolve('error'));
    });
    req.on('error', () => resolve('error'));
    req.end(chatBody(i, { max_tokens: 60 + (i % 5) * 40 }));
  });
  return { req, done };
}

// Headers and half a body, then silence (MHD is still reading the upload).
function partialBody(port) {
  const s = net.connect(port, '127.0.0.1', () => {
    s.write('POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n' +
      'Content-Length: 200\r\n\r\n{"messages": [');
  });
  s.on('error', () => {});
  return s;
}

async function oneRound(k) {
  const srv = await startServer(['--max-batch', '8', '--max-queue', '64', '--kv-budget', '0.25']);
  const agent = new http.Agent({ keepAlive: true, maxSockets: 64 });
  const idle = new http.Agent({ keepAlive: true, maxSockets: 48 });
  const reqs = [];
  const sockets = [];
  try {
    // idle keep-alive connections (some are closed at the moment of the signal)
    await Promise.all(Array.from({ length: 8 + Math.floor(rand() * 40) }, () => new Promise((resolve) => {
      http.get(srv.url + '/health', { agent: idle }, (res) => { res.resume(); res.on('end', resolve); })
        .on('error', resolve);
    })));
    const nStream = 6 + Math.floor(rand() * 10);
    for (let i = 0; i < nStream; i++) {
      const r = rand();
      if (r < 0.3) reqs.push(stream(srv.url, agent, i, { cancelAfter: 1 + Math.floor(rand() * 20) }));
      else if (r < 0.45) reqs.push(stream(srv.url, agent, i, { noRead: true, extra: { logprobs: true, top_logprobs: 20, max_tokens: 1500 } }));
      else if (r < 0.7) reqs.push(plain(srv.url, agent, i));
      else reqs.push(stream(srv.url, agent, i, { extra: { n: 1 + Math.floor(rand() * 3) } }));
    }
    sockets.push(partialBody(srv.port));
    // wait for a random moment: while queued, prefilling, mid-stream or finishing
    await sleep(Math.floor(rand() * 1200));
    // destroy some clients at the very moment of the signal
    const racing = reqs.filter(() => rand() < 0.3);
    const closeIdle = rand() < 0.5;
    srv.proc.kill('SIGTERM');
    for (const r of racing) r.req.destroy();
    if (closeIdle) idle.destroy();
    const t0 = Date.now();
    const ex = await srv.stop();
    const ms = Date.now() - t0;
    check(ex.code === 0 && ex.sig === null, `round ${k}: server exits cleanly after SIGTERM`, { ...ex, log: srv.log().slice(-3000) });
    check(!/error|sanitizer|leak|runtime error/i.test(srv.log()), `round ${k}: no error in the server log`, srv.log().slice(-3000));
    console.log(`round ${k}: ${nStream} clients, stopped in ${ms} ms (exit ${ex.code}${ex.sig ? ' ' + ex.sig : ''})`);
  } finally {
    for (const r of reqs) r.req.destroy();
    for (const s of sockets) s.destroy();
    agent.destroy();
    idle.destroy();
    if (srv.proc.exitCode === null && srv.proc.signalCode === null) srv.proc.kill('SIGKILL');
  }
}

try {
  for (let k = 0; k < ROUNDS; k++) await oneRound(k);
} catch (e) {
  check(false, 'unexpected exception', e && e.stack ? e.stack : String(e));
}
process.exit(summary('shutdown'));
