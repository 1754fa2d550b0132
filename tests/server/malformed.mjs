// Malformed requests: truncated JSON, wrong types, huge numbers, invalid
// UTF-8, deep nesting, oversized bodies, unknown fields, bad HTTP, oversized
// headers and slow headers. Every body-level case must get a 4xx in
// OpenAI's error shape; header-level cases a 4xx or a closed connection; the
// server must stay up and keep serving others meanwhile. The bodies in
// tests/fuzz/corpus/http_request/bad_* (chat requests) are replayed here too.
import fs from 'node:fs';
import net from 'node:net';
import path from 'node:path';
import { startServer, check, summary, ROOT } from './lib.mjs';

const srv = await startServer(['--timeout', '2']);
const u = new URL(srv.url);

// Raw HTTP/1.1 exchange on a fresh socket; resolves {status, headers, body} or {closed}.
// halfClose: end our side after sending (the server takes a client that
// half-closes while its request waits, for a compile or a generation, as
// gone: requests that reach those send Connection: close instead).
function raw(bytes, { timeoutMs = 10000, halfClose = true } = {}) {
  return new Promise((resolve) => {
    const s = net.connect(Number(u.port), u.hostname);
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
    if (halfClose) s.end(bytes); else s.write(bytes);
  });
}

function post(url, body, extra = '') {
  const b = Buffer.isBuffer(body) ? body : Buffer.from(body, 'utf8');
  const head = `POST ${url} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: ${b.length}\r\nConnection: close\r\n${extra}\r\n`;
  return raw(Buffer.concat([Buffer.from(head, 'latin1'), b]), { halfClose: false });
}

function isOpenAIError(body) {
  try {
    const j = JSON.parse(body);
    return j && j.error && typeof j.error.message === 'string' && 'type' in j.error && 'param' in j.error && 'code' in j.error;
  } catch { return false; }
}

async function expect4xx(name, url, body, extra) {
  const r = await post(url, body, extra);
  check(r.status >= 400 && r.status < 500, `${name}: 4xx`, r.status ?? r);
  check(isOpenAIError(r.body || ''), `${name}: OpenAI error shape`, (r.body || '').slice(0, 200));
  return r;
}

