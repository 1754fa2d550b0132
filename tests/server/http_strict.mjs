// HTTP strictness (the framing and headers around a body, before any field
// is read): duplicate or conflicting Content-Length and Content-Length with
// Transfer-Encoding are 400 (request smuggling); a body with a non-JSON
// Content-Type is 415; a JSON `null` body is a 400 that says the body must
// be an object; the key is accepted as `x-api-key` as well as a bearer
// token; --metrics-key guards /stats and /metrics; --host 0.0.0.0 without a
// key warns. Every error in OpenAI's shape.
import net from 'node:net';
import { startServer, check, summary } from './lib.mjs';

// a server's stop: a clean exit and nothing a sanitizer says
async function stopClean(srv, what) {
  const r = await srv.stop();
  check(r.code === 0, `${what}: exit 0`, r);
  check(!/Sanitizer|runtime error/.test(srv.log()), `${what}: no sanitizer report`, srv.log().slice(-2000));
}

function raw(port, bytes, { timeoutMs = 10000 } = {}) {
  return new Promise((resolve) => {
    const s = net.connect(port, '127.0.0.1');
    const chunks = [];
    const t = setTimeout(() => { s.destroy(); resolve({ timeout: true }); }, timeoutMs);
    s.on('data', (d) => chunks.push(d));
    s.on('error', () => {});
    s.on('close', () => {
      clearTimeout(t);
      const buf = Buffer.concat(chunks).toString('latin1');
      const m = buf.match(/^HTTP\/1\.[01] (\d{3})/);
      if (!m) return resolve({ closed: true });
      const [head, ...rest] = buf.split('\r\n\r\n');
      let body = rest.join('\r\n\r\n');
      if (/transfer-encoding: chunked/i.test(head)) body = body.replace(/^[0-9a-f]+\r\n/i, '').replace(/\r\n0\r\n\r\n$/, '');
      resolve({ status: Number(m[1]), head, body });
    });
    // write without half-closing: a client that shuts its side down is gone, and its generation cancelled
    s.write(bytes);
  });
}

function errorOf(body) {
  try {
    const j = JSON.parse(body);
    if (j && j.error && typeof j.error.message === 'string' && 'type' in j.error && 'param' in j.error && 'code' in j.error)
      return j.error;
  } catch { /* not JSON */ }
  return null;
}

const CHAT = '/v1/chat/completions';
const BODY = JSON.stringify({ messages: [{ role: 'user', content: 'hi' }], max_tokens: 2, temperature: 0 });

const srv = await startServer();
const port = srv.port;
try {
  const head = (extra) => `POST ${CHAT} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n${extra}\r\n`;
  // the framing: one Content-Length, stated once
  for (const [what, hdrs] of [
    ['two equal Content-Length headers', `Content-Type: application/json\r\nContent-Length: ${BODY.length}\r\nContent-Length: ${BODY.length}\r\n`],
    ['two different Content-Length headers', `Content-Type: application/json\r\nContent-Length: ${BODY.length}\r\nContent-Length: 5\r\n`],
    ['a Content-Length list', `Content-Type: application/json\r\nContent-Length: ${BODY.length}, ${BODY.length}\r\n`],
    ['Content-Length and Transfer-Encoding', `Content-Type: application/json\r\nContent-Length: ${BODY.length}\r\nTransfer-Encoding: chunked\r\n`],
  ]) {
    const body = what.includes('Transfer') ? `${BODY.length.toString(16)}\r\n${BODY}\r\n0\r\n\r\n` : BODY;
    const r = await raw(port, head(hdrs) + body);
    const e = errorOf(r.body || '');
    check(r.status === 400, `${what}: 400`, r.status ?? r);
    if (what.includes('list')) continue; // libmicrohttpd refuses a malformed value itself, with its own page
    check(e !== null, `${what}: OpenAI error shape`, (r.body || '').slice(0, 200));
    if (e) check(/Content-Length|Transfer-Encoding/.test(e.message), `${what}: the message names the header`, e.message);
  }
  // one Content-Length is fine
  const ok = await raw(port, head(`Content-Type: application/json\r\nContent-Length: ${BODY.length}\r\n`) + BODY, { timeoutMs: 60000 });
  check(ok.status === 200, 'a well-framed request is 200', ok.status ?? ok);

  // the media type of a body
  // text/plain is what fetch() sends for a string body it was not told the type of: parsed as JSON
  for (const [ct, want] of [['text/plain;charset=UTF-8', 200], ['application/x-www-form-urlencoded', 415], ['multipart/form-data; boundary=x', 415],
    ['application/xml', 415], ['application/json', 200], ['application/json; charset=utf-8', 200], ['Application/JSON', 200],
    ['application/vnd.api+json', 200], [null, 200]]) {
    const r = await raw(port, head(`${ct ? `Content-Type: ${ct}\r\n` : ''}Content-Length: ${BODY.length}\r\n`) + BODY, { timeoutMs: 60000 });
    check(r.status === want, `Content-Type ${ct}: ${want}`, r.status ?? r);
    if (want === 415) {
      const e = errorOf(r.body || '');
      check(e && /Content-Type/.test(e.message) && /application\/json/.test(e.message), `Content-Type ${ct}: the 415 says what to send`, r.body);
    }
  }
  // a body of JSON null (and other non-objects): 400 saying an object is wanted
  for (const b of ['null', ' null\n', '[]', '"x"', '42', 'true']) {
    const r = await raw(port, head(`Content-Type: application/json\r\nContent-Length: ${Buffer.byteLength(b)}\r\n`) + b);
    const e = errorOf(r.body || '');
    check(r.status === 400 && e && /JSON object/.test(e.message), `body ${JSON.stringify(b)}: 400 asking for a JSON object`, r.body);
  }
  // MHD's own refusals, where it lets us answer, are JSON too: an unknown method
  const tr = await raw(port, `TRACE /v1/models HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n`);
  check(tr.status >= 400 && tr.status < 500 && errorOf(tr.body || ''), 'TRACE: a 4xx in OpenAI shape', tr.status ?? tr);
} finally {
  await stopClean(srv, 'strict server');
}

