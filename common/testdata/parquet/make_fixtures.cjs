// Writes the Parquet token files engine/token_source_test reads, with arrow-rs's Parquet writer
// (the parquet-wasm build), so the reader is checked against an independent implementation:
//
//   npm install parquet-wasm@0.6.1 apache-arrow@17 hyparquet-writer@0.17.0
//   NODE_PATH=$PWD/node_modules node common/testdata/parquet/make_fixtures.cjs common/testdata/parquet
//
// and one file with hyparquet-writer (an independent writer, and one that records null_count 0
// in its statistics, as pyarrow does, which lets the reader skip counting levels on open).
//
// Each NAME.parquet of token ids comes with NAME.u32: the token stream it holds (every list of
// the chosen column in row order, concatenated), as raw little-endian uint32; each text_*.parquet
// with NAME.json, the documents of its "text" column in row order (null rows left out).
const fs = require("fs");
const path = require("path");
const arrow = require("apache-arrow");
const pq = require("parquet-wasm");

const out = process.argv[2];

// Token ids with repeats (a dictionary helps) and a long tail (it overflows and falls back).
function ids(n, seed, vocab) {
  const v = new Array(n);
  let x = seed >>> 0;
  for (let i = 0; i < n; ++i) {
    x = (Math.imul(x, 1664525) + 1013904223) >>> 0;
    v[i] = i % 3 == 0 ? (x >>> 8) % vocab : (x >>> 8) % 97;
  }
  return v;
}

function listColumn(rows, type) {
  const builder = arrow.makeBuilder({type: new arrow.List(new arrow.Field("item", type, true)),
                                     nullValues: [null]});
  const wide = type instanceof arrow.Int64;
  for (const r of rows) builder.append(wide && r ? r.map((v) => (v === null ? null : BigInt(v))) : r);
  return builder.finish().toVector();
}