const CHAT = '/v1/chat/completions', CMPL = '/v1/completions';
const msg = '[{"role":"user","content":"hi"}]';
const cases = [
  ['empty body', ''],
  ['truncated object', `{"messages": ${msg.slice(0, 20)}`],
  ['lone brace', '{'],
  ['trailing garbage', `{"messages": ${msg}} x`],
  ['array body', '[]'],
  ['null body', 'null'],
  ['string body', '"hello"'],
  ['messages string', '{"messages": "hi"}'],
  ['messages number items', '{"messages": [1, 2]}'],
  ['role number', '{"messages": [{"role": 1, "content": "hi"}]}'],
  ['unknown role', '{"messages": [{"role": "wizard", "content": "hi"}]}'],
  ['content number', '{"messages": [{"role": "user", "content": 5}]}'],
  ['content part no type', '{"messages": [{"role": "user", "content": [{"text": "hi"}]}]}'],
  ['missing content', '{"messages": [{"role": "user"}]}'],
  ['temperature string', `{"messages": ${msg}, "temperature": "hot"}`],
  ['temperature too high', `{"messages": ${msg}, "temperature": 7}`],
  ['max_tokens string', `{"messages": ${msg}, "max_tokens": "10"}`],
  ['max_tokens fraction', `{"messages": ${msg}, "max_tokens": 1.5}`],
  ['max_tokens zero', `{"messages": ${msg}, "max_tokens": 0}`],
  ['max_tokens huge', `{"messages": ${msg}, "max_tokens": 99999999999999999999999}`],
  ['max_tokens 1e400', `{"messages": ${msg}, "max_tokens": 1e400}`],
  ['temperature 1e308', `{"messages": ${msg}, "temperature": 1e308}`],
  ['top_k negative huge', `{"messages": ${msg}, "top_k": -99999999999999999999}`],
  ['n huge', `{"messages": ${msg}, "n": 1e10}`],
  ['n bool', `{"messages": ${msg}, "n": true}`],
  ['seed string', `{"messages": ${msg}, "seed": "1"}`],
  ['seed fraction', `{"messages": ${msg}, "seed": 0.5}`],
  ['stop number', `{"messages": ${msg}, "stop": 5}`],
  ['stop list of numbers', `{"messages": ${msg}, "stop": [1]}`],
  ['stop empty string', `{"messages": ${msg}, "stop": ""}`],
  ['stop too many', `{"messages": ${msg}, "stop": [${Array.from({ length: 40 }, (_, i) => `"s${i}"`).join(',')}]}`],
  ['logit_bias array', `{"messages": ${msg}, "logit_bias": []}`],
  ['logit_bias bad key', `{"messages": ${msg}, "logit_bias": {"abc": 1}}`],
  ['logit_bias huge key', `{"messages": ${msg}, "logit_bias": {"99999999999999999999": 1}}`],
  ['logit_bias bad value', `{"messages": ${msg}, "logit_bias": {"5": 1000}}`],
  ['stream string', `{"messages": ${msg}, "stream": "yes"}`],
  ['stream_options without stream', `{"messages": ${msg}, "stream_options": {"include_usage": true}}`],
  ['top_logprobs without logprobs', `{"messages": ${msg}, "top_logprobs": 3}`],
  ['logprobs string', `{"messages": ${msg}, "logprobs": "a"}`],
  ['tools object', `{"messages": ${msg}, "tools": {}}`],
  ['tool_choice unknown name', `{"messages": ${msg}, "tools": [{"type":"function","function":{"name":"f"}}], "tool_choice": {"type": "function", "function": {"name": "g"}}}`],
  ['tool_choice without tools', `{"messages": ${msg}, "tool_choice": "required"}`],
  ['tools duplicate names', `{"messages": ${msg}, "tools": [{"type":"function","function":{"name":"f"}}, {"type":"function","function":{"name":"f"}}]}`],
  ['tools bad schema', `{"messages": ${msg}, "tools": [{"type":"function","function":{"name":"f","parameters":{"type":"object","properties":{"a":{"type":"nonsense"}}}}}]}`],
  ['response_format unknown type', `{"messages": ${msg}, "response_format": {"type": "yaml"}}`],
  ['response_format json_schema without schema', `{"messages": ${msg}, "response_format": {"type": "json_schema"}}`],
  ['guided_json number', `{"messages": ${msg}, "guided_json": 5}`],
  ['guided_regex unbalanced', `{"messages": ${msg}, "guided_regex": "(a"}`],
  ['guided_choice empty', `{"messages": ${msg}, "guided_choice": []}`],
  ['structured_outputs number', `{"messages": ${msg}, "structured_outputs": 5}`],
  ['misspelled field', `{"messages": ${msg}, "max_token": 1}`],
  ['unknown message field', '{"messages": [{"role": "user", "content": "hi", "audio": {}}]}'],
  ['unknown model', `{"messages": ${msg}, "model": "gpt-4o"}`],
  ['deep nesting', '{"messages": ' + '['.repeat(50000) + ']'.repeat(50000) + '}'],
  ['over-long prompt', `{"messages": [{"role": "user", "content": "${'lorem ipsum '.repeat(4000)}"}]}`],
];
const cmplCases = [
  ['prompt number', '{"prompt": 5}'],
  ['prompt nested empty', '{"prompt": [[]]}'],
  ['prompt id out of vocab', '{"prompt": [1, 2, 99999999]}'],
  ['prompt negative id', '{"prompt": [-1]}'],
  ['prompt batch of mixed kinds', '{"prompt": ["a", [1]]}'],
  ['missing prompt', '{"max_tokens": 5}'],
  ['logprobs bool', '{"prompt": "hi", "logprobs": true}'],
  ['logprobs too many', '{"prompt": "hi", "logprobs": 50}'],
  ['best_of', '{"prompt": "hi", "best_of": 3}'],
  ['suffix', '{"prompt": "hi", "suffix": "x"}'],
  ['messages on completions', `{"prompt": "hi", "messages": ${msg}}`],
  ['empty prompt', '{"prompt": ""}'],
];

