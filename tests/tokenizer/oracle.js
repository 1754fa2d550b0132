// HF tokenizers oracle (npm tokenizers@0.23.2, the Rust library's Node
// binding). Usage: node oracle.js DIR encode|encode-nospecial|decode|decode-skip < jsonl
// encode*: each input line a JSON string -> the id array;
// decode*: each input line a JSON id array -> the decoded JSON string.
const path = require('path');
const fs = require('fs');
const { Tokenizer } = require(path.join(__dirname, '..', 'oracle', 'node_modules', 'tokenizers'));

async function main() {
  const [dir, mode] = process.argv.slice(2);
  const tok = Tokenizer.fromFile(path.join(dir, 'tokenizer.json'));
  const lines = fs.readFileSync(0, 'utf8').split('\n').filter((l) => l.length > 0);
  const vals = lines.map((l) => JSON.parse(l));
  const out = [];
  if (mode.startsWith('encode')) {
    const encs = await tok.encodeBatch(vals, { addSpecialTokens: mode === 'encode' });
    for (const e of encs) out.push(JSON.stringify(Array.from(e.getIds())));
  } else {
    const texts = await tok.decodeBatch(vals, mode === 'decode-skip');
    for (const t of texts) out.push(JSON.stringify(t));
  }
  fs.writeSync(1, out.join('\n') + (out.length ? '\n' : ''));
}
main().catch((e) => { console.error(e); process.exit(1); });