function write(name, table, props, stream) {
  const wasmTable = pq.Table.fromIPCStream(arrow.tableToIPC(table, "stream"));
  fs.writeFileSync(path.join(out, name + ".parquet"), pq.writeParquet(wasmTable, props));
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

// 1. What pyarrow and Hugging Face write by default: SNAPPY, dictionary-encoded v1 pages (the
//    dictionary overflows and later pages fall back to PLAIN), several row groups and pages, a
//    string column before the tokens, an empty and a null list mid-way (they hold no tokens).
{
  const rows = rowsOf(48, 128, 1, 50257);
  rows[7] = [];
  rows[20] = null;
  const stream = rows.filter((r) => r).flat();
  const text = arrow.vectorFromArray(rows.map((r, i) => `document ${i}`), new arrow.Utf8());
  const table = new arrow.Table({text, input_ids: listColumn(rows, new arrow.Int32())});
  const props = new pq.WriterPropertiesBuilder()
                    .setCompression(pq.Compression.SNAPPY)
                    .setDictionaryEnabled(true)
                    .setDictionaryPageSizeLimit(2048)
                    .setDataPageSizeLimit(4096)
                    .setWriteBatchSize(256)
                    .setMaxRowGroupSize(20)
                    .build();
  write("snappy_dictionary", table, props, stream);
}

// 2. ZSTD, v2 data pages, int64 ids, DELTA_BINARY_PACKED, no dictionary, column "tokens".
{
  const rows = rowsOf(24, 100, 2, 151936);
  const table = new arrow.Table({tokens: listColumn(rows, new arrow.Int64())});
  const props = new pq.WriterPropertiesBuilder()
                    .setWriterVersion(pq.WriterVersion.V2)
                    .setCompression(pq.Compression.ZSTD)
                    .setDictionaryEnabled(false)
                    .setEncoding(pq.Encoding.DELTA_BINARY_PACKED)
                    .setDataPageSizeLimit(2048)
                    .setWriteBatchSize(128)
                    .build();
  write("zstd_v2_delta", table, props, rows.flat());
}

// 3. GZIP, one non-null int32 id per row (a flat column), PLAIN.
{
  const stream = ids(3000, 3, 32000);
  const table = new arrow.Table({input_ids: arrow.vectorFromArray(stream, new arrow.Int32())});
  const props = new pq.WriterPropertiesBuilder()
                    .setCompression(pq.Compression.GZIP)
                    .setDictionaryEnabled(false)
                    .setDataPageSizeLimit(2048)
                    .setWriteBatchSize(256)
                    .build();
  write("gzip_flat", table, props, stream);
}

// 4. LZ4_RAW, uint16 ids (INT32 annotated unsigned 16-bit), ids above 32767 included.
{
  const rows = rowsOf(16, 64, 4, 65535);
  const table = new arrow.Table({input_ids: listColumn(rows, new arrow.Uint16())});
  const props = new pq.WriterPropertiesBuilder()
                    .setCompression(pq.Compression.LZ4_RAW)
                    .setDictionaryEnabled(true)
                    .build();
  write("lz4_uint16", table, props, rows.flat());
}

// 6. hyparquet-writer: SNAPPY PLAIN v1 pages whose statistics say null_count 0; the list's
//    element is named "element" (the Parquet spec's name; arrow-rs says "item").
(async () => {
  const {ByteWriter, parquetWrite} = await import(require("path").join(
      process.env.NODE_PATH, "hyparquet-writer/src/index.js"));
  const rows = rowsOf(12, 50, 6, 50257);
  const writer = new ByteWriter();
  parquetWrite({
    writer,
    columnData: [{name: "input_ids", data: rows}],
    schema: [{name: "root", num_children: 1},
             {name: "input_ids", repetition_type: "OPTIONAL", num_children: 1,
              converted_type: "LIST"},
             {name: "list", repetition_type: "REPEATED", num_children: 1},
             {name: "element", type: "INT32", repetition_type: "OPTIONAL"}],
  });
  fs.writeFileSync(path.join(out, "hyparquet_statistics.parquet"),
                   Buffer.from(writer.getBuffer()));
  const raw = Buffer.alloc(rows.flat().length * 4);
  rows.flat().forEach((v, i) => raw.writeUInt32LE(v, i * 4));
  fs.writeFileSync(path.join(out, "hyparquet_statistics.u32"), raw);
})();

// Text columns, for latentctl tokenize: documents with repeats (dictionary pages), unicode,
// an empty one and a null row (no document). NAME.json holds the documents a reader must see.
function texts(n, seed) {
  const words = ["the", "cat", "sat", "on", "mat", "naïve", "café", "日本語", "😀", "Ελληνικά",
                 "https://example.com/a/b", "\n", "\t", "don't"];
  const out = [];
  let x = seed >>> 0;
  for (let i = 0; i < n; ++i) {
    x = (Math.imul(x, 1664525) + 1013904223) >>> 0;
    if (x % 5 == 0) {  // a repeated document
      out.push("boilerplate footer " + (x % 3));
      continue;
    }
    const len = 1 + (x >>> 8) % 60;
    const doc = [];
    for (let w = 0; w < len; ++w) {
      x = (Math.imul(x, 1664525) + 1013904223) >>> 0;
      doc.push(words[(x >>> 8) % words.length]);
    }
    out.push(doc.join(" "));
  }
  return out;
}

function writeText(name, docs, props) {
  const table = new arrow.Table({
    id: arrow.vectorFromArray(docs.map((d, i) => i), new arrow.Int32()),
    text: arrow.vectorFromArray(docs, new arrow.Utf8()),
  });
  const wasmTable = pq.Table.fromIPCStream(arrow.tableToIPC(table, "stream"));
  fs.writeFileSync(path.join(out, name + ".parquet"), pq.writeParquet(wasmTable, props));
  fs.writeFileSync(path.join(out, name + ".json"),
                   JSON.stringify(docs.filter((d) => d !== null)));
}

// 7. Text as pyarrow writes it: SNAPPY, dictionary v1 pages falling back to PLAIN, several row
//    groups, an empty document and a null row.
{
  const docs = texts(400, 7);
  docs[10] = "";
  docs[11] = null;
  writeText("text_snappy_dictionary", docs,
            new pq.WriterPropertiesBuilder()
                .setCompression(pq.Compression.SNAPPY)
                .setDictionaryPageSizeLimit(1024)
                .setDataPageSizeLimit(4096)
                .setWriteBatchSize(64)
                .setMaxRowGroupSize(150)
                .build());
}

// 8. ZSTD v2 pages, DELTA_LENGTH_BYTE_ARRAY; 9. GZIP v1 pages, DELTA_BYTE_ARRAY (prefixes).
{
  const docs = texts(200, 8);
  docs[3] = null;
  writeText("text_zstd_v2_delta_length", docs,
            new pq.WriterPropertiesBuilder()
                .setWriterVersion(pq.WriterVersion.V2)
                .setCompression(pq.Compression.ZSTD)
                .setDictionaryEnabled(false)
                .setColumnEncoding("text", pq.Encoding.DELTA_LENGTH_BYTE_ARRAY)
                .setDataPageSizeLimit(2048)
                .setWriteBatchSize(64)
                .build());
  const urls = texts(200, 9).map((d, i) => "https://example.com/" + (i % 7) + "/" + d);
  writeText("text_gzip_delta_byte_array", urls,
            new pq.WriterPropertiesBuilder()
                .setCompression(pq.Compression.GZIP)
                .setDictionaryEnabled(false)
                .setColumnEncoding("text", pq.Encoding.DELTA_BYTE_ARRAY)
                .setDataPageSizeLimit(2048)
                .setWriteBatchSize(64)
                .build());
}

// 10. Documents a tokenizer of a, b and space can read (client/tokenize_files_test).
writeText("text_ab", ["ab a", null, "b", "abab"],
          new pq.WriterPropertiesBuilder().setCompression(pq.Compression.SNAPPY).build());

// 5. Uncompressed, a null id inside a list: a reader must refuse it, not invent a token.
{
  const rows = rowsOf(4, 16, 5, 1000);
  rows[2][5] = null;
  const table = new arrow.Table({input_ids: listColumn(rows, new arrow.Int32())});
  const props = new pq.WriterPropertiesBuilder()
                    .setCompression(pq.Compression.UNCOMPRESSED)
                    .build();
  write("null_id", table, props, []);
}
