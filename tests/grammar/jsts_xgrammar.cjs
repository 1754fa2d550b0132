// Independent check of the schema front end's EBNF dialect: every grammar
// the JSON-Schema-Test-Suite run produced (TERN_JSTS_DUMP of test_jsts) must
// parse in xgrammar (@mlc-ai/web-xgrammar, tests/oracle), and xgrammar must
// accept each instance exactly when tern's grammar core did.
// Usage: node tests/grammar/jsts_xgrammar.cjs DUMP.jsonl
const fs = require('fs');
const path = require('path');

// The package is an ES module wrapping a UMD bundle that calls require();
// load the bundle as CommonJS.
const lib = path.join(__dirname, '..', 'oracle', 'node_modules', '@mlc-ai', 'web-xgrammar', 'lib', 'index.js');
const mod = { exports: {} };
new Function('exports', 'module', 'require', '__filename', '__dirname', fs.readFileSync(lib, 'utf8'))(
  mod.exports, mod, require, lib, path.dirname(lib));
const xg = mod.exports;

(async () => {
  const lines = fs.readFileSync(process.argv[2], 'utf8').trim().split('\n');
  let grammars = 0, parseErrors = 0, checked = 0, disagree = 0, ternLooser = 0, classBug = 0, runTime = 0;
  // xgrammar 0.1.27 reads a character class with ranges of high BMP or
  // astral codepoints (e.g. [\uf900-\ufdcf]) as admitting ASCII too: probed
  // here; where the probe shows it, the grammars of the IRI and URI-template
  // formats (ucschar classes) are counted apart, and only tern being looser
  // there fails.
  const probe = await xg.Grammar.fromEBNF('root ::= "a" [\\uf900-\\ufdcf]* "b"');
  const hasClassBug = await xg.Testings.isGrammarAcceptString(probe, 'a{b');
  probe.dispose();
  const classBugFile = (g) => hasClassBug && ['iri', 'iri-reference', 'uri-template'].includes(g.schema?.format);
  // uniqueItems over unbounded domains and lengths past the product
  // automaton's bound are checked by tern's matcher at run time (rules
  // named __unique_items_N, __str_len_MIN_MAX_N); the grammar text alone
  // admits more, so only tern being looser there fails.
  const runTimeCheck = (g) => g.ebnf.includes('__unique_items_') || g.ebnf.includes('__str_len_');
  for (const line of lines) {
    const g = JSON.parse(line);
    grammars++;
    let gr;
    try {
      gr = await xg.Grammar.fromEBNF(g.ebnf);
    } catch (e) {
      parseErrors++;
      console.log(`xgrammar rejected the grammar of ${g.file} #${g.group}: ${String(e).slice(0, 300)}`);
      continue;
    }
    for (let i = 0; i < g.tests.length && i < g.tern_accepts.length; i++) {
      const acc = await xg.Testings.isGrammarAcceptString(gr, g.tests[i].text);
      checked++;
      if (acc !== g.tern_accepts[i]) {
        disagree++;
        if (g.tern_accepts[i]) ternLooser++;
        else if (classBugFile(g)) { classBug++; continue; }
        else if (runTimeCheck(g)) { runTime++; continue; }
        console.log(`disagree ${g.file} #${g.group} (${g.tests[i].desc}): xgrammar ${acc}, tern ${g.tern_accepts[i]}: ${g.tests[i].text.slice(0, 200)}`);
      }
    }
    gr.dispose();
  }
  disagree -= classBug + runTime;
  console.log(`${grammars} grammars, ${parseErrors} rejected by xgrammar; ${checked} instances, ${disagree} disagreements` +
              ` (+ ${classBug} from xgrammar's high-codepoint class bug, probe ${hasClassBug};` +
              ` + ${runTime} refused by tern's run-time uniqueItems / length checks)`);
  // Known: xgrammar 0.1.27 accepts a few instances these grammars exclude
  // (20-digit integers past the 17-digit cap, " " for pattern ^\S$, an object
  // whose "foo" breaks patternProperties f.*o: 8 instances); tern's
  // core agrees with the grammar text there. Any instance tern accepts and
  // xgrammar rejects, or more such cases, fails the check.
  process.exit(grammars > 100 && parseErrors === 0 && ternLooser === 0 && disagree <= 10 ? 0 : 1);
})();
