// The prefix cache's disk tier (--kv-disk) through the server:
//  1. restart: a 3,700-token prompt, SIGTERM (the cache is flushed to disk),
//     a new server on the same directory, the same prompt -> at least 3,500
//     cached tokens read from disk, the same greedy text, a time to first
//     token at most 1/5 of the cold one;
//  2. kill -9 in the middle of heavy eviction (a pool of 40 blocks, prompts
//     of 25), then a byte flipped in one block file, another truncated and a
//     partial write (.tmp) left behind -> a new server answers every prompt
//     with the cold run's text, counts exactly the 2 corrupt files and the
//     torn one, serves the rest from disk;
//  3. a directory that cannot be written, at start and mid-run -> one
//     warning, serving continues with the same outputs.
// The demo model's context is 2,048 positions: the test serves a copy of its
// folder (links to the weights) with max_position_embeddings 8192. Run as
// root, the servers run as uid 65534 so that directory permissions bind.
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { startServer, check, summary, MODEL } from './lib.mjs';

const AS_ROOT = process.getuid && process.getuid() === 0;
const NOBODY = 65534;
const spawnOpts = AS_ROOT ? { uid: NOBODY, gid: NOBODY } : {};
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

const tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'tern-kvdisk-'));
fs.chmodSync(tmp, 0o755);
if (AS_ROOT) fs.chownSync(tmp, NOBODY, NOBODY);
function mkdirOwned(p) {
  fs.mkdirSync(p, { recursive: true });
  if (AS_ROOT) fs.chownSync(p, NOBODY, NOBODY);
  return p;
}

// the demo model with a longer context
const model = mkdirOwned(path.join(tmp, 'model'));
for (const f of fs.readdirSync(MODEL)) {
  if (f === 'config.json') continue;
  fs.symlinkSync(path.join(MODEL, f), path.join(model, f));
}
const cfg = JSON.parse(fs.readFileSync(path.join(MODEL, 'config.json'), 'utf8'));
cfg.max_position_embeddings = 8192;
fs.writeFileSync(path.join(model, 'config.json'), JSON.stringify(cfg));

function ids(n, seed) { // deterministic token ids away from the special ones
  const a = [];
  let x = (seed * 2654435761) >>> 0;
  for (let i = 0; i < n; i++) {
    x = (Math.imul(x, 1103515245) + 12345) >>> 0;
    a.push(10 + ((x >>> 8) % 8000));
  }
  return a;
}

async function complete(url, prompt, maxTokens = 12) {
  const res = await fetch(url + '/v1/completions', {
    method: 'POST', headers: { 'Content-Type': 'application/json' },
    body: JSON.stringify({ prompt, max_tokens: maxTokens, temperature: 0, ignore_eos: true }),
  });
  const j = await res.json();
  return { status: res.status, text: j.choices?.[0]?.text,
    cached: j.usage?.prompt_tokens_details?.cached_tokens, body: j };
}
async function stats(url) { return (await (await fetch(url + '/stats')).json()).engine; }
function fpDir(dir) {
  const subs = fs.readdirSync(dir).filter((d) => /^[0-9a-f]{16}$/.test(d));
  return subs.length === 1 ? path.join(dir, subs[0]) : null;
}
const warnings = (log) => log.split('\n').filter((l) => /warn/.test(l) && /kv-disk/.test(l));
const serve = (args) => startServer(args, { model, spawnOpts, timeoutMs: 120000 });

