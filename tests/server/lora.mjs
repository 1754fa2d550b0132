// LoRA adapters through HTTP (`tern serve MODEL --lora NAME=DIR`): two random
// PEFT adapters of the demo model (build/tools/make_lora). Checks: a request's
// `model` naming an adapter ("a" or "tern-demo:a") gets the adapter's answer,
// which differs from the base's; base, a and b requests sent all at once get
// the greedy texts each gets alone; an unknown adapter is 404
// model_not_found; POST /v1/load_lora_adapter and /v1/unload_lora_adapter
// (vLLM's shape) behind the API key - a duplicate name 400, a folder that is
// no adapter or an adapter of another shape 400 naming the file or tensor,
// an unloaded adapter 404 afterwards; adapters listed in /v1/models with
// their parent; per-adapter counters in /stats and /metrics; a response's
// `model` (and every streamed chunk's) names what the request asked for; a
// bad --lora fails the start with the reason.
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { spawnSync } from 'node:child_process';
import { startServer, check, summary, MODEL, BUILD, BIN } from './lib.mjs';

const KEY = 'sk-lora-' + Math.random().toString(36).slice(2);
const tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'tern-lora-'));
const ALL = 'q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj';
function makeLora(out, args, base = MODEL) {
  const r = spawnSync(path.join(BUILD, 'tools', 'make_lora'), ['--base', base, '--out', out, ...args], { encoding: 'utf8' });
  if (r.status !== 0) throw new Error('make_lora failed: ' + r.stderr);
  return out;
}
const A = makeLora(path.join(tmp, 'a'), ['--r', '8', '--alpha', '16', '--targets', 'q_proj,v_proj', '--seed', '1']);
const B = makeLora(path.join(tmp, 'b'), ['--r', '4', '--alpha', '8', '--rslora', '--targets', ALL, '--seed', '2']);
const C = makeLora(path.join(tmp, 'c'), ['--r', '2', '--alpha', '4', '--targets', ALL, '--seed', '3']);
// an adapter of another shape: for a fixture with a narrower model
const fixture = path.join(tmp, 'fixture');
const mk = spawnSync(path.join(BUILD, 'tools', 'make_fixture'),
  ['--family', 'llama', '--preset', 'tiny', '--seed', '11', '--tokenizer', MODEL, '--out', fixture], { encoding: 'utf8' });
if (mk.status !== 0) throw new Error('make_fixture failed: ' + mk.stderr);
const OTHER = makeLora(path.join(tmp, 'other'), ['--r', '4', '--alpha', '8', '--targets', 'q_proj', '--seed', '4'], fixture);

const headers = { 'Content-Type': 'application/json', Authorization: `Bearer ${KEY}` };
async function post(url, body, h = headers) {
  const r = await fetch(url, { method: 'POST', headers: h, body: JSON.stringify(body) });
  const text = await r.text();
  let json = null;
  try { json = JSON.parse(text); } catch { /* plain text */ }
  return { status: r.status, json, text };
}
const PROMPTS = ['Once upon a time', 'The little dog', 'In the morning the sailors'];
async function complete(url, model, prompt) {
  const r = await post(`${url}/v1/completions`, { model, prompt, max_tokens: 16, temperature: 0 });
  if (r.status !== 200) return { status: r.status, error: r.json && r.json.error };
  return { status: 200, text: r.json.choices[0].text, model: r.json.model };
}

