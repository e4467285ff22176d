// Encode throughput of the official HF tokenizers (npm 0.23.2, native) for
// bench/tokenizer_bench.cc, which runs it in the same process tree on the same corpus.
//   RAYON_NUM_THREADS=1 node hf_bench.mjs CORPUS_FILE NAME=TOKENIZER_DIR...
// Prints one JSON line per vocabulary: {"name", "bytes", "seconds", "mb_per_s", "tokens"}.
// Documents (paragraphs) are encoded with encodeBatch in chunks; with RAYON_NUM_THREADS=1
// the library encodes them on one thread, as our single-threaded measurement does.
import { createRequire } from 'node:module';
import fs from 'node:fs';
import path from 'node:path';

const assets = process.env.ASTRAI_ASSETS;
const require = createRequire(path.resolve(assets, 'js', 'node_modules', 'x.js'));
const { Tokenizer } = require('tokenizers');
const [corpusFile, ...specs] = process.argv.slice(2);
const docs = fs.readFileSync(corpusFile, 'utf8').split('\n\n').filter((d) => d.length);
const bytes = docs.reduce((a, d) => a + Buffer.byteLength(d), 0);
for (const spec of specs) {
  const [name, dir] = spec.split('=');
  const tok = Tokenizer.fromFile(path.join(dir, 'tokenizer.json'));
  let best = Infinity;
  let tokens = 0;
  for (let rep = 0; rep < 2; rep++) {
    // Process CPU time (user + system): the encode work runs on the single rayon thread,
    // plus the Node main thread's share; comparable with our thread CPU time.
    const c0 = process.cpuUsage();
    tokens = 0;
    for (let i = 0; i < docs.length; i += 512) {
      const encs = await tok.encodeBatch(docs.slice(i, i + 512), { addSpecialTokens: false });
      for (const e of encs) tokens += e.getIds().length;
    }
    const c = process.cpuUsage(c0);
    best = Math.min(best, (c.user + c.system) / 1e6);
  }
  console.log(JSON.stringify({ name, bytes, seconds: best, mb_per_s: bytes / best / 1e6, tokens }));
}
