// POST /v1/embeddings against sentence-transformers, through the official
// `openai` npm client. The embedding folders are built here from the recipes
// in tests/embedding/ (a base model tern has + modules.json, the Pooling
// config, ...; no weights are stored), and each is compared with its golden
// tests/golden/embed_<recipe>.json (tools/st_goldens.py says how they were
// made): cosine >= 0.9999 and the same norm, for every pooling mode (last
// token, mean, CLS), text and token-id inputs, float and base64, with
// `dimensions` (truncated, then renormalised). Also: bad input -> OpenAI-
// shaped 400s naming the field, a chat model -> 400, an unsupported pooling
// -> a load error naming it, batched == alone (bit for bit), and a long
// embedding request does not hold up a generation.
import fs from 'node:fs';
import path from 'node:path';
import { createRequire } from 'node:module';
import { startServer, check, summary, ROOT, BUILD } from './lib.mjs';

const require = createRequire(path.join(ROOT, 'tests/oracle/package.json'));
const OpenAI = require('openai').default ?? require('openai');

const RECIPES = path.join(ROOT, 'tests', 'embedding');
const SHARED = process.env.TERN_SHARED || path.join(ROOT, '..', 'shared');
const FOLDERS = path.join(BUILD, 'embedding-folders');
const COS_MIN = 0.9999;

// The folder of a recipe: symlinks to the base model's files + the recipe's
// own files; every module path exists (tools/st_goldens.py does the same).
function buildFolder(name, patch) {
  const rdir = path.join(RECIPES, name);
  const recipe = JSON.parse(fs.readFileSync(path.join(rdir, 'recipe.json'), 'utf8'));
  const src = recipe.base.startsWith('../shared/') ? path.join(SHARED, recipe.base.slice('../shared/'.length))
    : path.join(ROOT, recipe.base);
  const out = path.join(FOLDERS, patch ? name + '-' + patch.name : name);
  fs.rmSync(out, { recursive: true, force: true });
  fs.mkdirSync(out, { recursive: true });
  const own = fs.readdirSync(rdir, { recursive: true }).filter((f) => fs.statSync(path.join(rdir, f)).isFile() && f !== 'recipe.json');
  for (const f of fs.readdirSync(src))
    if (fs.statSync(path.join(src, f)).isFile() && !own.includes(f)) fs.symlinkSync(path.join(src, f), path.join(out, f));
  for (const f of own) {
    fs.mkdirSync(path.dirname(path.join(out, f)), { recursive: true });
    fs.copyFileSync(path.join(rdir, f), path.join(out, f));
  }
  for (const m of JSON.parse(fs.readFileSync(path.join(out, 'modules.json'), 'utf8')))
    if (m.path) fs.mkdirSync(path.join(out, m.path), { recursive: true });
  if (patch) patch.apply(out);
  return out;
}

const dot = (a, b) => a.reduce((s, x, i) => s + x * b[i], 0);
const norm = (a) => Math.sqrt(dot(a, a));
const cosine = (a, b) => dot(a, b) / (norm(a) * norm(b));
function decodeB64(s) {
  const b = Buffer.from(s, 'base64');
  const dv = new DataView(b.buffer, b.byteOffset, b.byteLength);
  return Array.from({ length: b.byteLength / 4 }, (_, i) => dv.getFloat32(4 * i, true));
}

// Every returned vector vs its reference: cosine and norm.
function compare(what, got, want) {
  check(got.length === want.length, `${what}: ${want.length} embeddings`, got.length);
  let worst = 1, worstNorm = 0;
  for (let i = 0; i < want.length; i++) {
    const g = got[i], w = want[i];
    if (!check(Array.isArray(g) && g.length === w.length, `${what}[${i}]: length ${w.length}`, g && g.length)) return;
    worst = Math.min(worst, cosine(g, w));
    worstNorm = Math.max(worstNorm, Math.abs(norm(g) / norm(w) - 1));
  }
  check(worst >= COS_MIN, `${what}: cosine >= ${COS_MIN}`, worst);
  check(worstNorm < 1e-3, `${what}: norms agree`, worstNorm);
  return worst;
}

