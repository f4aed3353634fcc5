// A pretokenized dataset as pyarrow / Hugging Face write it (SNAPPY, dictionary pages with their
// PLAIN fallback, one row group, 1 MiB pages; arrow-rs's writer via parquet-wasm): 16384 rows of
// 1024 ids with a text-like (log-uniform) distribution over GPT-2's vocabulary, and the same ids
// as a uint16 .npy, for bench/token_source_bench.
//
//   NODE_PATH=$PWD/node_modules node bench/make_parquet_tokens.cjs OUT_DIR
const fs = require("fs");
const path = require("path");
const arrow = require("apache-arrow");
const pq = require("parquet-wasm");
const rows = 16384, len = 1024, vocab = 50257;
const flat = new Uint16Array(rows * len);
let x = 12345;
// Zipf-ish ids: a few frequent tokens and a long tail, like text.
for (let i = 0; i < flat.length; ++i) {
  x = (Math.imul(x, 1664525) + 1013904223) >>> 0;
  const u = (x >>> 8) / (1 << 24);
  flat[i] = Math.min(vocab - 1, Math.floor(Math.exp(u * Math.log(vocab))) - 1);
}
const offsets = new Int32Array(rows + 1);
for (let r = 0; r <= rows; ++r) offsets[r] = r * len;
const values = arrow.makeData({type: new arrow.Int32(), data: Int32Array.from(flat)});
const list = arrow.makeData({type: new arrow.List(new arrow.Field("item", new arrow.Int32(), true)),
                             length: rows, nullCount: 0, valueOffsets: offsets, child: values});
const table = new arrow.Table({input_ids: arrow.makeVector(list)});
const props = new pq.WriterPropertiesBuilder().setCompression(pq.Compression.SNAPPY).build();
fs.writeFileSync(path.join(process.argv[2], "tokens.parquet"),
                 pq.writeParquet(pq.Table.fromIPCStream(arrow.tableToIPC(table, "stream")), props));
const header = "{'descr': '<u2', 'fortran_order': False, 'shape': (" + flat.length + ",), }";
let h = header; while ((10 + h.length + 1) % 64 != 0) h += " "; h += "\n";
const pre = Buffer.alloc(10); pre.write("\x93NUMPY", 0, "latin1"); pre[6] = 1; pre[7] = 0; pre.writeUInt16LE(h.length, 8);
fs.writeFileSync(path.join(process.argv[2], "tokens.npy"), Buffer.concat([pre, Buffer.from(h, "latin1"), Buffer.from(flat.buffer)]));