// ---- 1. restart ----
{
  const dir = mkdirOwned(path.join(tmp, 'restart'));
  const P = ids(3700, 1);
  const s1 = await serve(['--kv-disk', dir, '--kv-disk-budget', '1G']);
  const cold = await complete(s1.url, P);
  const coldTtft = (await stats(s1.url)).last_ttft_s;
  check(cold.status === 200 && cold.cached === 0, 'cold prompt: 200 and nothing cached', cold.body);
  const mem = await complete(s1.url, P);
  const st1 = await stats(s1.url);
  check(mem.cached >= 3500 && mem.text === cold.text, 'memory hit: cached >= 3500, same text',
    { cached: mem.cached, text: mem.text, cold: cold.text });
  check(st1.kv_tiers.memory.hit_tokens >= 3500, 'memory tier counts its hit', st1.kv_tiers);
  const r1 = await s1.stop();
  check(r1.code === 0, 'first server exits cleanly', r1);
  const fp = fpDir(dir);
  const files = fp ? fs.readdirSync(fp).filter((f) => f.endsWith('.kvb')) : [];
  check(files.length >= 3600 / 16, 'shutdown flushed the cached blocks to disk', files.length);

  const s2 = await serve(['--kv-disk', dir, '--kv-disk-budget', '1G']);
  check(/kv-disk: \d+ blocks/.test(s2.log()), 'restart indexes the directory', s2.log());
  const warm = await complete(s2.url, P);
  const st2 = await stats(s2.url);
  check(warm.status === 200 && warm.cached >= 3500, 'after restart: cached_tokens >= 3500', warm.body.usage);
  check(warm.text === cold.text, 'after restart: identical greedy text', { warm: warm.text, cold: cold.text });
  const d = st2.kv_tiers.disk;
  check(d && d.hit_tokens >= 3500 && d.hit_blocks >= 3500 / 16 && d.read_bytes > 0 && d.corrupt_blocks === 0,
    'disk tier counts hits, bytes, no corruption', d);
  check(st2.kv_tiers.memory.hit_tokens === 0, 'nothing came from memory after the restart', st2.kv_tiers.memory);
  check(st2.last_ttft_s * 5 <= coldTtft, 'TTFT from disk <= 1/5 of cold', { disk: st2.last_ttft_s, cold: coldTtft });
  const m = await (await fetch(s2.url + '/metrics')).text();
  check(/tern_kv_tier_hit_tokens_total\{tier="disk"\} [1-9]/.test(m) &&
    /tern_kv_tier_read_seconds_total\{tier="memory"\}/.test(m) && /tern_kv_disk_corrupt_blocks_total 0/.test(m),
  '/metrics reports the tiers');
  await s2.stop();
}