async function expectError(p, status, what, param) {
  try {
    await p;
    check(false, `${what}: expected HTTP ${status}`, 'got success');
  } catch (e) {
    check(e instanceof OpenAI.APIError, `${what}: APIError`, String(e));
    check(e.status === status, `${what}: status ${status}`, e.status);
    check(e.error && typeof e.error.message === 'string' && 'type' in e.error && 'param' in e.error && 'code' in e.error,
      `${what}: OpenAI error shape`, e.error);
    if (param) check(e.error && e.error.param === param, `${what}: param ${param}`, e.error);
  }
}

async function withServer(folder, args, fn) {
  const srv = await startServer(args, { model: folder });
  try {
    const client = new OpenAI({ baseURL: srv.url + '/v1', apiKey: 'none', maxRetries: 0, timeout: 120000 });
    await fn(client, srv);
  } catch (e) {
    check(false, `${path.basename(folder)}: unexpected exception`, e && e.stack ? e.stack : String(e));
  } finally {
    const ex = await srv.stop();
    check(ex.code === 0, `${path.basename(folder)}: server exits cleanly`, ex);
    check(!/sanitizer|runtime error/i.test(srv.log()), `${path.basename(folder)}: clean log`, srv.log().slice(-1500));
  }
}

const recipes = fs.readdirSync(RECIPES).sort();
const seen = new Set();
const raw = async (srv, body) => fetch(srv.url + '/v1/embeddings', { method: 'POST', body: JSON.stringify(body) });

