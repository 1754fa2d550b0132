// HF tokenizers (npm tokenizers@0.23.2) on the same corpus as
// bench_tokenizer: load time, cold and best-of-RUNS warm encode MB/s.
// Run with RAYON_NUM_THREADS=1 for one thread (bench_tokenizer.sh does).
// Usage: node bench_tokenizer_oracle.js DIR CORPUS.jsonl [RUNS]
const path = require('path');
const fs = require('fs');
const { Tokenizer } = require(path.join(__dirname, '..', 'tests', 'oracle', 'node_modules', 'tokenizers'));

async function main() {
  const [dir, corpus, runsArg] = process.argv.slice(2);
  const runs = Number(runsArg || 3);
  const texts = fs.readFileSync(corpus, 'utf8').split('\n').filter((l) => l.length).map((l) => JSON.parse(l));
  const bytes = texts.reduce((a, t) => a + Buffer.byteLength(t, 'utf8'), 0);
  let t0 = process.hrtime.bigint();
  const tok = Tokenizer.fromFile(path.join(dir, 'tokenizer.json'));
  const load = Number(process.hrtime.bigint() - t0) / 1e9;
  let best = Infinity, cold = 0;
  for (let r = 0; r <= runs; r++) {
    t0 = process.hrtime.bigint();
    await tok.encodeBatch(texts, { addSpecialTokens: true });
    const dt = Number(process.hrtime.bigint() - t0) / 1e9;
    if (r === 0) cold = dt; else best = Math.min(best, dt);
  }
  console.log(`oracle  ${dir.padEnd(40)} load ${load.toFixed(3)} s  encode cold ${(bytes / cold / 1e6).toFixed(1)} MB/s  warm ${(bytes / best / 1e6).toFixed(1)} MB/s`);
}
main().catch((e) => { console.error(e); process.exit(1); });
