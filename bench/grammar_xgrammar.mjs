// xgrammar's side of the MaskBench comparison (see bench/grammar_bench.sh):
// the same files, instances serialized as Python's json.dumps does, the
// same tokenizer (HF tokenizers via npm), one thread; xgrammar configured
// like tern (any whitespace, strict, no indent). Prints one JSON line with
// the fields of `tern grammar bench`. xgrammar here is its WebAssembly
// build under Node, so its times include WASM and JS-copy overheads.
// Usage: node bench/grammar_xgrammar.mjs --tokenizer DIR --data DIR [--limit N] [--budget SEC]
// --budget: stop starting new files after SEC seconds of wall time; the
// output's files_done says how many files (in name order) were measured,
// so the other engine can be run on exactly those.
import { execFileSync } from "node:child_process";
import fs from "node:fs";
import path from "node:path";
import { createRequire } from "node:module";

const require = createRequire(import.meta.url);
const root = path.resolve(path.dirname(new URL(import.meta.url).pathname), "..");
const xgPath = path.join(root, "tests/oracle/node_modules/@mlc-ai/web-xgrammar/lib/index.js");
globalThis.require = require;
globalThis.__filename = xgPath;
globalThis.__dirname = path.dirname(xgPath);
await import(xgPath);
const xg = globalThis.xgrammar;
const { Tokenizer } = require(path.join(root, "tests/oracle/node_modules/tokenizers"));

const args = {};
for (let i = 2; i < process.argv.length; i++) args[process.argv[i].replace(/^--/, "")] = process.argv[++i];
const tokDir = args.tokenizer, dataDir = args.data;
const limit = args.limit ? parseInt(args.limit, 10) : Infinity;
const budgetMs = args.budget ? parseFloat(args.budget) * 1e3 : Infinity;
const wall0 = Date.now();

const tj = JSON.parse(fs.readFileSync(path.join(tokDir, "tokenizer.json"), "utf8"));
let tcfg = {};
try { tcfg = JSON.parse(fs.readFileSync(path.join(tokDir, "tokenizer_config.json"), "utf8")); } catch {}
let vocabSize = 0;
for (const id of Object.values(tj.model.vocab)) vocabSize = Math.max(vocabSize, id + 1);
for (const t of tj.added_tokens || []) vocabSize = Math.max(vocabSize, t.id + 1);
const encoded = new Array(vocabSize).fill("");
for (const [s, id] of Object.entries(tj.model.vocab)) encoded[id] = s;
for (const t of tj.added_tokens || []) encoded[t.id] = t.special ? "" : t.content;
const eosStr = typeof tcfg.eos_token === "string" ? tcfg.eos_token : tcfg.eos_token?.content;
let eosId = -1;
for (const t of tj.added_tokens || []) if (t.content === eosStr) eosId = t.id;
const dts = ((d) => (d?.type === "Sequence" ? d.decoders.map((x) => x.type) : [d?.type]))(tj.decoder);
const vocabType = dts.includes("ByteLevel") ? "byte_level" : dts.includes("ByteFallback") ? "byte_fallback" : "raw";
const tinfo = await xg.TokenizerInfo.createTokenizerInfo(encoded, vocabType, false, vocabSize, eosId >= 0 ? [eosId] : undefined);
const compiler = await xg.GrammarCompiler.createGrammarCompiler(tinfo, false);
const tok = Tokenizer.fromFile(path.join(tokDir, "tokenizer.json"));

const files = fs.readdirSync(dataDir).filter((f) => f.endsWith(".json")).sort().slice(0, limit);
const py = `import json,sys\nout=[]\nfor p in sys.argv[1:]:\n d=json.load(open(p))\n out.append([json.dumps(d['schema']),[[json.dumps(t['data']),bool(t['valid'])] for t in d['tests']]])\nprint(json.dumps(out))`;
const docs = JSON.parse(execFileSync("python3", ["-c", py, ...files.map((f) => path.join(dataDir, f))],
  { maxBuffer: 1 << 30, encoding: "utf8" }));

// process CPU time in µs (like tern's thread CPU time: the machine may be shared)
const now = () => { const u = process.cpuUsage(); return u.user + u.system; };
const masks = [], compiles = [];
const r = { engine: "xgrammar-wasm", schemas: 0, compiled: 0, unsupported: 0, failed: 0, valid_total: 0, valid_accepted: 0,
  invalid_total: 0, invalid_accepted: 0, files_done: 0, budget_hit: false };
for (const [schema, tests] of docs) {
  if (Date.now() - wall0 > budgetMs) { r.budget_hit = true; break; }
  r.files_done++;
  r.schemas++;
  let cg;
  const t0 = now();
  try { cg = await compiler.compileJSONSchema(schema, true, -1, undefined, true); } catch (e) { r.failed++; continue; }
  compiles.push((now() - t0) / 1e3);
  r.compiled++;
  for (const [text, valid] of tests) {
    const ids = (await tok.encode(text, null, { addSpecialTokens: false })).getIds();
    const m = await xg.GrammarMatcher.createGrammarMatcher(cg, eosId >= 0 ? [eosId] : undefined);
    let ok = true;
    for (let i = 0; i <= ids.length && ok; i++) {
      const a = now();
      const bm = await m.getNextTokenBitmask();
      masks.push(now() - a);
      const id = i < ids.length ? ids[i] : eosId;
      if (!((bm[id >>> 5] >>> (id & 31)) & 1)) ok = false;
      else if (i < ids.length && !m.acceptToken(id)) ok = false;
    }
    m.dispose();
    if (valid) { r.valid_total++; r.valid_accepted += ok; } else { r.invalid_total++; r.invalid_accepted += ok; }
  }
  cg.dispose();
}
const sorted = (a) => a.slice().sort((x, y) => x - y);
const pct = (a, p) => (a.length ? a[Math.round(p * (a.length - 1))] : 0);
const ms = sorted(masks), cs = sorted(compiles);
Object.assign(r, { compile_ms_p50: +pct(cs, 0.5).toFixed(3), compile_ms_p99: +pct(cs, 0.99).toFixed(3),
  masks: ms.length, mask_us_avg: +(ms.reduce((s, x) => s + x, 0) / (ms.length || 1)).toFixed(2),
  mask_us_p50: +pct(ms, 0.5).toFixed(2), mask_us_p99: +pct(ms, 0.99).toFixed(2),
  mask_us_max: +(ms.length ? ms[ms.length - 1] : 0).toFixed(1) });
console.log(JSON.stringify(r));