// keys: the API key as a bearer token or as x-api-key; the metrics key
const keyed = await startServer(['--api-key', 'sekret', '--metrics-key', 'mkey']);
try {
  const get = (path, headers = {}) => fetch(keyed.url + path, { headers });
  check((await get('/v1/models')).status === 401, 'no key: 401');
  check((await get('/v1/models', { Authorization: 'Bearer sekret' })).status === 200, 'Authorization: Bearer: 200');
  check((await get('/v1/models', { 'x-api-key': 'sekret' })).status === 200, 'x-api-key: 200');
  check((await get('/v1/models', { 'X-Api-Key': 'wrong' })).status === 401, 'a wrong x-api-key: 401');
  check((await get('/v1/models', { Authorization: 'Bearer wrong', 'x-api-key': 'sekret' })).status === 401,
    'a wrong bearer token is not rescued by x-api-key', 'status');
  for (const p of ['/stats', '/metrics']) {
    const r = await get(p);
    check(r.status === 401, `${p} without the metrics key: 401`, r.status);
    check(errorOf(await r.text()), `${p} 401 in OpenAI shape`);
    check((await get(p, { Authorization: 'Bearer sekret' })).status === 401, `${p} with the API key (not the metrics key): 401`);
    check((await get(p, { Authorization: 'Bearer mkey' })).status === 200, `${p} with the metrics key: 200`);
    check((await get(p, { 'x-api-key': 'mkey' })).status === 200, `${p} with the metrics key as x-api-key: 200`);
  }
  check((await get('/health')).status === 200, '/health stays open');
  check((await get('/v1/models', { Authorization: 'Bearer mkey' })).status === 401, 'the metrics key is no API key');
} finally {
  await stopClean(keyed, 'keyed server');
}
// without --metrics-key, /stats and /metrics stay open
const open = await startServer(['--api-key', 'sekret']);
try {
  check((await fetch(open.url + '/metrics')).status === 200, 'no --metrics-key: /metrics open');
} finally {
  await stopClean(open, 'open server');
}

// listening beyond loopback with no key warns; with a key, or on loopback, it does not
const wide = await startServer(['--host', '0.0.0.0']);
await wide.stop();
check(/warn/i.test(wide.log()) && /no --api-key/.test(wide.log()), '--host 0.0.0.0 without a key warns', wide.log());
const wideKeyed = await startServer(['--host', '0.0.0.0', '--api-key', 'k']);
await wideKeyed.stop();
check(!/--api-key/.test(wideKeyed.log().replace(/serving[^\n]*/, '')), '--host 0.0.0.0 with a key: no warning', wideKeyed.log());
check(!/api-key/.test(srv.log().replace(/serving[^\n]*/, '')), 'loopback without a key: no warning', srv.log());

process.exit(summary('http_strict'));