for (const name of recipes) {
  const gpath = path.join(ROOT, 'tests', 'golden', `embed_${name}.json`);
  if (!check(fs.existsSync(gpath), `${name}: golden ${path.relative(ROOT, gpath)} exists`)) continue;
  const g = JSON.parse(fs.readFileSync(gpath, 'utf8'));
  seen.add(g.pooling);
  const folder = buildFolder(name);
  const texts = g.inputs.map((x) => x.text), ids = g.inputs.map((x) => x.ids);
  const want = g.inputs.map((x) => x.embedding);
  // a small prefill budget: inputs are pooled across several chunks of the step loop
  const args = name.includes('mean') ? ['--prefill-chunk', '5'] : [];
  await withServer(folder, args, async (client, srv) => {
    const M = path.basename(folder);
    const f = await client.embeddings.create({ model: M, input: texts, encoding_format: 'float' });
    check(f.object === 'list' && f.model === M && f.data.every((d, i) => d.object === 'embedding' && d.index === i),
      `${name}: response shape`, { ...f, data: f.data.length });
    const cos = compare(`${name} (${g.pooling}) text, float`, f.data.map((d) => d.embedding), want);
    const nTok = ids.reduce((s, x) => s + x.length, 0);
    check(f.usage.prompt_tokens === nTok && f.usage.total_tokens === nTok, `${name}: usage counts the golden's tokens`,
      { usage: f.usage, golden: nTok });
    console.log(`${name}: ${g.pooling}${g.normalize ? ' + Normalize' : ''}${g.prompt ? ', prompt ' + JSON.stringify(g.prompt) : ''}: worst cosine ${cos}`);
    // the client's default: base64 on the wire, decoded by the client
    const d = await client.embeddings.create({ model: M, input: texts });
    compare(`${name} text, client default (base64)`, d.data.map((x) => Array.from(x.embedding)), want);
    const b = await client.embeddings.create({ model: M, input: texts, encoding_format: 'base64' });
    check(typeof b.data[0].embedding === 'string', `${name}: base64 is a string`);
    const bv = b.data.map((x) => decodeB64(x.embedding));
    compare(`${name} text, base64`, bv, want);
    check(bv.every((v, i) => v.every((x, k) => Math.fround(f.data[i].embedding[k]) === x)), `${name}: base64 == float bit for bit`);
    // token ids: the golden's own ids (prompt and special tokens included)
    const t = await client.embeddings.create({ model: M, input: ids, encoding_format: 'float' });
    compare(`${name} token ids`, t.data.map((x) => x.embedding), want);
    const one = await client.embeddings.create({ model: M, input: ids[1], encoding_format: 'float' });
    compare(`${name} one token list`, [one.data[0].embedding], [want[1]]);
    const s = await client.embeddings.create({ model: M, input: texts[3], encoding_format: 'float' });
    compare(`${name} one string`, [s.data[0].embedding], [want[3]]);
    check(s.data[0].embedding.every((x, k) => x === f.data[3].embedding[k]), `${name}: alone == in a batch, bit for bit`);
    // Matryoshka: truncated and renormalised
    for (const dim of g.dims) {
      const wt = g.inputs.map((x) => x.truncated[String(dim)]);
      for (const enc of ['float', 'base64']) {
        const r = await client.embeddings.create({ model: M, input: texts, dimensions: dim, encoding_format: enc });
        const v = r.data.map((x) => (enc === 'base64' ? decodeB64(x.embedding) : x.embedding));
        compare(`${name} dimensions ${dim} ${enc}`, v, wt);
        check(v.every((x) => Math.abs(norm(x) - 1) < 1e-5), `${name} dimensions ${dim} ${enc}: unit norm`);
      }
    }
    // bad input: OpenAI-shaped 400s naming the field
    await expectError(client.embeddings.create({ model: M, input: '' }), 400, `${name}: empty string`, 'input');
    await expectError(client.embeddings.create({ model: M, input: [] }), 400, `${name}: empty list`, 'input');
    await expectError(client.embeddings.create({ model: M, input: ['a', ''] }), 400, `${name}: empty string in a list`, 'input');
    await expectError(client.embeddings.create({ model: M, input: [[1, 2], []] }), 400, `${name}: empty token list`, 'input');
    await expectError(client.embeddings.create({ model: M, input: [1, 1e9] }), 400, `${name}: id outside the vocabulary`, 'input');
    await expectError(client.embeddings.create({ model: M, input: ['a', [1]] }), 400, `${name}: mixed list`, 'input');
    await expectError(client.embeddings.create({ model: M, input: 'a', dimensions: 0 }), 400, `${name}: dimensions 0`, 'dimensions');
    await expectError(client.embeddings.create({ model: M, input: 'a', dimensions: g.dim + 1 }), 400, `${name}: dimensions > size`, 'dimensions');
    await expectError(client.embeddings.create({ model: M, input: 'a', dimensions: 2.5 }), 400, `${name}: dimensions 2.5`, 'dimensions');
    await expectError(client.embeddings.create({ model: M, input: 'a', encoding_format: 'hex' }), 400, `${name}: encoding_format`, 'encoding_format');
    await expectError(client.embeddings.create({ model: 'nope', input: 'a' }), 404, `${name}: other model`, 'model');
    await expectError(client.embeddings.create({ model: M, input: 'a', frobnicate: 1 }), 400, `${name}: unknown field`, 'frobnicate');
    const long = Array.from({ length: 5000 }, (_, i) => 3 + (i % 200));
    await expectError(client.embeddings.create({ model: M, input: [long] }), 400, `${name}: over the context`, 'input');
    const u = await client.embeddings.create({ model: M, input: 'a b', user: 'someone', encoding_format: 'float' });
    check(u.data.length === 1, `${name}: user is accepted as a hint`);
    const nul = await raw(srv, { model: M, input: 'x', dimensions: null, encoding_format: null });
    check(nul.status === 200, `${name}: null fields count as absent`, nul.status);
  });
}
for (const p of ['pooling_mode_lasttoken', 'pooling_mode_mean_tokens', 'pooling_mode_cls_token'])
  check(seen.has(p), `a golden covers ${p}`);

// A chat model has no pooling: a clear 400, naming why.
{
  const srv = await startServer([]);
  try {
    const r = await raw(srv, { model: 'tern-demo', input: 'hello' });
    const j = await r.json();
    check(r.status === 400 && j.error && j.error.param === 'model' && /not an embedding model/.test(j.error.message) &&
      /modules\.json/.test(j.error.message), 'chat model: 400 naming why', j);
  } finally {
    await srv.stop();
  }
}

