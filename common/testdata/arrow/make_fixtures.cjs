// Writes the Arrow IPC token files common/arrow_column_test reads, with Apache Arrow's own
// JavaScript implementation, so the reader is checked against an independent writer:
//
//   npm install apache-arrow@17
//   NODE_PATH=$PWD/node_modules node common/testdata/arrow/make_fixtures.cjs common/testdata/arrow
//
// Each NAME.arrow of ids comes with NAME.u32: the token stream it holds (every list of the chosen
// column in row order, concatenated; null and empty lists hold none), as raw little-endian
// uint32; each text_*.arrow with NAME.json, the documents of its "text" column.
const fs = require("fs");
const path = require("path");
const arrow = require("apache-arrow");

const out = process.argv[2];

function ids(n, seed, vocab) {
  const v = new Array(n);
  let x = seed >>> 0;
  for (let i = 0; i < n; ++i) {
    x = (Math.imul(x, 1664525) + 1013904223) >>> 0;
    v[i] = (x >>> 8) % vocab;
  }
  return v;
}

function column(rows, type, wrap) {
  const wide = type instanceof arrow.Int64 || type instanceof arrow.Uint64;
  const builder = arrow.makeBuilder({type: wrap(new arrow.Field("item", type, true)),
                                     nullValues: [null]});
  for (const r of rows) builder.append(wide && r ? r.map((v) => BigInt(v)) : r);
  return builder.finish().toVector();
}

function writeStream(name, tables, stream, format) {
  let table = tables[0];
  for (const t of tables.slice(1)) table = table.concat(t);
  fs.writeFileSync(path.join(out, name + ".arrow"), arrow.tableToIPC(table, format));
  const raw = Buffer.alloc(stream.length * 4);
  stream.forEach((v, i) => raw.writeUInt32LE(v, i * 4));
  fs.writeFileSync(path.join(out, name + ".u32"), raw);
}

function rowsOf(count, len, seed, vocab) {
  const flat = ids(count * len, seed, vocab);
  const rows = [];
  for (let r = 0; r < count; ++r) rows.push(flat.slice(r * len, (r + 1) * len));
  return rows;
}

const list = (f) => new arrow.List(f);

// 1. What `datasets` writes (save_to_disk, map's cache files): the stream format, a text column
//    and an attention mask beside list<int32> input_ids, three record batches, an empty and a
//    null list among the rows.
{
  const tables = [], stream = [];
  for (let b = 0; b < 3; ++b) {
    const rows = rowsOf(10, 64, 10 + b, 50257);
    if (b == 1) {
      rows[2] = [];
      rows[5] = null;
    }
    rows.filter((r) => r).forEach((r) => stream.push(...r));
    tables.push(new arrow.Table({
      text: arrow.vectorFromArray(rows.map((r, i) => `document ${b}.${i}`), new arrow.Utf8()),
      input_ids: column(rows, new arrow.Int32(), list),
      attention_mask: column(rows.map((r) => r && r.map(() => 1)), new arrow.Int8(), list),
    }));
  }
  writeStream("datasets_stream", tables, stream, "stream");
}

// 2. The file format (Feather v2, uncompressed): int64 ids in fixed-size lists of 32.
{
  const rows = rowsOf(20, 32, 2, 151936);
  const table = new arrow.Table({
    tokens: column(rows, new arrow.Int64(), (f) => new arrow.FixedSizeList(32, f)),
  });
  writeStream("feather_fixed_size_list", [table], rows.flat(), "file");
}

// 3. A plain uint16 column, one id per row, ids above 32767 (unsigned, not negative).
{
  const stream = ids(500, 3, 65535);
  const table = new arrow.Table({token: arrow.vectorFromArray(stream, new arrow.Uint16())});
  writeStream("plain_uint16", [table], stream, "stream");
}

// 5. Text as `datasets` keeps it (a string column beside an id), two record batches, with an
//    empty document, a null row (no document) and non-ASCII text; NAME.json holds the documents.
//    text_ab: documents a tokenizer of a, b and space reads (client/tokenize_files_test).
function writeText(name, batches) {
  const tables = batches.map((docs, b) => new arrow.Table({
    id: arrow.vectorFromArray(docs.map((d, i) => b * 100 + i), new arrow.Int32()),
    text: arrow.vectorFromArray(docs, new arrow.Utf8()),
  }));
  let table = tables[0];
  for (const t of tables.slice(1)) table = table.concat(t);
  fs.writeFileSync(path.join(out, name + ".arrow"), arrow.tableToIPC(table, "stream"));
  fs.writeFileSync(path.join(out, name + ".json"),
                   JSON.stringify(batches.flat().filter((d) => d !== null)));
}
writeText("text_stream", [["The cat sat.", "", null, "naïve café 日本語 😀"],
                          ["second batch", null, "line\nbreak\tand tab"]]);
writeText("text_ab", [["ab a", null], ["b", "abab"]]);

// 4. A null id inside a list: refused, never made up.
{
  const rows = rowsOf(3, 8, 4, 1000);
  rows[1][3] = null;
  writeStream("null_id", [new arrow.Table({input_ids: column(rows, new arrow.Int32(), list)})], [],
              "stream");
}
