// The chat page at / in headless Chromium (Debian's, driven by
// playwright-core): it shows the model, streams a reply that equals the API's
// greedy answer to the same conversation (the thought collapsed above it,
// equal to the API's reasoning_content), stops a long generation (the
// engine sees the cancellation), loads nothing from outside the server,
// leaves a screenshot in the build directory, and takes ?model=ID.
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { createRequire } from 'node:module';
import { startServer, check, summary, ROOT, BUILD } from './lib.mjs';

const require = createRequire(path.join(ROOT, 'tests/oracle/package.json'));
const { chromium } = require('playwright-core');
const CHROMIUM = process.env.TERN_CHROMIUM || '/usr/bin/chromium';
if (!fs.existsSync(CHROMIUM)) {
  console.error(`chat_page: ${CHROMIUM} is missing (scripts/install-deps.sh installs chromium)`);
  process.exit(1);
}

const srv = await startServer();
const profile = fs.mkdtempSync(path.join(os.tmpdir(), 'tern-chromium-'));
let ctx = null;
const stats = async () => (await fetch(srv.url + '/stats')).json();
try {
  ctx = await chromium.launchPersistentContext(profile, {
    executablePath: CHROMIUM, headless: true, viewport: { width: 1000, height: 720 },
    args: ['--headless', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
      '--disable-background-networking', '--disable-component-update', '--disable-sync'],
  });
  const page = ctx.pages()[0] || await ctx.newPage();
  const foreign = [];
  page.on('request', (r) => { if (!r.url().startsWith(srv.url) && !r.url().startsWith('data:')) foreign.push(r.url()); });
  const consoleErrors = [];
  page.on('console', (m) => { if (m.type() === 'error') consoleErrors.push(m.text()); });
  page.on('pageerror', (e) => consoleErrors.push(String(e)));

  await page.goto(srv.url + '/', { waitUntil: 'load' });
  await page.waitForFunction(() => document.getElementById('model-name').textContent === 'tern-demo', null, { timeout: 15000 });
  check(true, 'page shows the model name');

  // settings: greedy, short
  await page.click('#toggle-settings');
  await page.fill('#temperature', '0');
  await page.fill('#max-tokens', '40');
  await page.dispatchEvent('#max-tokens', 'change');

  // 1. send a message, watch it stream
  // record every DOM update of the reply while it streams
  await page.evaluate(() => {
    window.__seen = new Set();
    new MutationObserver(() => {
      const m = document.querySelector('.msg.assistant');
      if (m && m.classList.contains('streaming') && m.textContent.length > 0) window.__seen.add(m.textContent);
    }).observe(document.getElementById('messages'), { subtree: true, childList: true, characterData: true });
  });
  // The page must render each SSE event as it arrives. A fast server can
  // deliver the whole short reply in one or two network reads, and the
  // observer sees one update per task, so the test hands the page the
  // stream one event per task (a timer between events): what is checked is
  // the page's incremental rendering, not how the network coalesced reads.
  await page.evaluate(() => {
    const orig = window.fetch;
    window.fetch = async (...args) => {
      const r = await orig(...args);
      if (!String(args[0]).includes('/v1/chat/completions') || !r.body) return r;
      const reader = r.body.getReader();
      const dec = new TextDecoder(), enc = new TextEncoder();
      let buf = '';
      const body = new ReadableStream({
        async pull(ctl) {
          for (;;) {
            const i = buf.indexOf('\n\n');
            if (i >= 0) {
              const ev = buf.slice(0, i + 2);
              buf = buf.slice(i + 2);
              await new Promise((res) => setTimeout(res, 2));
              ctl.enqueue(enc.encode(ev));
              return;
            }
            const { value, done } = await reader.read();
            if (done) { if (buf) ctl.enqueue(enc.encode(buf)); buf = ''; ctl.close(); return; }
            buf += dec.decode(value, { stream: true });
          }
        },
        cancel(reason) { return reader.cancel(reason); },
      });
      return new Response(body, { status: r.status, statusText: r.statusText, headers: r.headers });
    };
  });
  await page.fill('#input', 'Hello! What is your name?');
  await page.click('#send');
  await page.waitForFunction(() => { const m = document.querySelector('.msg.assistant'); return m && m.dataset.done; }, null, { timeout: 60000 });
  const seen = await page.evaluate(() => {
    const m = document.querySelector('.msg.assistant');
    const t = m.querySelector('details.thought');
    return { streamingWithText: window.__seen.size, text: m.querySelector('.answer').textContent, done: m.dataset.done,
      thought: t && !t.hidden ? t.querySelector('.thought-text').textContent : null, thoughtOpen: t ? t.open : null,
      thoughtVisible: t ? t.querySelector('.thought-text').checkVisibility() : null };
  });
  check(seen.done === 'finished', 'reply finished', seen);
  check(seen.streamingWithText >= 3, 'text grew piece by piece while streaming', seen);
  const api = await (await fetch(srv.url + '/v1/chat/completions', { method: 'POST', headers: { 'Content-Type': 'application/json' },
    body: JSON.stringify({ messages: [{ role: 'user', content: 'Hello! What is your name?' }], temperature: 0, max_tokens: 40 }) })).json();
  check(seen.text === api.choices[0].message.content, 'page reply == API greedy reply', { page: seen.text, api: api.choices[0].message.content });
  check(!seen.text.includes('<think>') && !seen.text.includes('</think>'), 'no raw think tags in the reply', seen.text);
  const apiThought = api.choices[0].message.reasoning_content ?? null;
  check(seen.thought === apiThought, 'page thought == API reasoning_content', { page: seen.thought, api: apiThought });
  if (apiThought) check(seen.thoughtOpen === false && seen.thoughtVisible === false, 'the thought is collapsed', seen);

  // 2. a long generation, stopped
  const before = await stats();
  await page.fill('#max-tokens', '1500');
  await page.dispatchEvent('#max-tokens', 'change');
  await page.fill('#temperature', '1');
  await page.dispatchEvent('#temperature', 'change');
  // the toy model may end its story early: keep it going until stopped
  await page.route('**/v1/chat/completions', (route) => {
    const body = JSON.parse(route.request().postData());
    route.continue({ postData: JSON.stringify({ ...body, ignore_eos: true }) });
  });
  await page.fill('#input', 'Write a very long story about a lighthouse keeper.');
  await page.click('#send');
  await page.waitForFunction(() => { const m = document.querySelectorAll('.msg.assistant'); const last = m[m.length - 1]; return m.length === 2 && last.textContent.length > 20; }, null, { timeout: 30000 });
  check(await page.isEnabled('#stop'), 'stop button enabled while generating');
  await page.click('#stop');
  await page.waitForFunction(() => { const m = document.querySelectorAll('.msg.assistant'); return m[1] && m[1].dataset.done; }, null, { timeout: 10000 });
  const done2 = await page.evaluate(() => document.querySelectorAll('.msg.assistant')[1].dataset.done);
  check(done2 === 'stopped', 'generation stopped from the page', done2);
  let after = null;
  for (let i = 0; i < 50; i++) {
    after = await stats();
    if (after.server.generations_active === 0 && after.engine.requests_cancelled > before.engine.requests_cancelled) break;
    await new Promise((r) => setTimeout(r, 100));
  }
  check(after.server.generations_active === 0, 'stopped generation released', after.server);
  check(after.engine.requests_cancelled > before.engine.requests_cancelled, 'stop cancels the engine request', [before.engine.requests_cancelled, after.engine.requests_cancelled]);
  check(await page.isEnabled('#send') && !(await page.isEnabled('#stop')), 'buttons reset after stop');

  const shot = path.join(BUILD, 'server_chat_page.png');
  await page.screenshot({ path: shot, fullPage: true });
  check(fs.statSync(shot).size > 1000, 'screenshot saved', shot);
  console.log(`screenshot: ${shot}`);

  // 3. a server with several models (a pool): the page offers a picker and
  //    chats with the picked model
  const pool = await startServer(['--model', `first=${path.join(ROOT, 'models', 'tern-demo')}`,
    '--model', `second=${path.join(ROOT, 'models', 'tern-demo')}`], { model: null });
  try {
    const p2 = await ctx.newPage();
    p2.on('pageerror', (e) => consoleErrors.push(String(e)));
    await p2.goto(pool.url + '/', { waitUntil: 'load' });
    await p2.waitForFunction(() => !document.getElementById('model-pick').hidden, null, { timeout: 15000 });
    const opts = await p2.evaluate(() => [...document.getElementById('model-pick').options].map((o) => o.value));
    check(opts.join(',') === 'first,second', 'pool: the picker lists the models', opts);
    await p2.selectOption('#model-pick', 'second');
    await p2.fill('#input', 'Hi');
    await p2.click('#send');
    await p2.waitForFunction(() => { const m = document.querySelector('.msg.assistant'); return m && m.dataset.done; }, null, { timeout: 60000 });
    const ps = (await (await fetch(pool.url + '/stats')).json()).models;
    check(ps.second.generations_started === 1 && ps.first.generations_started === 0, 'pool: the page chats with the picked model',
      [ps.first.generations_started, ps.second.generations_started]);
    await p2.close();
  } finally {
    const ex = await pool.stop();
    check(ex.code === 0, 'pool server exits cleanly', ex);
  }
  check(foreign.length === 0, 'no request leaves the server', foreign);
  check(consoleErrors.length === 0, 'no console errors', consoleErrors);

  // ?model=ID (the desktop app's picker) picks the model; an unknown one says so
  await page.goto(srv.url + '/?model=tern-demo', { waitUntil: 'load' });
  await page.waitForFunction(() => document.getElementById('model-name').textContent === 'tern-demo', null, { timeout: 15000 });
  check(true, '?model=tern-demo shows it');
  await page.goto(srv.url + '/?model=no-such-model', { waitUntil: 'load' });
  await page.waitForFunction(() => document.getElementById('model-name').textContent.includes('unavailable'), null, { timeout: 15000 });
  check((await page.textContent('#model-name')).includes("no model 'no-such-model'"), '?model=unknown is named',
    await page.textContent('#model-name'));
} catch (e) {
  check(false, 'unexpected exception', e && e.stack ? e.stack : String(e));
} finally {
  if (ctx) await ctx.close().catch(() => {});
  fs.rmSync(profile, { recursive: true, force: true });
  const ex = await srv.stop();
  check(ex.code === 0, 'server exits cleanly', ex);
  check(!/error|sanitizer/i.test(srv.log()), 'no error in the server log', srv.log().slice(-1500));
}
process.exit(summary('chat_page'));
