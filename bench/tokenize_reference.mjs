// The reference side of bench/tokenize_bench.sh: tokenizes the same files as `latentctl tokenize`
// (a .jsonl line's "text" or a whole file per document, the tokenizer's special tokens, then the
// separator) with @lenml/tokenizers (a port of transformers.js), writes the ids as a little-endian
// int32 file and prints the seconds spent tokenizing.
//   node bench/tokenize_reference.mjs TOKENIZER_DIR SEPARATOR_ID OUT.i32 FILE...
import { createRequire } from "module";
import fs from "fs";
import path from "path";

const require = createRequire(process.env.NODE_PATH + "/");
const { TokenizerLoader } = require("@lenml/tokenizers");
const [dir, separator, out, ...files] = process.argv.slice(2);
const tokenizer = TokenizerLoader.fromPreTrained({
  tokenizerJSON: JSON.parse(fs.readFileSync(path.join(dir, "tokenizer.json"), "utf8")),
  tokenizerConfig: JSON.parse(fs.readFileSync(path.join(dir, "tokenizer_config.json"), "utf8")),
});
const documents = [];
for (const file of files) {
  const text = fs.readFileSync(file, "utf8");
  if (file.endsWith(".jsonl")) {
    for (const line of text.split("\n")) if (line.trim()) documents.push(JSON.parse(line).text);
  } else {
    documents.push(text);
  }
}
const ids = [];
const start = process.hrtime.bigint();
for (const doc of documents) {
  for (const id of tokenizer.encode(doc)) ids.push(id);
  ids.push(Number(separator));
}
const seconds = Number(process.hrtime.bigint() - start) / 1e9;
fs.writeFileSync(out, Buffer.from(new Int32Array(ids).buffer));
console.log(seconds.toFixed(3));
