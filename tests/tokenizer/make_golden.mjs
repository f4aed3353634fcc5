// Writes tests/tokenizer/golden.json: the ids a reference implementation (@lenml/tokenizers, a
// port of transformers.js' tokenizers) gives for tests/tokenizer/corpus.json under each
// tokenizer.json that scripts/fetch-tokenizers.sh fetches. Run once by hand when the corpus or the
// list changes (the test compares against the file; CI needs no node):
//
//   mkdir -p /tmp/ref && cd /tmp/ref && npm install @lenml/tokenizers@3.7.2
//   scripts/fetch-tokenizers.sh
//   NODE_PATH=/tmp/ref/node_modules node tests/tokenizer/make_golden.mjs \
//       ~/.cache/latentd/tokenizers > tests/tokenizer/golden.json
import { createRequire } from "module";
import fs from "fs";
import path from "path";
import crypto from "crypto";

const require = createRequire(process.env.NODE_PATH + "/");
const { TokenizerLoader } = require("@lenml/tokenizers");
const dir = process.argv[2];
const here = path.dirname(new URL(import.meta.url).pathname);
const corpus = JSON.parse(fs.readFileSync(path.join(here, "corpus.json"), "utf8"));
const out = { reference: "@lenml/tokenizers 3.7.2", tokenizers: {} };
for (const name of fs.readdirSync(dir).sort()) {
  const file = path.join(dir, name, "tokenizer.json");
  if (!fs.existsSync(file)) continue;
  const bytes = fs.readFileSync(file);
  const tokenizer = TokenizerLoader.fromPreTrained({
    tokenizerJSON: JSON.parse(bytes.toString("utf8")),
    tokenizerConfig: JSON.parse(fs.readFileSync(path.join(dir, name, "tokenizer_config.json"), "utf8")),
  });
  out.tokenizers[name] = {
    sha256: crypto.createHash("sha256").update(bytes).digest("hex"),
    ids: corpus.map((text) => Array.from(tokenizer.encode(text))),
  };
}
process.stdout.write(JSON.stringify(out) + "\n");
