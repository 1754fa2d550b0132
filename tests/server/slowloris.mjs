// Connection abuse: 600 connections from six client addresses
// (127.0.0.2-7, 100 each) trickle header bytes (one every 2 s, which
// keeps resetting an idle timeout) and reconnect when the server closes
// them, for a bounded time. Meanwhile /health and an
// authenticated request must each answer within 1 s, every time. Then: a
// lone trickling connection is closed by the header deadline although it
// never goes idle, a slow body by the body deadline, and the guard's
// counters show in /stats and /metrics. The server's connection guard is
// src/server/guard.c.
import net from 'node:net';
import { startServer, check, summary } from './lib.mjs';

const KEY = 'slowloris-key';
const N_SLOW = 600, ATTACK_MS = 8000, PROBE_EVERY_MS = 400, LIMIT_MS = 1000;
const srv = await startServer(['--api-key', KEY, '--header-deadline', '3', '--body-deadline', '3']);
const u = new URL(srv.url);
const port = Number(u.port);

// A GET on a fresh connection; resolves {status, ms} or {error, ms}.
function get(path, headers = '', timeoutMs = 5000) {
  return new Promise((resolve) => {
    const t0 = performance.now();
    const s = net.connect(port, '127.0.0.1');
    let buf = '';
    const done = (r) => { clearTimeout(t); s.destroy(); resolve({ ...r, ms: performance.now() - t0 }); };
    const t = setTimeout(() => done({ error: 'timeout' }), timeoutMs);
    s.on('data', (d) => {
      buf += d.toString('latin1');
      const m = buf.match(/^HTTP\/1\.[01] (\d{3})/);
      if (m && buf.includes('\r\n\r\n')) done({ status: Number(m[1]) });
    });
    s.on('error', (e) => done({ error: e.code || String(e) }));
    s.on('close', () => done({ error: 'closed' }));
    s.write(`GET ${path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n${headers}\r\n`);
  });
}

// ---- the attack ----
let attacking = true, opened = 0, closedByServer = 0;
const slow = new Set();
function trickle(i) {
  if (!attacking) return;
  const s = net.connect({ port, host: '127.0.0.1', localAddress: `127.0.0.${2 + (i % 6)}` });
  const rec = { s, iv: null };
  slow.add(rec);
  opened++;
  s.on('connect', () => {
    s.write('GET /v1/models HTTP/1.1\r\nHost: x\r\n');
    rec.iv = setInterval(() => s.write('X'), 2000);
  });
  s.on('error', () => {});
  s.on('close', () => {
    clearInterval(rec.iv);
    slow.delete(rec);
    if (attacking) { closedByServer++; setTimeout(() => trickle(i), 1000); } // a real attacker comes back
  });
}
for (let i = 0; i < N_SLOW; i++) trickle(i);
await new Promise((r) => setTimeout(r, 1500)); // let them all connect

const health = [], authed = [];
const t0 = performance.now();
while (performance.now() - t0 < ATTACK_MS) {
  const [h, a] = await Promise.all([get('/health'), get('/v1/models', `Authorization: Bearer ${KEY}\r\n`)]);
  health.push(h);
  authed.push(a);
  await new Promise((r) => setTimeout(r, PROBE_EVERY_MS));
}
const alive = slow.size;
attacking = false;
for (const { s, iv } of slow) { clearInterval(iv); s.destroy(); }

const worst = (xs) => Math.max(...xs.map((x) => (x.status ? x.ms : Infinity)));
console.log(`slowloris: ${opened} connections opened, ${alive} open at the end, ${closedByServer} closed by the server; ` +
  `${health.length} probes, worst /health ${worst(health).toFixed(0)} ms, worst authenticated ${worst(authed).toFixed(0)} ms`);