try {
  for (const [name, body] of cases) await expect4xx('chat ' + name, CHAT, body);
  for (const [name, body] of cmplCases) await expect4xx('completions ' + name, CMPL, body);
  // invalid UTF-8 (raw bytes in a string; an overlong slash)
  await expect4xx('invalid UTF-8', CHAT, Buffer.concat([Buffer.from('{"messages": [{"role": "user", "content": "a'), Buffer.from([0xff, 0xfe]), Buffer.from('"}]}')]));
  await expect4xx('overlong UTF-8', CMPL, Buffer.concat([Buffer.from('{"prompt": "a'), Buffer.from([0xc0, 0xaf]), Buffer.from('"}')]));
  // replayed corpus
  const dir = path.join(ROOT, 'tests/fuzz/corpus/http_request');
  let nCorpus = 0;
  for (const f of fs.readdirSync(dir).filter((f) => f.startsWith('bad_')).sort()) {
    const body = fs.readFileSync(path.join(dir, f));
    await expect4xx('corpus ' + f, CHAT, body);
    nCorpus++;
  }
  check(nCorpus >= 10, 'bad_* corpus replayed', nCorpus);
  // oversized bodies: announced (rejected before reading) and actual
  // (chunked, so the server reads and discards past the limit, then answers)
  const piece = Buffer.alloc(1 << 20, 0x20), parts = [Buffer.from(`POST ${CHAT} HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n`)];
  for (let i = 0; i < 9; i++) parts.push(Buffer.from(piece.length.toString(16) + '\r\n'), piece, Buffer.from('\r\n'));
  parts.push(Buffer.from('0\r\n\r\n'));
  const r413 = await raw(Buffer.concat(parts), { timeoutMs: 30000 });
  check(r413.status === 413 && isOpenAIError(r413.body), 'oversized (9 MiB) body is 413 in OpenAI shape', r413.status ?? r413);
  // an announced oversized length is answered before the body is read; the server then closes,
  // and the kernel may reset the connection before the client reads the 413
  const announced = await raw(Buffer.from(`POST ${CHAT} HTTP/1.1\r\nHost: x\r\nContent-Length: 100000000\r\n\r\n{`));
  check((announced.status === 413 && isOpenAIError(announced.body)) || announced.closed, 'announced oversized body is refused at once', announced.status ?? announced);
  // routing errors
  const g = await raw(Buffer.from(`GET ${CHAT} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n`));
  check(g.status === 405 && isOpenAIError(g.body), 'GET on a POST route is 405', g.status);
  const nf = await raw(Buffer.from('GET /v1/nothing HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n'));
  check(nf.status === 404 && isOpenAIError(nf.body), 'unknown /v1 route is 404', nf.status);
  // HTTP-level garbage and oversized headers: MHD answers (4xx) or closes
  const garbage = await raw(Buffer.from('HELLO THERE\r\n\r\n'));
  check(garbage.closed || (garbage.status >= 400 && garbage.status < 500), 'garbage request line', garbage.status ?? garbage);
  const hugeHeader = await raw(Buffer.from(`GET /health HTTP/1.1\r\nHost: x\r\nX-Big: ${'a'.repeat(200000)}\r\n\r\n`));
  check(hugeHeader.closed || (hugeHeader.status >= 400 && hugeHeader.status < 500), 'oversized header bounded', hugeHeader.status ?? hugeHeader);
  // slow headers: 20 connections trickle header bytes (each byte resets the idle timeout, so they
  // are bounded by the connection limit and header memory, not by time); others are served meanwhile
  const slow = [];
  for (let i = 0; i < 20; i++) {
    const s = net.connect(Number(u.port), u.hostname);
    s.on('connect', () => s.write('POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nX-Slow: '));
    s.on('error', () => {});
    const iv = setInterval(() => { if (!s.destroyed) s.write('X'); }, 500);
    slow.push({ s, iv });
  }
  await new Promise((r) => setTimeout(r, 1500));
  const t0 = Date.now();
  const ok = await fetch(srv.url + '/v1/chat/completions', { method: 'POST', headers: { 'Content-Type': 'application/json' },
    body: JSON.stringify({ messages: [{ role: 'user', content: 'hi' }], max_tokens: 4, temperature: 0 }) });
  check(ok.status === 200, 'a normal request is served during the slow-header attack', ok.status);
  check(Date.now() - t0 < 10000, 'and promptly', Date.now() - t0);
  for (const { s, iv } of slow) { clearInterval(iv); s.destroy(); }
  const idle = await raw(Buffer.from('GET /health HTTP/1.1\r\nHost: x\r\n'), { timeoutMs: 8000 });
  check(!idle.timeout, 'a stalled header is timed out by the server', idle);
  const h = await fetch(srv.url + '/health');
  check(h.status === 200, 'server still up');
  // queue full: one running row and one waiting slot, so a third concurrent request gets 429
  const small = await startServer(['--max-batch', '1', '--max-queue', '1']);
  try {
    const ac = new AbortController();
    const req = () => fetch(small.url + '/v1/completions', { method: 'POST', headers: { 'Content-Type': 'application/json' }, signal: ac.signal,
      body: JSON.stringify({ prompt: 'Once upon a time', max_tokens: 1000, ignore_eos: true, temperature: 0 }) }).catch(() => ({ status: 0 }));
    const pending = [req()];
    await new Promise((r) => setTimeout(r, 300));
    pending.push(req(), req(), req());
    const busy = await Promise.race([Promise.any(pending.slice(1).map(async (p) => { const r = await p; if (r.status === 429) return r; throw new Error(); })),
      new Promise((r) => setTimeout(() => r(null), 20000))]).catch(() => null);
    check(busy && busy.status === 429, 'a full queue answers 429', busy && busy.status);
    if (busy) check(isOpenAIError(await busy.text()), '429 in OpenAI shape');
    ac.abort(); // the admitted ones are cancelled by the disconnect
    await Promise.all(pending);
    const hs = await fetch(small.url + '/health');
    check(hs.status === 200, 'still serving after the 429s');
  } finally {
    await small.stop();
  }
} catch (e) {
  check(false, 'unexpected exception', e && e.stack ? e.stack : String(e));
} finally {
  const ex = await srv.stop();
  check(ex.code === 0, 'server exits cleanly', ex);
  check(!/error|sanitizer|runtime error/i.test(srv.log()), 'no error in the server log', srv.log().slice(-1500));
}
process.exit(summary('malformed'));
