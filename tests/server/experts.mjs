// A mixture of experts' counters through the server: a random qwen3_moe
// fixture (2 sparse layers of 8 f32 experts, 2 a token) served with
// --experts-in disk and a cache of 4 experts' bytes; after a completion,
// /stats has the model's "experts" object (where "disk", picks that hit
// and missed, the bytes read in - exactly one expert's bytes per miss -,
// resident bytes within the budget, the hit rate) and /metrics the same
// counters as tern_model_expert_* samples; served without the option, the
// object says "mapped" and counts nothing.
import { execFileSync } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { startServer, check, summary, BUILD, ROOT } from './lib.mjs';

const SHARED = process.env.TERN_SHARED || path.join(ROOT, '..', 'shared');
const tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'tern-experts-'));
const model = path.join(tmp, 'moe');
execFileSync(path.join(BUILD, 'tools', 'make_fixture'), [
  '--family', 'qwen3_moe', '--dim', '64', '--layers', '2', '--heads', '4', '--kv-heads', '2', '--head-dim', '32',
  '--ff', '96', '--experts', '8', '--top-k', '2', '--moe-ff', '64', '--seed', '5',
  '--tokenizer', path.join(SHARED, 'models', 'stories260K'), '--out', model], { stdio: 'ignore' });
const EXPERT_BYTES = 3 * 64 * 64 * 4; // gate, up, down of 64 x 64, f32

async function complete(url) {
  const res = await fetch(url + '/v1/completions', {
    method: 'POST', headers: { 'Content-Type': 'application/json' },
    body: JSON.stringify({ prompt: 'Once upon a time there was', max_tokens: 8, temperature: 0, ignore_eos: true }),
  });
  check(res.status === 200, 'completion answered', res.status);
  await res.json();
}

async function stats(url) {
  const j = await (await fetch(url + '/stats')).json();
  const names = Object.keys(j.models);
  check(names.length === 1, 'one model in /stats', names);
  return j.models[names[0]];
}

let rc = 1;
try {
  { // disk: an LRU of 4 experts
    const srv = await startServer(['--experts-in', 'disk', '--expert-cache', String(4 * EXPERT_BYTES)], { model });
    try {
      await complete(srv.url);
      const x = (await stats(srv.url)).experts;
      check(x && x.where === 'disk', '/stats experts.where is disk', x);
      const picks = x.hits + x.misses;
      check(picks > 0 && x.misses > 0, 'picks counted, some missed', x);
      check(x.streamed_bytes === x.misses * EXPERT_BYTES, 'one expert read in per miss', x);
      check(x.resident_bytes <= x.cache_bytes && x.cache_bytes === 4 * EXPERT_BYTES, 'resident within the budget', x);
      check(x.total_bytes === 2 * 8 * EXPERT_BYTES, 'total expert bytes', x);
      check(Math.abs(x.hit_rate - x.hits / picks) < 1e-12, 'hit rate', x);
      const met = await (await fetch(srv.url + '/metrics')).text();
      const sample = (name) => {
        const m = met.match(new RegExp(`^tern_model_${name}\\{model="[^"]*",where="disk"\\} (\\S+)$`, 'm'));
        return m ? Number(m[1]) : NaN;
      };
      check(sample('expert_hits_total') === x.hits, '/metrics expert_hits_total', sample('expert_hits_total'));
      check(sample('expert_misses_total') === x.misses, '/metrics expert_misses_total');
      check(sample('expert_streamed_bytes_total') === x.streamed_bytes, '/metrics expert_streamed_bytes_total');
      check(sample('expert_resident_bytes') === x.resident_bytes, '/metrics expert_resident_bytes');
      check(/^# TYPE tern_model_expert_stream_seconds_total counter$/m.test(met), '/metrics stream seconds family');
    } finally {
      await srv.stop();
    }
  }
  { // default: mapped, no counters
    const srv = await startServer([], { model });
    try {
      await complete(srv.url);
      const x = (await stats(srv.url)).experts;
      check(x && x.where === 'mapped' && x.hits === 0 && x.misses === 0, '/stats experts mapped, nothing counted', x);
    } finally {
      await srv.stop();
    }
  }
  rc = summary('experts');
} catch (e) {
  console.error(e);
} finally {
  fs.rmSync(tmp, { recursive: true, force: true });
}
process.exit(rc);