let rc = 1;
let mem = null; // the demo's charges and adapter c's bytes, from the first server
try {
  // ---- a bad --lora fails the start, naming why
  const bad = spawnSync(BIN, ['serve', MODEL, '--port', '0', '--lora', `x=${OTHER}`], { encoding: 'utf8', timeout: 60000 });
  check(bad.status !== 0 && /lora_A|lora_B/.test(bad.stderr) && /shape/.test(bad.stderr),
    'a --lora adapter of another shape fails the start naming the tensor', bad.stderr.slice(-300));

  const srv = await startServer(['--api-key', KEY, '--threads', '2', '--kv-budget', '0.05', '--lora', `a=${A}`,
    '--lora', `tern-demo:b=${B}`]);
  const url = srv.url;
  try {
    // ---- alone, one at a time
    const alone = {};
    for (const m of ['tern-demo', 'a', 'b'])
      for (const p of PROMPTS) {
        const r = await complete(url, m, p);
        check(r.status === 200, `${m} answers "${p}"`, r);
        check(r.model === m, `${m}'s response names "${m}"`, r.model);
        alone[`${m}|${p}`] = r.text;
      }
    let differ = 0;
    for (const p of PROMPTS) {
      differ += alone[`a|${p}`] !== alone[`tern-demo|${p}`];
      differ += alone[`b|${p}`] !== alone[`tern-demo|${p}`];
    }
    check(differ >= 4, 'the adapters change the answers', alone);
    const prefixed = await complete(url, 'tern-demo:a', PROMPTS[0]);
    check(prefixed.text === alone[`a|${PROMPTS[0]}`], '"tern-demo:a" is adapter a', prefixed);
    check(prefixed.model === 'tern-demo:a', 'its response names "tern-demo:a"', prefixed.model);
    // ---- streamed: every chunk names the adapter as asked
    {
      const sr = await fetch(`${url}/v1/completions`, { method: 'POST', headers,
        body: JSON.stringify({ model: 'tern-demo:b', prompt: PROMPTS[0], max_tokens: 16, temperature: 0, stream: true }) });
      const chunks = (await sr.text()).split('\n').filter((l) => l.startsWith('data: {')).map((l) => JSON.parse(l.slice(6)));
      const text = chunks.map((c) => (c.choices && c.choices[0] ? c.choices[0].text || '' : '')).join('');
      check(sr.status === 200 && chunks.length > 1 && chunks.every((c) => c.model === 'tern-demo:b'),
        'streamed chunks name "tern-demo:b"', chunks.map((c) => c.model));
      check(text === alone[`b|${PROMPTS[0]}`], 'the streamed "tern-demo:b" text is b\'s', { text, want: alone[`b|${PROMPTS[0]}`] });
    }
    // ---- all at once: base, a and b rows share the steps
    const jobs = [];
    for (let k = 0; k < 2; k++)
      for (const m of ['tern-demo', 'a', 'b'])
        for (const p of PROMPTS) jobs.push(complete(url, m, p).then((r) => [m, p, r]));
    for (const [m, p, r] of await Promise.all(jobs))
      check(r.text === alone[`${m}|${p}`], `${m} "${p}" in a mixed batch equals alone`, { got: r.text, want: alone[`${m}|${p}`] });

    // ---- unknown adapters
    for (const m of ['nope', 'tern-demo:nope', 'nope:a']) {
      const r = await complete(url, m, PROMPTS[0]);
      check(r.status === 404 && r.error.code === 'model_not_found' && r.error.param === 'model', `${m} is 404`, r);
    }

    // ---- /v1/models
    const models = await (await fetch(`${url}/v1/models`, { headers })).json();
    const ids = models.data.map((m) => m.id);
    const ea = models.data.find((m) => m.id === 'a');
    check(ids.includes('tern-demo') && ids.includes('a') && ids.includes('b'), '/v1/models lists the adapters', ids);
    check(ea && ea.parent === 'tern-demo' && ea.root === A && ea.rank === 8, 'an adapter entry has parent, root, rank', ea);

    // ---- load / unload
    const noKey = await post(`${url}/v1/load_lora_adapter`, { lora_name: 'c', lora_path: C },
      { 'Content-Type': 'application/json' });
    check(noKey.status === 401, 'load_lora_adapter needs the API key', noKey.status);
    let r = await post(`${url}/v1/load_lora_adapter`, { lora_name: 'c', lora_path: C });
    check(r.status === 200 && /added successfully/.test(r.text), 'load c', r.text);
    const cText = await complete(url, 'c', PROMPTS[0]);
    check(cText.status === 200 && cText.text !== alone[`tern-demo|${PROMPTS[0]}`], 'c answers with its own text', cText);
    r = await post(`${url}/v1/load_lora_adapter`, { lora_name: 'c', lora_path: C });
    check(r.status === 400 && r.json.error.param === 'lora_name', 'a second c is 400', r.text);
    r = await post(`${url}/v1/load_lora_adapter`, { lora_name: 'o', lora_path: OTHER });
    check(r.status === 400 && /lora_[AB]\.weight/.test(r.json.error.message) && r.json.error.code === 'adapter_load_failed',
      'an adapter of another shape is 400 naming the tensor', r.text);
    r = await post(`${url}/v1/load_lora_adapter`, { lora_name: 'n', lora_path: tmp });
    check(r.status === 400 && /adapter_config\.json/.test(r.json.error.message), 'a folder with no adapter is 400', r.text);
    r = await post(`${url}/v1/load_lora_adapter`, { lora_name: 'm' });
    check(r.status === 400 && r.json.error.param === 'lora_path', 'lora_path is required', r.text);
    r = await post(`${url}/v1/load_lora_adapter`, { lora_name: 'm', lora_path: C, rank: 3 });
    check(r.status === 400 && r.json.error.param === 'rank', 'an unknown field is 400 naming it', r.text);
    r = await post(`${url}/v1/unload_lora_adapter`, { lora_name: 'c' });
    check(r.status === 200 && /removed successfully/.test(r.text), 'unload c', r.text);
    const gone = await complete(url, 'c', PROMPTS[0]);
    check(gone.status === 404 && gone.error.code === 'model_not_found', 'c is 404 once unloaded', gone);
    r = await post(`${url}/v1/unload_lora_adapter`, { lora_name: 'c' });
    check(r.status === 404, 'unloading c twice is 404', r.text);
    r = await post(`${url}/v1/load_lora_adapter`, { lora_name: 'c', lora_path: C });
    const again = await complete(url, 'c', PROMPTS[0]);
    check(r.status === 200 && again.text === cText.text, 'c loaded again answers as before', again);

    // ---- counters
    const st = await (await fetch(`${url}/stats`)).json();
    const la = st.lora_adapters || {};
    // a: 3 alone + 1 prefixed + 6 mixed; b: 3 + 1 streamed + 6; c: 2
    check(la.a && la.a.requests === 10 && la.a.parent === 'tern-demo', '/stats counts a\'s requests', la.a);
    check(la.b && la.b.requests === 10 && la.b.completion_tokens === 10 * 16 && la.b.failed === 0,
      '/stats counts b\'s tokens', la.b);
    check(la.c && la.c.requests === 2 && la.c.loaded === true, '/stats counts c across an unload', la.c);
    const prom = await (await fetch(`${url}/metrics`)).text();
    const lines = prom.split('\n').filter((l) => l.startsWith('tern_lora')).join('\n');
    check(/tern_lora_requests_total\{adapter="a",model="tern-demo"\} 10/.test(prom), '/metrics has per-adapter counters',
      lines);
    check(new RegExp(`tern_lora_completion_tokens_total\\{adapter="b",model="tern-demo"\\} ${10 * 16}\\b`).test(prom) &&
      new RegExp(`tern_lora_prompt_tokens_total\\{adapter="b",model="tern-demo"\\} ${la.b && la.b.prompt_tokens}\\b`).test(prom) &&
      /tern_lora_requests_total\{adapter="c",model="tern-demo"\} 2\b/.test(prom), '/metrics agrees with /stats for b and c',
      lines);
    // ---- memory: the adapters read are charged to their base (/v1/models, /stats, /metrics)
    const entries = async (u) => (await (await fetch(`${u}/v1/models`, { headers })).json()).data;
    let data = await entries(url);
    const by = (id) => data.find((m) => m.id === id);
    const bytesOf = { a: by('a').bytes, b: by('b').bytes, c: by('c').bytes };
    check(bytesOf.a > 0 && bytesOf.b > 0 && bytesOf.c > 0, 'adapter entries give their bytes', bytesOf);
    const demo = by('tern-demo');
    check(demo.memory.adapters_bytes === bytesOf.a + bytesOf.b + bytesOf.c,
      'the base\'s memory.adapters_bytes is its adapters\' bytes', { memory: demo.memory, bytesOf });
    const promMem = await (await fetch(`${url}/metrics`)).text();
    check(new RegExp(`tern_model_memory_bytes\\{model="tern-demo",kind="adapters"\\} ${demo.memory.adapters_bytes}\\b`)
      .test(promMem), '/metrics charges the adapters to the base',
    promMem.split('\n').filter((l) => l.startsWith('tern_model_memory_bytes')).join('\n'));
    const stm = await (await fetch(`${url}/stats`)).json();
    check(stm.models && stm.models['tern-demo'] && stm.models['tern-demo'].adapters_bytes === demo.memory.adapters_bytes,
      '/stats charges the adapters to the base', stm.models && stm.models['tern-demo']);
    r = await post(`${url}/v1/unload_lora_adapter`, { lora_name: 'c' });
    data = await entries(url);
    check(r.status === 200 && by('tern-demo').memory.adapters_bytes === bytesOf.a + bytesOf.b,
      'an unloaded adapter is no longer charged', by('tern-demo').memory);
    mem = { ...demo.memory, c: bytesOf.c, cText: cText.text };
  } finally {
    const ex = await srv.stop();
    check(ex.code === 0, 'the server exits cleanly', ex);
  }

  // ---- --max-memory counts adapters: x and y (the demo twice) fit, x's adapter c on top does not
  if (mem) {
    const model = mem.weights_bytes + mem.kv_bytes;
    const gib = (n) => (n / 2 ** 30).toFixed(12);
    const limit = gib(2 * model + Math.floor(mem.c / 2));
    const pool = ['--model', `x=${MODEL}`, '--model', `y=${MODEL}`, '--max-memory', limit, '--api-key', KEY,
      '--threads', '2', '--kv-budget', '0.05', '--lora', `x:c=${C}`];
    // y pinned: c cannot fit - refused with the sizes, nothing charged
    let p = await startServer([...pool, '--pin', 'y'], { model: null });
    try {
      const x = await complete(p.url, 'x', PROMPTS[0]);
      const pm = (await (await fetch(`${p.url}/v1/models`, { headers })).json()).data;
      const ex = pm.find((m) => m.id === 'x');
      check(x.status === 200 && ex.memory.weights_bytes + ex.memory.kv_bytes === model,
        'x costs what the demo costs alone', ex && ex.memory);
      const rc2 = await complete(p.url, 'c', PROMPTS[0]);
      check(rc2.status === 503 && rc2.error.code === 'model_cannot_fit' &&
        /adapter 'c' .*does not fit.*--max-memory.*y \(pinned\)/.test(rc2.error.message),
      'an adapter beyond --max-memory is 503 model_cannot_fit naming it, the sizes and the holder', rc2);
      const pm2 = (await (await fetch(`${p.url}/v1/models`, { headers })).json()).data;
      check(pm2.find((m) => m.id === 'x').memory.adapters_bytes === 0, 'the refused adapter is not charged',
        pm2.find((m) => m.id === 'x').memory);
    } finally {
      await p.stop();
    }
    // nothing pinned: reading c evicts the idle y; evicting x drops c's charge
    p = await startServer(pool, { model: null });
    try {
      await complete(p.url, 'x', PROMPTS[0]);
      await complete(p.url, 'y', PROMPTS[0]);
      const rc3 = await complete(p.url, 'c', PROMPTS[0]);
      let pm = (await (await fetch(`${p.url}/v1/models`, { headers })).json()).data;
      const st = (id) => pm.find((m) => m.id === id);
      check(rc3.status === 200 && rc3.text === mem.cText, 'c on x answers as on the demo', rc3);
      check(st('y').state === 'unloaded' && st('x').state === 'loaded' && st('x').memory.adapters_bytes === mem.c,
        'reading c evicted the idle y and charges c to x', pm.map((m) => [m.id, m.state, m.memory]));
      const ry = await complete(p.url, 'y', PROMPTS[0]);
      pm = (await (await fetch(`${p.url}/v1/models`, { headers })).json()).data;
      check(ry.status === 200 && st('x').state === 'unloaded' && st('x').memory.adapters_bytes === 0,
        'y back evicts x, and x\'s adapter goes with it', pm.map((m) => [m.id, m.state, m.memory]));
    } finally {
      await p.stop();
    }
  }
  rc = summary('lora');
} finally {
  fs.rmSync(tmp, { recursive: true, force: true });
}
process.exit(rc);
