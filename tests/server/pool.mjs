// The model pool through HTTP (`tern serve --models DIR`): three models - the
// demo, stories260K and a random llama fixture - plus a second copy of the
// demo and two folders that are no models, under a --max-memory that holds
// the demo and one small model. Checks: every reply equals the same greedy
// request to that model served alone (`tern serve DIR`), round-robin in
// order and all at once; LRU eviction and pinning as /v1/models shows them;
// broken folders listed as failed with their reason while the rest serves;
// 404 model_not_found, 503 model_cannot_fit with the sizes, 503
// model_load_failed; POST /v1/models/load and /unload behind the API key
// (409 for a pinned or busy model); per-model counters in /stats and
// /metrics.
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { spawnSync } from 'node:child_process';
import { startServer, check, summary, MODEL, ROOT, BUILD } from './lib.mjs';

const SHARED = process.env.TERN_SHARED || path.resolve(ROOT, '../shared');
const KEY = 'sk-pool-' + Math.random().toString(36).slice(2);
const COMMON = ['--kv-budget', '0.02', '--max-batch', '8', '--threads', '1'];
const PROMPTS = ['Once upon a time', 'The little dog'];
const tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'tern-pool-'));
const dir = path.join(tmp, 'models');
fs.mkdirSync(dir);

// ---- the folder: three models, a duplicate of the big one, two bad folders
const fixture = path.join(tmp, 'fixture');
const mk = spawnSync(path.join(BUILD, 'tools', 'make_fixture'),
  ['--family', 'llama', '--preset', 'tiny', '--seed', '11', '--tokenizer', MODEL, '--out', fixture], { encoding: 'utf8' });
if (mk.status !== 0) throw new Error('make_fixture failed: ' + mk.stderr);
const MODELS = { demo: MODEL, stories: path.join(SHARED, 'models', 'stories260K'), fix: fixture };
for (const [name, d] of Object.entries(MODELS)) fs.symlinkSync(d, path.join(dir, name));
fs.symlinkSync(MODEL, path.join(dir, 'demo2'));
fs.mkdirSync(path.join(dir, 'broken'));
fs.writeFileSync(path.join(dir, 'broken', 'config.json'), '{"architectures": ["LlamaForCausalLM"],');
fs.mkdirSync(path.join(dir, 'empty'));
fs.writeFileSync(path.join(dir, 'README.txt'), 'not a folder: not listed\n');

function client(url, key) {
  const headers = { 'Content-Type': 'application/json', ...(key ? { Authorization: `Bearer ${key}` } : {}) };
  const req = async (method, route, body) => {
    const r = await fetch(url + route, { method, headers, body: body === undefined ? undefined : JSON.stringify(body) });
    const text = await r.text();
    let json = null;
    try { json = JSON.parse(text); } catch { /* not JSON */ }
    return { status: r.status, json, text };
  };
  return {
    get: (route) => req('GET', route),
    post: (route, body) => req('POST', route, body),
    complete: (model, prompt) => req('POST', '/v1/completions', { model, prompt, max_tokens: 12, temperature: 0 }),
    async states() {
      const r = await req('GET', '/v1/models');
      return Object.fromEntries(r.json.data.map((m) => [m.id, m]));
    },
  };
}

const loadedSet = (st) => Object.keys(st).filter((k) => st[k].state === 'loaded').sort().join(',');

