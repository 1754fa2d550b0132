// Does loading a model stall another model's streams? A pool of the demo and
// a 1B-shaped random llama (tools/make_fixture --preset 1b, bf16, ~2 GB;
// TERN_POOL_STALL_MODEL=DIR uses that folder instead). 16 greedy streams
// decode on the demo; their inter-token gaps (arrival of consecutive SSE
// token chunks at the client) are measured with nothing else going on, and
// while the 1B model is loaded and unloaded over and over through POST
// /v1/models/load|unload for the whole run. Phases alternate (base, load,
// base, load) so a noisy machine hits both alike. Passes when the p99 gap
// under loading stays under 2x the baseline's.
//   node tests/server/pool_stall.mjs            (ctest server.pool_stall, label slow)
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { spawnSync } from 'node:child_process';
import { startServer, check, summary, MODEL, BUILD } from './lib.mjs';

const STREAMS = 16, TOKENS = Number(process.env.TERN_POOL_STALL_TOKENS || 160), ROUNDS = 2;
let tmp = null, big = process.env.TERN_POOL_STALL_MODEL;
if (!big) {
  tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'tern-stall-'));
  big = path.join(tmp, 'big1b');
  const t0 = Date.now();
  const mk = spawnSync(path.join(BUILD, 'tools', 'make_fixture'),
    ['--family', 'llama', '--preset', '1b', '--dtype', 'bf16', '--seed', '5', '--tokenizer', MODEL, '--out', big], { encoding: 'utf8' });
  if (mk.status !== 0) throw new Error('make_fixture failed: ' + mk.stderr);
  console.log(`fixture: 1B-shaped llama written in ${((Date.now() - t0) / 1000).toFixed(1)} s`);
}

const pct = (a, p) => { const s = [...a].sort((x, y) => x - y); return s.length ? s[Math.min(s.length - 1, Math.floor(p * s.length))] : NaN; };

let srv = null;
try {
  srv = await startServer(['--model', `demo=${MODEL}`, '--model', `big=${big}`, '--kv-budget', '0.1', '--max-batch', String(STREAMS)], { model: null });
  const post = (route, body) => fetch(srv.url + route, { method: 'POST', headers: { 'Content-Type': 'application/json' }, body: JSON.stringify(body) });

  // One stream: arrival times (ms) of its token chunks.
  async function stream(i) {
    const r = await post('/v1/completions', { model: 'demo', prompt: `Once upon a time ${i}`, max_tokens: TOKENS, temperature: 0, ignore_eos: true, stream: true });
    const rd = r.body.getReader(), dec = new TextDecoder(), times = [];
    let buf = '';
    for (;;) {
      const { value, done } = await rd.read();
      if (done) break;
      const now = performance.now();
      buf += dec.decode(value, { stream: true });
      let k;
      while ((k = buf.indexOf('\n\n')) >= 0) {
        const ev = buf.slice(0, k);
        buf = buf.slice(k + 2);
        if (ev.startsWith('data: {') && ev.includes('"text"')) times.push(now);
      }
    }
    return times;
  }

  const loads = [];
  async function phase(loading) {
    let on = true;
    const cycler = (async () => {
      while (loading && on) {
        const t0 = performance.now();
        const r = await post('/v1/models/load', { model: 'big' });
        loads.push(performance.now() - t0);
        check(r.status === 200, 'load big: 200', r.status);
        await post('/v1/models/unload', { model: 'big' });
      }
    })();
    const all = await Promise.all(Array.from({ length: STREAMS }, (_, i) => stream(i)));
    on = false;
    await cycler;
    const gaps = [];
    for (const t of all) {
      check(t.length >= TOKENS - 1, 'stream complete', t.length);
      for (let j = 2; j < t.length; j++) gaps.push(t[j] - t[j - 1]); // from the second gap: the first holds the prefill
    }
    return gaps;
  }

  await phase(false); // warm-up: pages of the demo, the prefix cache
  const base = [], load = [];
  for (let r = 0; r < ROUNDS; r++) {
    base.push(...(await phase(false)));
    load.push(...(await phase(true)));
  }
  const b99 = pct(base, 0.99), l99 = pct(load, 0.99);
  console.log(`baseline: ${base.length} gaps, p50 ${pct(base, 0.5).toFixed(1)} ms, p99 ${b99.toFixed(1)} ms, max ${Math.max(...base).toFixed(1)} ms`);
  console.log(`loading:  ${load.length} gaps, p50 ${pct(load, 0.5).toFixed(1)} ms, p99 ${l99.toFixed(1)} ms, max ${Math.max(...load).toFixed(1)} ms`);
  console.log(`loads of the 1B model meanwhile: ${loads.length}, p50 ${pct(loads, 0.5).toFixed(1)} ms, max ${Math.max(...loads).toFixed(1)} ms (load + engine, page cache warm)`);
  check(loads.length >= 4, 'the 1B model was loaded several times during the streams', loads.length);
  check(l99 < 2 * b99, `p99 inter-token gap while loading (${l99.toFixed(1)} ms) < 2x the baseline (${b99.toFixed(1)} ms)`);
  const st = (await (await fetch(srv.url + '/stats')).json()).models;
  check(st.big.loads === loads.length && st.big.unloads === loads.length, '/stats counts the loads and unloads', st.big);
} catch (e) {
  check(false, 'exception', e.stack || String(e));
  if (srv) console.error(srv.log());
} finally {
  if (srv) await srv.stop();
  if (tmp) fs.rmSync(tmp, { recursive: true, force: true });
}
process.exit(summary('pool_stall'));