// ---- 2. kill -9 during heavy eviction, then corrupt files ----
{
  const dir = mkdirOwned(path.join(tmp, 'crash'));
  const Q = Array.from({ length: 6 }, (_, k) => ids(400, 10 + k));
  const args = ['--kv-disk', dir, '--kv-budget', '0.005', '--max-batch', '2'];
  const s3 = await serve(args);
  const outA = [];
  for (const q of Q) outA.push((await complete(s3.url, q)).text);
  check(outA.every((t) => typeof t === 'string'), 'cold pass answered', outA);
  // new prompts: every admission evicts blocks that are not on disk yet
  const burst = [];
  for (let k = 0; k < 12; k++) burst.push(complete(s3.url, ids(400, 100 + k), 40).catch(() => null));
  // kill once the writer is busy
  const written0 = (await stats(s3.url)).kv_tiers.disk.written_blocks;
  for (let i = 0; i < 400; i++) {
    const st = await stats(s3.url).catch(() => null);
    if (!st || st.kv_tiers.disk.written_blocks >= written0 + 30) break;
    await sleep(25);
  }
  s3.proc.kill('SIGKILL');
  await Promise.all(burst);
  await s3.stop();

  const fp = fpDir(dir);
  const firsts = [];
  for (const f of fs.readdirSync(fp).filter((x) => x.endsWith('.kvb'))) {
    const b = fs.readFileSync(path.join(fp, f));
    // parent hash 0: a prompt's first block (of Q: the burst's are never read again)
    if (b.length >= 72 + 64 && b.readBigUInt64LE(32) === 0n && Q.some((q) => q[0] === b.readInt32LE(72)))
      firsts.push({ f, first: b.readInt32LE(72) });
  }
  check(firsts.length >= 2, 'first blocks of at least 2 prompts on disk', firsts.length);
  const hurt = new Set();
  if (firsts.length >= 2) {
    const a = path.join(fp, firsts[0].f), b = path.join(fp, firsts[1].f);
    const buf = fs.readFileSync(a);
    buf[72 + 64 + 1000] ^= 0x20; // a bit flip in the KV
    fs.writeFileSync(a, buf);
    fs.truncateSync(b, Math.floor(fs.statSync(b).size / 2));
    for (const x of firsts.slice(0, 2)) hurt.add(Q.findIndex((q) => q[0] === x.first));
  }
  fs.writeFileSync(path.join(fp, '00000000000000ff.tmp'), Buffer.alloc(5000, 7)); // a write cut short
  if (AS_ROOT) for (const f of fs.readdirSync(fp)) fs.chownSync(path.join(fp, f), NOBODY, NOBODY);

  const s4 = await serve(args);
  check(!/error/i.test(s4.log()), 'restart after kill -9: no error', s4.log());
  let diskHit = 0;
  for (let k = 0; k < Q.length; k++) {
    const r = await complete(s4.url, Q[k]);
    check(r.status === 200 && r.text === outA[k], `prompt ${k}: identical text after the crash`,
      { got: r.text, want: outA[k], status: r.status });
    if (hurt.has(k)) check(r.cached === 0, `prompt ${k}: its corrupt first block is recomputed, not served`, r.cached);
    diskHit += r.cached;
  }
  const d = (await stats(s4.url)).kv_tiers.disk;
  check(d.corrupt_blocks === 2, 'exactly the 2 damaged files counted as corrupt', d);
  check(d.torn_files >= 1, 'the partial write counted as torn', d);
  check(diskHit > 0 && d.hit_tokens === diskHit, 'the undamaged prompts read from disk', { diskHit, d });
  check(warnings(s4.log()).length === 2, 'one warning per damaged file', warnings(s4.log()));
  const code = (await s4.stop()).code;
  check(code === 0, 'server exits cleanly', code);
}

// ---- 3. a directory that cannot be written ----
{
  const Q0 = ids(400, 10);
  const ref = await (async () => {
    const s = await serve([]);
    const r = await complete(s.url, Q0);
    await s.stop();
    return r.text;
  })();
  const ro = mkdirOwned(path.join(tmp, 'readonly'));
  fs.chmodSync(ro, 0o555);
  const s5 = await serve(['--kv-disk', path.join(ro, 'kv'), '--kv-budget', '0.005']);
  const r5 = await complete(s5.url, Q0);
  check(r5.status === 200 && r5.text === ref, 'read-only directory at start: serving continues', r5.body);
  check(warnings(s5.log()).length === 1 && /without the disk tier/.test(s5.log()), 'read-only at start: one warning',
    s5.log());
  check(!(await stats(s5.url)).kv_tiers.disk, '/stats shows no disk tier');
  await s5.stop();

  const rw = mkdirOwned(path.join(tmp, 'midrun'));
  const s6 = await serve(['--kv-disk', rw, '--kv-budget', '0.005']);
  fs.chmodSync(fpDir(rw), 0o555); // writes fail from now on
  const Q = Array.from({ length: 4 }, (_, k) => ids(400, 10 + k));
  let same = true;
  for (let round = 0; round < 2; round++)
    for (const q of Q) {
      const r = await complete(s6.url, q);
      if (r.status !== 200) same = false;
      if (q === Q[0] && r.text !== ref) same = false;
    }
  const d = (await stats(s6.url)).kv_tiers.disk;
  check(same, 'directory made read-only mid-run: every request answered, same text');
  check(d.enabled === false && d.written_blocks === 0, 'writes turned off', d);
  check(warnings(s6.log()).length === 1, 'exactly one warning for the failed writes', warnings(s6.log()));
  await s6.stop();
}

fs.rmSync(tmp, { recursive: true, force: true });
process.exit(summary('kv_disk'));