// connections still reading a request hold at most 512 - 512 / 8 slots
check(alive >= 400, 'the attack held hundreds of connections open', alive);
check(health.length >= 10, 'probes ran', health.length);
check(health.every((h) => h.status === 200 && h.ms < LIMIT_MS), '/health answers 200 within 1 s under 600 slow connections',
  health.filter((h) => !(h.status === 200 && h.ms < LIMIT_MS)).slice(0, 5));
check(authed.every((a) => a.status === 200 && a.ms < LIMIT_MS), 'an authenticated request answers within 1 s under attack',
  authed.filter((a) => !(a.status === 200 && a.ms < LIMIT_MS)).slice(0, 5));
const noKey = await get('/v1/models');
check(noKey.status === 401, 'the key is still required', noKey);

// ---- deadlines: a connection that never goes idle is still closed ----
function slowConn(first, every, byte) {
  return new Promise((resolve) => {
    const t0 = performance.now();
    const s = net.connect(port, '127.0.0.1');
    let iv = null, got = '';
    const stop = setTimeout(() => { s.destroy(); resolve({ open: true }); }, 10000);
    s.on('connect', () => { s.write(first); iv = setInterval(() => s.write(byte), every); });
    s.on('data', (d) => { got += d.toString('latin1'); });
    s.on('error', () => {});
    s.on('close', () => { clearInterval(iv); clearTimeout(stop); resolve({ ms: performance.now() - t0, got }); });
  });
}
await new Promise((r) => setTimeout(r, 1000));
const [hd, bd] = await Promise.all([
  slowConn('GET /health HTTP/1.1\r\nHost: x\r\n', 300, 'X'),
  slowConn(`POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer ${KEY}\r\nContent-Type: application/json\r\nContent-Length: 100000\r\n\r\n{"prompt":"`, 300, 'a'),
]);
check(!hd.open && hd.ms > 2500 && hd.ms < 5000, 'trickled headers are cut at the 3 s header deadline', hd);
check(!bd.open && bd.ms > 2500 && bd.ms < 5000, 'a trickled body is cut at the 3 s body deadline', bd);

// ---- counters ----
const stats = await fetch(`${srv.url}/stats`).then((r) => r.json());
check(stats.server.connections_evicted > 0, '/stats counts evicted connections', stats.server);
check(stats.server.connections_past_deadline >= 2, '/stats counts connections past a deadline', stats.server);
const prom = await fetch(`${srv.url}/metrics`).then((r) => r.text());
check(/tern_connections_closed_total\{reason="evicted"\} [1-9]/.test(prom), '/metrics has the eviction counter');

const health2 = await get('/health');
check(health2.status === 200, 'healthy after the attack', health2);
const r = await srv.stop();
check(r.code === 0, 'clean exit on SIGTERM', r);

// ---- the per-client cap: one address holds at most its share ----
const srv2 = await startServer(['--max-client-connections', '20']);
const port2 = Number(new URL(srv2.url).port);
const capped = [];
for (let i = 0; i < 40; i++) {
  const s = net.connect({ port: port2, host: '127.0.0.1', localAddress: '127.0.0.9' });
  s.on('error', () => {});
  s.on('connect', () => s.write('GET /health HTTP/1.1\r\nHost: x\r\n'));
  capped.push(s);
  await new Promise((res) => setTimeout(res, 20));
}
await new Promise((res) => setTimeout(res, 1000));
const open = capped.filter((s) => !s.destroyed && s.readyState === 'open').length;
check(open <= 21 && open >= 15, 'one client address keeps at most --max-client-connections', open);
const other = await new Promise((resolve) => {
  const s = net.connect(port2, '127.0.0.1');
  let buf = '';
  s.on('data', (d) => { buf += d; });
  s.on('close', () => resolve(buf.slice(0, 12)));
  s.on('error', () => resolve('error'));
  s.write('GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n');
});
check(other === 'HTTP/1.1 200', 'another client is served meanwhile', other);
for (const s of capped) s.destroy();
const r2 = await srv2.stop();
check(r2.code === 0, 'clean exit on SIGTERM (capped server)', r2);
process.exit(summary('slowloris'));