const servers = [];
try {
  // ---- references: each model served alone
  const ref = {};
  for (const [name, d] of Object.entries(MODELS)) {
    const srv = await startServer(COMMON, { model: d });
    servers.push(srv);
    const c = client(srv.url);
    ref[name] = [];
    for (const p of PROMPTS) {
      const r = await c.complete(path.basename(d), p);
      check(r.status === 200, `reference ${name}: 200`, r.text);
      ref[name].push(r.json.choices[0].text);
    }
    await srv.stop();
    servers.pop();
  }
  check(new Set(Object.values(ref).map((v) => v[0])).size === 3, 'the three models answer differently', ref);

  // ---- sizes (nothing is loaded yet), then the limit: the demo and one small model
  let srv = await startServer(['--models', dir, ...COMMON], { model: null });
  servers.push(srv);
  let st = await client(srv.url).states();
  check(Object.keys(st).sort().join(',') === 'broken,demo,demo2,empty,fix,stories', 'every folder listed, files not', Object.keys(st));
  const need = (n) => st[n].memory.weights_bytes + st[n].memory.kv_bytes;
  const small = Math.min(need('fix'), need('stories')), big = Math.max(need('fix'), need('stories'));
  const limit = need('demo') + big + small / 2; // two fit, three do not
  await srv.stop();
  servers.pop();
  const gb = (limit / 1073741824).toFixed(9);

  srv = await startServer(['--models', dir, '--max-memory', gb, '--api-key', KEY, ...COMMON], { model: null });
  servers.push(srv);
  const c = client(srv.url, KEY);
  st = await c.states();
  check(st.broken.state === 'failed' && /config/.test(st.broken.reason || ''), 'bad config.json: failed, reason names it', st.broken);
  check(st.empty.state === 'failed' && /config\.json|safetensors/.test(st.empty.reason || ''), 'empty folder: failed with a reason', st.empty);
  check(['demo', 'fix', 'stories'].every((n) => st[n].state === 'unloaded' && st[n].pinned === false), 'models start unloaded');

  // ---- round-robin in order: the two most recently used stay loaded
  const sent = { demo: 0, fix: 0, stories: 0 };
  const order = ['demo', 'fix', 'stories'];
  const recent = [];
  for (let round = 0; round < 3; round++)
    for (const name of order) {
      const p = (round + order.indexOf(name)) % PROMPTS.length;
      const r = await c.complete(name, PROMPTS[p]);
      sent[name]++;
      check(r.status === 200 && r.json.choices[0].text === ref[name][p], `round ${round} ${name}: same text as alone`, r.text);
      check(r.json && r.json.model === name, `round ${round} ${name}: reply names the model`, r.json && r.json.model);
      if (recent.includes(name)) recent.splice(recent.indexOf(name), 1);
      recent.push(name);
      const want = recent.slice(-2).sort().join(',');
      st = await c.states();
      check(loadedSet(st) === want, `round ${round} after ${name}: loaded = the two most recent (LRU evicted)`, loadedSet(st));
    }

  // ---- all at once: a model that fits only once another goes idle waits for it
  const all = [];
  for (let k = 0; k < 3; k++)
    for (const name of order) all.push(c.complete(name, PROMPTS[k % 2]).then((r) => ({ name, k, r })));
  for (const { name, k, r } of await Promise.all(all)) {
    sent[name]++;
    check(r.status === 200 && r.json.choices[0].text === ref[name][k % 2], `concurrent ${name} #${k}: same text as alone`, r.text);
  }

  // ---- errors
  let r = await c.complete('nope', 'x');
  check(r.status === 404 && r.json.error.code === 'model_not_found' && r.json.error.param === 'model', 'unknown model: 404 model_not_found', r.text);
  r = await c.complete('broken', 'x');
  check(r.status === 503 && r.json.error.code === 'model_load_failed' && /config/.test(r.json.error.message), 'failed model: 503 with the reason', r.text);
  r = await c.complete('fix', PROMPTS[0]);
  sent.fix++;
  check(r.status === 200 && r.json.choices[0].text === ref.fix[0], 'still serving after the bad folders');
  r = await c.post('/v1/completions', { prompt: 'x', max_tokens: 1 });
  check(r.status === 400 && r.json.error.param === 'model', 'no model with several served: 400 naming model', r.text);

  // ---- admin: load / unload behind the key
  r = await client(srv.url).post('/v1/models/load', { model: 'stories' });
  check(r.status === 401, 'load without the key: 401', r.status);
  r = await c.post('/v1/models/unload', { model: 'fix' });
  check(r.status === 200 && r.json.state === 'unloaded', 'unload: 200, unloaded', r.text);
  r = await c.post('/v1/models/load', { model: 'stories' });
  check(r.status === 200 && r.json.state === 'loaded', 'load: 200, loaded', r.text);
  r = await c.post('/v1/models/load', { model: 'nope' });
  check(r.status === 404, 'load unknown: 404', r.status);
  r = await c.post('/v1/models/load', { model: 'broken' });
  check(r.status === 503 && r.json.error.code === 'model_load_failed', 'load broken: 503 model_load_failed', r.text);
  r = await c.post('/v1/models/load', { model: 'stories', extra: 1 });
  check(r.status === 400 && r.json.error.param === 'extra', 'load with an unknown field: 400 naming it', r.text);
  // a model with a stream running is busy
  const ac = new AbortController();
  const stream = await fetch(srv.url + '/v1/completions', {
    method: 'POST', signal: ac.signal, headers: { 'Content-Type': 'application/json', Authorization: `Bearer ${KEY}` },
    body: JSON.stringify({ model: 'stories', prompt: 'Once', max_tokens: 400, stream: true, ignore_eos: true }),
  });
  const rd = stream.body.getReader();
  await rd.read();
  r = await c.post('/v1/models/unload', { model: 'stories' });
  check(r.status === 409 && r.json.error.code === 'model_busy', 'unload a model with a stream: 409 model_busy', r.text);
  st = await c.states();
  check(st.stories.active_requests === 1, '/v1/models shows the active request', st.stories);
  ac.abort();
  for (let i = 0; i < 50 && (await c.states()).stories.active_requests; i++) await new Promise((res) => setTimeout(res, 100));
  r = await c.post('/v1/models/unload', { model: 'stories' });
  check(r.status === 200 && r.json.state === 'unloaded', 'unload once the stream is gone: 200', r.text);
  sent.stories++;

  // ---- per-model counters
  const stats = (await c.get('/stats')).json;
  for (const name of order)
    check(stats.models[name].generations_started === sent[name] && stats.models[name].generations_finished >= sent[name] - 1,
      `/stats models.${name}: generations counted per model`, [stats.models[name], sent[name]]);
  check(stats.models.demo.evictions >= 2 && stats.models.demo.loads >= 3, '/stats: demo evicted and reloaded', stats.models.demo);
  check(stats.models.fix.unloads === 1, '/stats: the unload counted', stats.models.fix.unloads);
  check(stats.models.broken.state === 'failed', '/stats: failed state', stats.models.broken);
  check(stats.engine.tokens_decoded === order.reduce((a, n) => a + stats.models[n].tokens_decoded, 0),
    '/stats engine: the models summed (unloaded engines included)', stats.engine.tokens_decoded);
  const prom = (await c.get('/metrics')).text;
  const sampleOf = (re) => { const m = prom.match(re); return m ? Number(m[1]) : NaN; };
  check(sampleOf(/^tern_model_generations_started_total\{model="demo"\} (\S+)$/m) === sent.demo, '/metrics: started{model="demo"}', sent.demo);
  check(sampleOf(/^tern_model_tokens_decoded_total\{model="fix"\} (\S+)$/m) === stats.models.fix.tokens_decoded, '/metrics: tokens_decoded{model="fix"}');
  check(sampleOf(/^tern_model_state\{model="broken",state="failed"\} (\S+)$/m) === 1, '/metrics: state{model="broken",state="failed"} 1');
  check(sampleOf(/^tern_model_evictions_total\{model="demo"\} (\S+)$/m) === stats.models.demo.evictions, '/metrics: evictions{model="demo"}');
  check(sampleOf(/^tern_max_memory_bytes (\S+)$/m) > 0, '/metrics: the limit');
  const ex = await srv.stop();
  servers.pop();
  check(ex.code === 0, 'pool server exits 0', ex);
  check(!/Sanitizer|runtime error/.test(srv.log()), 'no sanitizer report in the pool server log', srv.log().slice(-1500));

  // ---- pinning: the pinned demo stays; a second demo can never fit beside it
  srv = await startServer(['--models', dir, '--max-memory', gb, '--pin', 'demo', ...COMMON], { model: null });
  servers.push(srv);
  const p = client(srv.url);
  st = await p.states();
  check(st.demo.state === 'loaded' && st.demo.pinned === true, 'pinned: loaded at start', st.demo);
  for (const name of ['fix', 'stories', 'fix', 'stories']) {
    r = await p.complete(name, PROMPTS[0]);
    check(r.status === 200 && r.json.choices[0].text === ref[name][0], `pinned server: ${name} answers`, r.text);
    st = await p.states();
    check(loadedSet(st) === ['demo', name].sort().join(','), `pinned server after ${name}: demo stays, the other evicted`, loadedSet(st));
  }
  r = await p.complete('demo2', PROMPTS[0]);
  check(r.status === 503 && r.json.error.code === 'model_cannot_fit' && /needs .*weights .*KV .*max-memory .*demo \(pinned\)/.test(r.json.error.message),
    'a model that cannot fit: 503 with the sizes and who holds the memory', r.text);
  r = await p.post('/v1/models/unload', { model: 'demo' });
  check(r.status === 409 && r.json.error.code === 'model_pinned', 'unload pinned: 409', r.text);
  const ex2 = await srv.stop();
  servers.pop();
  check(ex2.code === 0, 'pinned server exits 0', ex2);
  check(!/Sanitizer|runtime error/.test(srv.log()), 'no sanitizer report in the pinned server log', srv.log().slice(-1500));
} catch (e) {
  check(false, 'exception', e.stack || String(e));
  for (const s of servers) console.error(s.log());
} finally {
  for (const s of servers) await s.stop();
  fs.rmSync(tmp, { recursive: true, force: true });
}
process.exit(summary('pool'));
