// Chunk store benchmark on the X1 shape (k = 32, d_sae = 4096, fp16, 128-row sequences).
//
//   bazel build -c opt //bench:storage_bench
//   bazel-bin/bench/storage_bench [rows=1048576] [configs=f3,f2] [threads=0] [chunk=4096]
//                                 [slices=32] [reads=1] [commit=16384] [width=4096]
//
// configs: a comma-separated list, each run on a fresh database in this one process, so their
// figures compare side by side:
//   f3         format 3 (latent-sliced chunks, the default layout)
//   f2         format 2 with postings (row-major chunks + a latent-major copy of every value)
//   f2nopost   format 2 without postings (row-major only: no latent-major reads)
//   f3cN       format 3 with N-row chunks (e.g. f3c1024), for the chunk-size trade-off
//   f3bN[n]    format 3 with N KiB SST blocks in the chunk family (default 64); n: uncompressed
//   f3sync     format 3 committing with Commit() (every config above uses CommitAsync(), as
//              EXTRACT does: the next commit is encoded while the previous one is written)
//   f3wide     format 3 with a writer that keeps no per-latent state (what widths above
//              ChunkStoreOptions::resident_latent_state_max_width get), f3resident with one
//              that keeps all of it, whatever the width
// For each: bytes per token on disk after compaction (whole database: keys, metadata, token ids)
// against the 128 B fixed-k u16 + fp16 layout and the ~100 B floor; commit wall and process CPU
// against two raw baselines in the same run (synced WriteBatches, same number of commits; every
// write, the store's and the baselines', is the better of two runs on fresh databases):
//   raw-same   the store's own final key/value bytes (the encoding and indexing cost alone);
//   raw-rows   the rows as a user would Put them without this store: per 1024-row chunk the
//              fixed-k u16 indices (u32 above 65536 latents) + fp16 values + u16 token ids
//              (128 + 2 B/token at X1), no index;
// then ReadRows (1024 rows), RowLatents, GetLatent (stats + top-20 with 32/8 context),
// LatentPostings and ListLatents (the whole SAE ranked) latency percentiles; LatentsOnRows
// (what fires with a latent, on a token; on the machine's threads) against the single-threaded
// rescan a user does without it.
// Rows are synthetic: latents drawn from a Zipf-like distribution, exponential values, Zipf(1.1)
// token ids; the extraction workload's own figures come from the EXTRACT benchmark.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <limits>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "common/process_memory.h"
#include "storage/chunk_store.h"
#include "storage/export.h"
#include "storage/latent_overview.h"
#include "storage/latents_on_rows.h"
#include "storage/value_codec.h"

using latentd::storage::ChunkStore;
using latentd::storage::ChunkStoreOptions;
using latentd::storage::Db;
using latentd::storage::Family;
using Clock = std::chrono::steady_clock;