// Poolings tern does not implement are load errors naming the mode.
for (const [mode, extra] of [['pooling_mode_max_tokens', {}], ['pooling_mode_weightedmean_tokens', {}]]) {
  const folder = buildFolder('demo-last', {
    name: mode,
    apply(out) {
      const p = path.join(out, '1_Pooling', 'config.json');
      const c = JSON.parse(fs.readFileSync(p, 'utf8'));
      c.pooling_mode_lasttoken = false;
      c[mode] = true;
      Object.assign(c, extra);
      fs.writeFileSync(p, JSON.stringify(c));
    },
  });
  try {
    const srv = await startServer([], { model: folder });
    await srv.stop();
    check(false, `${mode}: the server must refuse to start`);
  } catch (e) {
    check(new RegExp(mode).test(String(e.message)), `${mode}: load error names the mode`, String(e.message).slice(-400));
  }
}

// An embedding request of many long inputs does not hold up a generation:
// its prompts go through the same prefill budget as everyone's, one chunk a
// step, so a short completion submitted meanwhile finishes first.
{
  const folder = buildFolder('demo-last');
  const srv = await startServer(['--prefill-chunk', '64'], { model: folder });
  try {
    const inputs = Array.from({ length: 4 }, (_, k) => Array.from({ length: 400 }, (_, i) => 5 + ((i * 7 + k) % 4000)));
    let embDone = 0, genDone = 0;
    const emb = raw(srv, { input: inputs, encoding_format: 'base64' }).then(async (r) => { await r.json(); embDone = performance.now(); return r.status; });
    await new Promise((r) => setTimeout(r, 150));
    const t0 = performance.now();
    const gen = await fetch(srv.url + '/v1/completions', { method: 'POST', body: JSON.stringify({ prompt: 'Hello', max_tokens: 4, temperature: 0 }) });
    await gen.json();
    genDone = performance.now();
    const st = await emb;
    check(st === 200, 'long embedding request: 200', st);
    check(genDone < embDone, 'a completion sent during a long embedding request finishes first',
      { completion_ms: genDone - t0, embedding_ms: embDone - t0 });
    console.log(`interleaving: completion ${Math.round(genDone - t0)} ms, embeddings (4 x 400 tokens, prefill chunk 64) ${Math.round(embDone - t0)} ms after it was sent`);
    // no KV is kept after an embedding: a completion of the same tokens reuses nothing
    const same = inputs[0].slice(0, 300);
    await raw(srv, { input: [same] });
    const c = await (await fetch(srv.url + '/v1/completions', { method: 'POST', body: JSON.stringify({ prompt: same, max_tokens: 1 }) })).json();
    check(c.usage && c.usage.prompt_tokens_details && c.usage.prompt_tokens_details.cached_tokens === 0,
      'an embedded prompt leaves nothing in the prefix cache', c.usage);
    // a client that goes away mid-request: its inputs are cancelled, the server goes on
    const ac = new AbortController();
    const ab = fetch(srv.url + '/v1/embeddings', { method: 'POST', body: JSON.stringify({ input: inputs }), signal: ac.signal }).catch(() => 'aborted');
    await new Promise((r) => setTimeout(r, 300));
    ac.abort();
    check((await ab) === 'aborted', 'the client aborted');
    let stats;
    for (let k = 0; k < 100; k++) {
      stats = await (await fetch(srv.url + '/stats')).json();
      if (stats.engine.running === 0 && stats.engine.queue_len === 0) break;
      await new Promise((r) => setTimeout(r, 100));
    }
    check(stats.engine.running === 0 && stats.engine.queue_len === 0 && stats.engine.requests_cancelled >= 1,
      'an abandoned embedding request is cancelled', stats.engine);
    const after = await raw(srv, { input: 'still here' });
    check(after.status === 200, 'embeddings work after a client left', after.status);
    // SIGTERM while an embedding request runs: a clean exit, the client gets an answer or a closed socket
    const pending = raw(srv, { input: inputs }).then((r) => r.status, () => 'closed');
    await new Promise((r) => setTimeout(r, 300));
    const ex = await srv.stop();
    check(ex.code === 0, 'SIGTERM during an embedding request: exit code 0', ex);
    const res = await pending;
    check(res === 'closed' || res === 503, 'the pending embedding request is answered 503 or closed', res);
    check(!/sanitizer|runtime error|LeakSanitizer/i.test(srv.log()), 'clean log after SIGTERM', srv.log().slice(-1500));
  } finally {
    await srv.stop();
  }
}

process.exit(summary('embeddings'));