namespace {

// CPU seconds of the whole process (RocksDB's background threads included): less sensitive than
// wall time to other work on a shared machine.
double CpuSeconds() {
  timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

struct Percentiles {
  double p50 = 0, p99 = 0;
};
Percentiles Summarize(std::vector<double> us) {
  if (us.empty()) return {};
  std::sort(us.begin(), us.end());
  return {us[us.size() / 2], us[std::min(us.size() - 1, us.size() * 99 / 100)]};
}

void Check(const absl::Status& s) {
  if (!s.ok()) {
    std::fprintf(stderr, "%s\n", s.ToString().c_str());
    std::exit(1);
  }
}

constexpr int32_t kK = 32;
int32_t g_width = 4096;         // d_sae: the width= argument (X1's 4096; wide SAEs reach 1M)
int64_t g_commit_rows = 16384;  // rows per commit: the commit= argument (EXTRACT's default)

struct Rows {
  std::vector<int64_t> indptr{0};
  std::vector<int32_t> indices, tokens;
  std::vector<float> values;
};

Rows MakeRows(int64_t rows) {
  std::mt19937_64 rng(42);
  std::vector<double> latent_weight(g_width), token_weight(4096);
  for (int j = 0; j < g_width; ++j) latent_weight[j] = 1.0 / std::pow(j + 10.0, 0.8);
  std::shuffle(latent_weight.begin(), latent_weight.end(), rng);
  for (int t = 0; t < 4096; ++t) token_weight[t] = 1.0 / std::pow(t + 1.0, 1.1);
  std::discrete_distribution<int32_t> pick_latent(latent_weight.begin(), latent_weight.end());
  std::discrete_distribution<int32_t> pick_token(token_weight.begin(), token_weight.end());
  std::exponential_distribution<float> value(1.0f);
  Rows out;
  out.indices.reserve(rows * kK);
  out.values.reserve(rows * kK);
  for (int64_t r = 0; r < rows; ++r) {
    std::set<int32_t> cols;
    while (static_cast<int>(cols.size()) < kK) cols.insert(pick_latent(rng));
    for (int32_t c : cols) {
      out.indices.push_back(c);
      out.values.push_back(0.05f + value(rng));
    }
    out.indptr.push_back(static_cast<int64_t>(out.indices.size()));
    out.tokens.push_back(pick_token(rng));
  }
  return out;
}

struct Kv {
  Family family;
  std::string key, value;
};

struct RawResult {
  double wall = 1e30, cpu = 1e30;
  uint64_t bytes = 0;
};

// Writes `batches` (each one synced WriteBatch) into a fresh database; the better of two runs.
RawResult WriteRaw(const std::string& dir, const std::vector<std::vector<Kv>>& batches) {
  RawResult out;
  for (const auto& b : batches) {
    for (const Kv& kv : b) out.bytes += kv.key.size() + kv.value.size();
  }
  for (int trial = 0; trial < 2; ++trial) {
    std::system(("rm -rf '" + dir + "'").c_str());
    auto raw_or = Db::Open(dir);
    Check(raw_or.status());
    std::unique_ptr<Db> raw = *std::move(raw_or);
    const auto t0 = Clock::now();
    const double c0 = CpuSeconds();
    rocksdb::WriteBatch batch;
    for (const auto& b : batches) {
      batch.Clear();
      for (const Kv& kv : b) batch.Put(raw->handle(kv.family), kv.key, kv.value);
      Check(raw->Write(&batch, /*sync=*/true));
    }
    out.wall = std::min(out.wall, Seconds(t0, Clock::now()));
    out.cpu = std::min(out.cpu, CpuSeconds() - c0);
  }
  std::system(("rm -rf '" + dir + "'").c_str());
  return out;
}

// The rows as plain fixed-k records: per 1024-row chunk, u16 indices, fp16 values, u16 tokens.
std::vector<std::vector<Kv>> PlainRowBatches(const Rows& rows, int64_t n) {
  std::vector<std::vector<Kv>> batches;
  for (int64_t at = 0; at < n; at += g_commit_rows) {
    batches.emplace_back();
    const int64_t end = std::min(n, at + g_commit_rows);
    for (int64_t c = at; c < end; c += 1024) {
      const int64_t stop = std::min(end, c + 1024);
      Kv kv{Family::kChunks, std::string(16, '\0'), std::string()};
      std::memcpy(&kv.key[8], &c, 8);
      for (int64_t r = c; r < stop; ++r) {
        for (int64_t i = rows.indptr[r]; i < rows.indptr[r + 1]; ++i) {
          const uint32_t idx = static_cast<uint32_t>(rows.indices[i]);  // little-endian
          const uint16_t h = latentd::storage::FloatToHalf(rows.values[i]);
          kv.value.append(reinterpret_cast<const char*>(&idx), g_width <= 65536 ? 2 : 4);
          kv.value.append(reinterpret_cast<const char*>(&h), 2);
        }
        const uint16_t t = static_cast<uint16_t>(rows.tokens[r]);
        kv.value.append(reinterpret_cast<const char*>(&t), 2);
      }
      batches.back().push_back(std::move(kv));
    }
  }
  return batches;
}

struct Config {
  std::string name;
  uint32_t format = 3;
  bool postings = true;
  int64_t chunk_rows = 4096;
  size_t block_bytes = 64 << 10;
  bool compress = true;
  bool async = true;  // CommitAsync (as EXTRACT commits) or Commit
  int32_t resident_max_width = ChunkStoreOptions().resident_latent_state_max_width;
};

// The export formats storage_bench measures, as ExportDataset writes them (delphi: its 5 files).
constexpr struct {
  latentd::storage::ExportFormat format;
  const char* name;
} kExportFormats[4] = {{latentd::storage::ExportFormat::kNpz, "npz"},
                       {latentd::storage::ExportFormat::kHdf5, "HDF5"},
                       {latentd::storage::ExportFormat::kParquet, "Parquet"},
                       {latentd::storage::ExportFormat::kDelphi, "delphi"}};

struct Result {
  Config config;
  uint64_t disk = 0;
  uint64_t family_disk[latentd::storage::kNumFamilies] = {};  // the same, by column family
  int64_t info_bytes = 0;
  double store_wall = 0, store_cpu = 0;
  int64_t write_peak_growth = 0;  // bytes (the larger of the two writes)
  RawResult raw_same, raw_rows;
  Percentiles read, row, latent, post;
  Percentiles top_sequences;  // GetLatent with distinct_sequences: top-20 sequences, 32/8
  Percentiles latent_fresh;   // GetLatent before compaction
  // ListLatents over the whole SAE (SummarizeLatents: MOST_FREQUENT, a page of 100), against
  // what a dashboard does without it: one GetLatentStats per latent, in the same run.
  Percentiles overview;
  double stats_one_by_one_ms = 0;
  // LatentsOnRows for random latents and for tokens of ranks 1, 10, 100 and 1000 (ids 0, 9, 99,
  // 999 of the Zipf draw), against one pass over every row counting the latents on a token's
  // rows (what a user without it does).
  Percentiles cofiring, on_token;
  Percentiles cofiring_f1;  // the same latents' co-firing ranked by F1 (every statistics block)
  // LatentsOnRows over rows a user names: 64 spans of 128 rows at random places (8192 rows,
  // all counted), ranked by lift.
  Percentiles on_spans;
  Percentiles contrast;   // the same against 64 other spans (ContrastRowSpans, by difference)
  Percentiles tokens_of;  // GetLatent's top_tokens: the 20 tokens a random latent fires on most
  // GetLatent's top_tokens and positions together: two reads of the firings, against one
  // (ProfileLatent), alternating on the same latents.
  Percentiles tokens_positions_apart, tokens_positions_together;
  Percentiles silent;  // GetLatent's silent windows: 20 of a random latent, 32/8 context
  double rescan_ms = 0;
  double delete_s = 0;             // DeleteDataset, its compaction included
  uint64_t disk_after_delete = 0;  // bytes on disk once it returned
  // Whole-dataset exports (format 3) in kExportFormats' order: time, size written, and how far
  // the process's peak RSS rose above its RSS before.
  struct ExportFigures {
    double seconds = 0;
    int64_t bytes = 0, peak_growth = 0;
  } exports[4];
};

// One timed write of `rows` into a fresh store at `dir`, committing every g_commit_rows rows as
// `config` says; the store stays open for the reads.
struct StoreRun {
  std::unique_ptr<Db> db;
  std::unique_ptr<ChunkStore> store;  // declared after db: destroyed first
  uint64_t id = 0;
  int64_t commits = 0;
  double wall = 0, cpu = 0;
  int64_t peak_growth = 0;  // the write's peak RSS above the RSS before the writer opened
};

StoreRun WriteStore(const std::string& dir, const Config& config, const Rows& rows, int64_t n,
                    int threads, int slices) {
  StoreRun run;
  std::system(("rm -rf '" + dir + "'").c_str());
  latentd::storage::DbOptions db_options;
  db_options.chunk_block_bytes = config.block_bytes;
  db_options.compress_chunks = config.compress;
  auto db_or = Db::Open(dir, db_options);
  Check(db_or.status());
  run.db = *std::move(db_or);
  ChunkStoreOptions options;
  options.record_version = config.format;
  options.sparse_chunk_rows = config.chunk_rows;
  options.latent_slices = slices;
  options.commit_threads = threads;
  options.resident_latent_state_max_width = config.resident_max_width;
  run.store = std::make_unique<ChunkStore>(run.db.get(), options);
  latentd::storage::DatasetMeta meta;
  meta.name = "x1";
  meta.width = g_width;
  meta.k = kK;
  meta.encoder = "topk";
  meta.hook_name = "blocks.2.hook_resid_post";
  meta.context_length = 128;
  meta.postings = config.postings;
  auto id_or = run.store->CreateDataset(meta);
  Check(id_or.status());
  run.id = *id_or;
  latentd::ResetProcessPeakRss();
  const int64_t rss_before = latentd::ProcessRssBytes();
  auto writer = run.store->OpenWriter(run.id);
  Check(writer.status());
  const auto t0 = Clock::now();
  const double c0 = CpuSeconds();
  std::vector<int64_t> local;
  for (int64_t at = 0; at < n; at += g_commit_rows) {
    const int64_t m = std::min(g_commit_rows, n - at);
    local.assign(rows.indptr.begin() + at, rows.indptr.begin() + at + m + 1);
    for (int64_t& v : local) v -= rows.indptr[at];
    Check((*writer)->AppendSparse(m, local.data(), rows.indices.data() + rows.indptr[at],
                                  rows.values.data() + rows.indptr[at], rows.tokens.data() + at));
    Check(config.async ? (*writer)->CommitAsync() : (*writer)->Commit());
    ++run.commits;
  }
  Check((*writer)->WaitDurable());
  run.wall = Seconds(t0, Clock::now());
  run.cpu = CpuSeconds() - c0;
  run.peak_growth = latentd::ProcessPeakRssBytes() - rss_before;
  return run;
}

Result RunConfig(const std::string& base, const Config& config, const Rows& rows, int64_t n,
                 int threads, int slices, bool measure_reads) {
  Result res;
  res.config = config;
  const std::string dir = base + "/" + config.name;
  std::system(("rm -rf '" + dir + "' && mkdir -p '" + dir + "'").c_str());
  // The better of two writes, each into a fresh database, as WriteRaw times its baselines: the
  // first write also pays for reading the 268 MB of input rows from memory last touched while
  // they were generated (on this VM nearly as slow as a page fault: 0.2-0.4 s), which EXTRACT,
  // handing the store rows fresh from the encoder, never pays. The reads use the second.
  StoreRun run;
  res.store_wall = res.store_cpu = 1e30;
  for (int trial = 0; trial < 2; ++trial) {
    run.store.reset();  // the previous trial's store closes before its database
    run.db.reset();
    run = WriteStore(dir + "/store", config, rows, n, threads, slices);
    res.store_wall = std::min(res.store_wall, run.wall);
    res.store_cpu = std::min(res.store_cpu, run.cpu);
    res.write_peak_growth = std::max(res.write_peak_growth, run.peak_growth);
  }
  Db* db = run.db.get();
  ChunkStore& store = *run.store;
  const uint64_t id = run.id;
  const int64_t commits = run.commits;
  // What GetLatent reads: statistics, then the top 20 rows with 32/8 tokens of context.
  auto get_latent_us = [&](int32_t latent) {
    const auto a = Clock::now();
    Check(store.GetLatentStats(id, latent).status());
    Check(store.TopActivations(id, latent, 20, 32, 8).status());
    return Seconds(a, Clock::now()) * 1e6;
  };
  // Right after the last commit, before any compaction: top-N blocks are then still the stored
  // block plus the merge operands of recent commits, which every read folds.
  std::vector<double> fresh_us;
  std::mt19937 frng(11);
  for (int i = 0; i < (measure_reads ? 200 : 0); ++i) {
    fresh_us.push_back(get_latent_us(static_cast<int32_t>(frng() % g_width)));
  }
  res.latent_fresh = Summarize(fresh_us);
  Check(db->CompactAll());
  res.disk = *db->BytesOnDisk();
  for (int f = 0; f < latentd::storage::kNumFamilies; ++f) {
    res.family_disk[f] = db->BytesOnDisk(static_cast<Family>(f));
  }
  res.info_bytes = store.GetDataset(id)->bytes_on_disk();

  // raw-same: the store's final key/values, spread evenly over the same number of batches.
  {
    std::vector<std::vector<Kv>> batches(commits);
    size_t i = 0;
    for (Family f : {Family::kChunks, Family::kPostings, Family::kLatentIndex, Family::kMeta}) {
      auto it = db->NewIterator(f);
      for (it->SeekToFirst(); it->Valid(); it->Next(), ++i) {
        batches[i % commits].push_back({f, it->key().ToString(), it->value().ToString()});
      }
    }
    res.raw_same = WriteRaw(dir + "/raw", batches);
  }
  res.raw_rows = WriteRaw(dir + "/raw", PlainRowBatches(rows, n));

  std::mt19937 qrng(7);
  std::vector<double> read_us, row_us, latent_us, post_us, sequences_us;
  const bool has_postings = config.format >= 3 || config.postings;
  for (int i = 0; i < (measure_reads ? 200 : 0); ++i) {
    const int64_t start = qrng() % std::max<int64_t>(1, n - 1024);
    auto a = Clock::now();
    Check(store.ReadRows(id, start, std::min<int64_t>(1024, n)).status());
    read_us.push_back(Seconds(a, Clock::now()) * 1e6);
    a = Clock::now();
    Check(store.RowLatents(id, qrng() % n).status());
    row_us.push_back(Seconds(a, Clock::now()) * 1e6);
    const int32_t latent = qrng() % g_width;
    latent_us.push_back(get_latent_us(latent));
    if (has_postings) {
      std::vector<int64_t> prow;
      std::vector<float> pval;
      a = Clock::now();
      Check(store.LatentPostings(id, latent, &prow, &pval));
      post_us.push_back(Seconds(a, Clock::now()) * 1e6);
      a = Clock::now();
      Check(store.TopSequences(id, latent, 20, 32, 8).status());
      sequences_us.push_back(Seconds(a, Clock::now()) * 1e6);
    }
  }
  if (measure_reads && config.format >= 3) {
    // The whole dataset exported as scipy .npz, HDF5, Parquet and delphi's latent cache (its 5
    // files), as ExportDataset writes them.
    for (int f = 0; f < 4; ++f) {
      const auto format = kExportFormats[f].format;
      const bool delphi = format == latentd::storage::ExportFormat::kDelphi;  // a directory
      const int64_t rss_before = latentd::ProcessRssBytes();
      latentd::ResetProcessPeakRss();
      const auto a = Clock::now();
      auto exported = latentd::storage::ExportDataset(store, id, 0, 0, format,
                                                      dir + (delphi ? "/latents" : "/export"));
      Check(exported.status());
      res.exports[f].seconds = Seconds(a, Clock::now());
      res.exports[f].bytes = exported->bytes;
      res.exports[f].peak_growth = latentd::ProcessPeakRssBytes() - rss_before;
    }
  }
  if (measure_reads) {
    std::vector<double> overview_us;
    latentd::storage::LatentOverviewOptions overview;
    overview.order = latentd::storage::LatentOrder::kMostFrequent;
    for (int i = 0; i < 20; ++i) {
      const auto a = Clock::now();
      Check(latentd::storage::SummarizeLatents(store, id, overview).status());
      overview_us.push_back(Seconds(a, Clock::now()) * 1e6);
    }
    res.overview = Summarize(overview_us);
    const auto a = Clock::now();
    for (int32_t l = 0; l < g_width; ++l) Check(store.GetLatentStats(id, l).status());
    res.stats_one_by_one_ms = Seconds(a, Clock::now()) * 1e3;
    std::vector<double> cofiring_us, cofiring_f1_us, token_us, tokens_of_us, apart_us, together_us,
        silent_us;
    latentd::storage::LatentsOnRowsOptions by_f1;
    by_f1.order = latentd::storage::LatentsOnRowsOrder::kByF1;
    for (int i = 0; i < 20; ++i) {
      const int32_t latent = qrng() % g_width;
      // By count and by F1, which goes first alternating (the second finds the chunks cached).
      for (int order = 0; order < 2; ++order) {
        const bool f1 = (order == 0) == (i % 2 == 0);
        const auto b = Clock::now();
        Check(latentd::storage::LatentsFiringWith(
                  store, id, latent, f1 ? by_f1 : latentd::storage::LatentsOnRowsOptions())
                  .status());
        (f1 ? cofiring_f1_us : cofiring_us).push_back(Seconds(b, Clock::now()) * 1e6);
      }
      const auto t = Clock::now();
      Check(latentd::storage::TokensLatentFiresOn(store, id, latent, 20).status());
      tokens_of_us.push_back(Seconds(t, Clock::now()) * 1e6);
      const auto q = Clock::now();
      Check(store.SilentSamples(id, latent, 20, 32, 8, /*seed=*/i).status());
      silent_us.push_back(Seconds(q, Clock::now()) * 1e6);
      // Which goes first alternates, so neither always finds the other's blocks cached.
      for (int order = 0; order < 2; ++order) {
        if ((order == 0) == (i % 2 == 0)) {
          const auto p = Clock::now();
          Check(latentd::storage::TokensLatentFiresOn(store, id, latent, 20).status());
          Check(latentd::storage::PositionsLatentFiresAt(store, id, latent).status());
          apart_us.push_back(Seconds(p, Clock::now()) * 1e6);
        } else {
          const auto q = Clock::now();
          Check(latentd::storage::ProfileLatent(store, id, latent, 20, true).status());
          together_us.push_back(Seconds(q, Clock::now()) * 1e6);
        }
      }
    }
    for (int32_t token : {0, 9, 99, 999}) {
      const auto b = Clock::now();
      Check(latentd::storage::LatentsFiringOnToken(store, id, token, {}).status());
      token_us.push_back(Seconds(b, Clock::now()) * 1e6);
    }
    std::vector<double> spans_us, contrast_us;
    // 64 spans of 128 rows at random places, ascending.
    auto random_spans = [&] {
      std::vector<int64_t> starts;
      for (int s = 0; s < 64; ++s) starts.push_back(qrng() % (n / 128) * 128);
      std::sort(starts.begin(), starts.end());
      starts.erase(std::unique(starts.begin(), starts.end()), starts.end());
      std::vector<latentd::storage::RowSpan> spans;
      for (int64_t start : starts) spans.push_back({start, 128});
      return spans;
    };
    for (int i = 0; i < 10 && n >= 64 * 128; ++i) {
      const std::vector<latentd::storage::RowSpan> spans = random_spans();
      latentd::storage::LatentsOnRowsOptions options;
      options.order = latentd::storage::LatentsOnRowsOrder::kByLift;
      options.max_rows = latentd::storage::kMaxRowsOnRows;
      const auto b = Clock::now();
      Check(latentd::storage::LatentsInRowSpans(store, id, spans, options).status());
      spans_us.push_back(Seconds(b, Clock::now()) * 1e6);
      options.order = latentd::storage::LatentsOnRowsOrder::kByDifference;
      const std::vector<latentd::storage::RowSpan> versus = random_spans();
      const auto v = Clock::now();
      Check(latentd::storage::ContrastRowSpans(store, id, spans, versus, options).status());
      contrast_us.push_back(Seconds(v, Clock::now()) * 1e6);
    }
    res.cofiring = Summarize(cofiring_us);
    res.cofiring_f1 = Summarize(cofiring_f1_us);
    res.on_token = Summarize(token_us);
    res.on_spans = Summarize(spans_us);
    res.contrast = Summarize(contrast_us);
    res.tokens_of = Summarize(tokens_of_us);
    res.silent = Summarize(silent_us);
    res.tokens_positions_apart = Summarize(apart_us);
    res.tokens_positions_together = Summarize(together_us);
    const auto c = Clock::now();
    std::vector<int64_t> counts(g_width, 0);
    for (int64_t start = 0; start < n; start += 65536) {
      auto csr = store.ReadRows(id, start, std::min<int64_t>(65536, n - start));
      Check(csr.status());
      for (int64_t r = 0; r < csr->num_rows; ++r) {
        if (csr->token_ids[r] != 9) continue;
        for (int64_t e = csr->indptr[r]; e < csr->indptr[r + 1]; ++e) ++counts[csr->indices[e]];
      }
    }
    res.rescan_ms = Seconds(c, Clock::now()) * 1e3;
  }
  res.read = Summarize(read_us);
  res.row = Summarize(row_us);
  res.latent = Summarize(latent_us);
  res.post = Summarize(post_us);
  res.top_sequences = Summarize(sequences_us);
  {
    const auto a = Clock::now();
    Check(store.DeleteDataset(id));
    res.delete_s = Seconds(a, Clock::now());
    res.disk_after_delete = *db->BytesOnDisk();
  }
  run.store.reset();
  run.db.reset();
  std::system(("rm -rf '" + dir + "'").c_str());
  return res;
}

std::string Arg(int argc, char** argv, const char* name, const char* fallback) {
  const std::string prefix = std::string(name) + "=";
  for (int i = 1; i < argc; ++i) {
    if (std::strncmp(argv[i], prefix.c_str(), prefix.size()) == 0) return argv[i] + prefix.size();
  }
  return fallback;
}

}  // namespace

int main(int argc, char** argv) {
  const int64_t n = std::atoll(Arg(argc, argv, "rows", "1048576").c_str());
  const int threads = std::atoi(Arg(argc, argv, "threads", "0").c_str());
  const int64_t chunk = std::atoll(Arg(argc, argv, "chunk", "4096").c_str());
  const int slices = std::atoi(Arg(argc, argv, "slices", "32").c_str());
  const bool reads = Arg(argc, argv, "reads", "1") != "0";
  g_width = std::max(kK, std::atoi(Arg(argc, argv, "width", "4096").c_str()));
  g_commit_rows = std::max<int64_t>(1, std::atoll(Arg(argc, argv, "commit", "16384").c_str()));
  std::vector<Config> configs;
  {
    const std::string list = Arg(argc, argv, "configs", "f3,f2");
    size_t at = 0;
    while (at <= list.size()) {
      const size_t comma = std::min(list.find(',', at), list.size());
      const std::string name = list.substr(at, comma - at);
      at = comma + 1;
      if (name.empty()) continue;
      Config c{name, 3, true, chunk};
      if (name == "f2") {
        c.format = 2;
      } else if (name == "f2nopost") {
        c.format = 2;
        c.postings = false;
      } else if (name == "f3sync" || name == "f2sync") {
        c.format = name[1] - '0';
        c.async = false;
      } else if (name == "f3wide") {
        c.resident_max_width = 0;
      } else if (name == "f3resident") {
        c.resident_max_width = std::numeric_limits<int32_t>::max();
      } else if (name.rfind("f3c", 0) == 0) {
        c.chunk_rows = std::atoll(name.c_str() + 3);
      } else if (name.rfind("f3b", 0) == 0) {
        c.block_bytes = std::atoll(name.c_str() + 3) << 10;
        c.compress = name.back() != 'n';
      } else if (name != "f3") {
        std::fprintf(stderr, "unknown config %s\n", name.c_str());
        return 2;
      }
      configs.push_back(c);
    }
  }
  const std::string base = std::string(std::getenv("TMPDIR") ? std::getenv("TMPDIR") : "/tmp") +
                           "/latentd_storage_bench";
  std::system(("mkdir -p '" + base + "'").c_str());
  const Rows rows = MakeRows(n);

  std::printf("rows %lld, k %d, d_sae %d, fp16, commits of %lld rows, latent slices %d\n",
              static_cast<long long>(n), kK, g_width, static_cast<long long>(g_commit_rows),
              slices);
  std::vector<Result> results;
  for (const Config& c : configs) {
    results.push_back(RunConfig(base, c, rows, n, threads, slices, reads));
    const Result& r = results.back();
    const double bpt = static_cast<double>(r.disk) / n;
    std::printf(
        "\n[%s] format %u%s, sparse chunks of %lld rows, %s commits\n"
        "  bytes on disk after compaction: %llu = %.1f B/token (x%.3f of 128 B, x%.3f of the "
        "100 B floor); dataset bytes_on_disk %lld\n"
        "  commit: store %.2f s wall (%.0f rows/s), %.2f s CPU, peak RSS +%.0f MB (writer, "
        "memtables, block cache)\n"
        "    raw-same (%llu B): %.2f s wall, %.2f s CPU -> store overhead %+.0f%% wall, %+.0f%% "
        "CPU\n"
        "    raw-rows (%llu B): %.2f s wall, %.2f s CPU -> store overhead %+.0f%% wall, %+.0f%% "
        "CPU\n"
        "  ReadRows(1024) p50 %.0f / p99 %.0f us; RowLatents p50 %.0f / p99 %.0f us\n"
        "  GetLatent(stats + top-20, 32/8 context) p50 %.0f / p99 %.0f us (before compaction: "
        "%.0f / %.0f us)\n",
        c.name.c_str(), c.format,
        c.format < 3 ? (c.postings ? " + postings" : ", no postings") : "",
        static_cast<long long>(c.format >= 3 ? c.chunk_rows : 1024), c.async ? "async" : "sync",
        static_cast<unsigned long long>(r.disk), bpt, bpt / 128, bpt / 100,
        static_cast<long long>(r.info_bytes), r.store_wall, n / r.store_wall, r.store_cpu,
        r.write_peak_growth / 1e6, static_cast<unsigned long long>(r.raw_same.bytes),
        r.raw_same.wall, r.raw_same.cpu, (r.store_wall / r.raw_same.wall - 1) * 100,
        (r.store_cpu / r.raw_same.cpu - 1) * 100, static_cast<unsigned long long>(r.raw_rows.bytes),
        r.raw_rows.wall, r.raw_rows.cpu, (r.store_wall / r.raw_rows.wall - 1) * 100,
        (r.store_cpu / r.raw_rows.cpu - 1) * 100, r.read.p50, r.read.p99, r.row.p50, r.row.p99,
        r.latent.p50, r.latent.p99, r.latent_fresh.p50, r.latent_fresh.p99);
    std::printf("  on disk by family (B/token):");
    for (int f = 0; f < latentd::storage::kNumFamilies; ++f) {
      if (r.family_disk[f] == 0) continue;
      std::printf(" %s %.1f", latentd::storage::FamilyName(static_cast<Family>(f)),
                  static_cast<double>(r.family_disk[f]) / n);
    }
    std::printf("\n");
    if (r.exports[0].seconds > 0) {
      std::printf("  export, whole dataset (time, size, peak RSS above the RSS before):");
      for (int f = 0; f < 4; ++f) {
        std::printf("%s %s %.2f s %.0f MB +%.0f MB", f > 0 ? "," : "", kExportFormats[f].name,
                    r.exports[f].seconds, r.exports[f].bytes / 1e6, r.exports[f].peak_growth / 1e6);
      }
      std::printf("\n");
    }
    if (r.overview.p50 > 0) {
      std::printf(
          "  ListLatents(whole SAE, by firing count, page of 100) p50 %.2f / p99 %.2f ms; "
          "GetLatentStats of every latent one by one %.1f ms (x%.1f)\n",
          r.overview.p50 / 1e3, r.overview.p99 / 1e3, r.stats_one_by_one_ms,
          r.stats_one_by_one_ms * 1e3 / r.overview.p50);
    }
    if (r.cofiring.p50 > 0) {
      std::printf(
          "  LatentsOnRows: with a latent p50 %.1f / p99 %.1f ms; on a token (ranks 1, 10, "
          "100, 1000) p50 %.1f / p99 %.1f ms; a rescan of every row for one token %.0f ms\n",
          r.cofiring.p50 / 1e3, r.cofiring.p99 / 1e3, r.on_token.p50 / 1e3, r.on_token.p99 / 1e3,
          r.rescan_ms);
      std::printf(
          "  ... with a latent ranked by F1 (precision needs every latent's firing count) p50 "
          "%.1f / p99 %.1f ms (x%.2f the count ranking's)\n",
          r.cofiring_f1.p50 / 1e3, r.cofiring_f1.p99 / 1e3, r.cofiring_f1.p50 / r.cofiring.p50);
      std::printf(
          "  LatentsOnRows on 64 named spans of 128 rows (8192 rows, all counted, by lift) "
          "p50 %.1f / p99 %.1f ms (x%.1f faster than the rescan)\n",
          r.on_spans.p50 / 1e3, r.on_spans.p99 / 1e3, r.rescan_ms * 1e3 / r.on_spans.p50);
      std::printf(
          "  ... contrasted with 64 other such spans (ContrastRowSpans, by difference) p50 %.1f "
          "/ p99 %.1f ms\n",
          r.contrast.p50 / 1e3, r.contrast.p99 / 1e3);
      std::printf(
          "  GetLatent's top_tokens (the 20 tokens a latent fires on most) p50 %.1f / "
          "p99 %.1f ms\n",
          r.tokens_of.p50 / 1e3, r.tokens_of.p99 / 1e3);
      std::printf(
          "  GetLatent's silent windows (20 where a random latent fires on no token, 32/8 "
          "context) p50 %.1f / p99 %.1f ms\n",
          r.silent.p50 / 1e3, r.silent.p99 / 1e3);
      std::printf(
          "  GetLatent's top_tokens + positions: p50 %.2f ms from two reads of the firings, "
          "%.2f ms from one (ProfileLatent)\n",
          r.tokens_positions_apart.p50 / 1e3, r.tokens_positions_together.p50 / 1e3);
    }
    std::printf("  DeleteDataset %.2f s; on disk after it returned %.2f MB\n", r.delete_s,
                r.disk_after_delete / 1e6);
    if (r.post.p50 > 0) {
      std::printf("  LatentPostings (every row of a latent) p50 %.0f / p99 %.0f us\n", r.post.p50,
                  r.post.p99);
      std::printf("  TopSequences (top-20 sequences, 32/8 context) p50 %.0f / p99 %.0f us\n",
                  r.top_sequences.p50, r.top_sequences.p99);
    } else {
      std::printf("  LatentPostings: not available\n");
    }
    std::fflush(stdout);
  }
  if (results.size() > 1) {
    std::printf("\nratios against [%s]: bytes/token, store commit wall, store commit CPU\n",
                results[0].config.name.c_str());
    for (size_t i = 1; i < results.size(); ++i) {
      const Result& a = results[0];
      const Result& b = results[i];
      std::printf("  [%s] / [%s]: %.3f, %.3f, %.3f\n", b.config.name.c_str(), a.config.name.c_str(),
                  static_cast<double>(b.disk) / a.disk, b.store_wall / a.store_wall,
                  b.store_cpu / a.store_cpu);
    }
  }
  std::system(("rm -rf '" + base + "'").c_str());
  return 0;
}
