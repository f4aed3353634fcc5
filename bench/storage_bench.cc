// Chunk store benchmark on the X1 shape (k = 32, d_sae = 4096, fp16, 128-row sequences).
//
//   bazel run -c opt //bench:storage_bench -- [rows] [postings 0|1]
//
// Prints, all from one run:
//  - bytes per token on disk after compaction (whole database, keys and metadata included)
//    against the 128 B fixed-k u16 + fp16 layout and the ~100 B information floor;
//  - commit throughput of the store against raw synced RocksDB WriteBatches of the same final
//    key/value bytes in the same number of commits (a fresh database, same options);
//  - ReadRows (1024 rows), RowLatents, GetLatent (stats + top-20 with 32/8 context) and
//    LatentPostings latency percentiles.
// Rows are synthetic: latents drawn from a Zipf-like distribution, exponential values, Zipf(1.1)
// token ids; the extraction workload's own figures come from the EXTRACT benchmark.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "storage/chunk_store.h"

using latentd::storage::ChunkStore;
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
  double p50, p99;
};
Percentiles Summarize(std::vector<double> us) {
  std::sort(us.begin(), us.end());
  return {us[us.size() / 2], us[std::min(us.size() - 1, us.size() * 99 / 100)]};
}

void Check(const absl::Status& s) {
  if (!s.ok()) {
    std::fprintf(stderr, "%s\n", s.ToString().c_str());
    std::exit(1);
  }
}

}  // namespace

int main(int argc, char** argv) {
  const int64_t rows = argc > 1 ? std::atoll(argv[1]) : 1048576;
  const bool postings = argc > 2 ? std::atoi(argv[2]) != 0 : true;
  const int32_t width = 4096, k = 32;
  const int64_t commit_rows = 16384;
  const std::string base = std::string(std::getenv("TMPDIR") ? std::getenv("TMPDIR") : "/tmp") +
                           "/latentd_storage_bench";
  std::system(("rm -rf '" + base + "'").c_str());
  std::system(("mkdir -p '" + base + "'").c_str());

  // ---- synthetic X1-shaped rows ----
  std::mt19937_64 rng(42);
  std::vector<double> latent_weight(width), token_weight(4096);
  for (int j = 0; j < width; ++j) latent_weight[j] = 1.0 / std::pow(j + 10.0, 0.8);
  std::shuffle(latent_weight.begin(), latent_weight.end(), rng);
  for (int t = 0; t < 4096; ++t) token_weight[t] = 1.0 / std::pow(t + 1.0, 1.1);
  std::discrete_distribution<int32_t> pick_latent(latent_weight.begin(), latent_weight.end());
  std::discrete_distribution<int32_t> pick_token(token_weight.begin(), token_weight.end());
  std::exponential_distribution<float> value(1.0f);
  std::vector<int64_t> indptr{0};
  std::vector<int32_t> indices, tokens;
  std::vector<float> values;
  indices.reserve(rows * k);
  values.reserve(rows * k);
  for (int64_t r = 0; r < rows; ++r) {
    std::set<int32_t> cols;
    while (static_cast<int>(cols.size()) < k) cols.insert(pick_latent(rng));
    for (int32_t c : cols) {
      indices.push_back(c);
      values.push_back(0.05f + value(rng));
    }
    indptr.push_back(static_cast<int64_t>(indices.size()));
    tokens.push_back(pick_token(rng));
  }

  // ---- the store ----
  auto db_or = Db::Open(base + "/store");
  Check(db_or.status());
  std::unique_ptr<Db> db = *std::move(db_or);
  ChunkStore store(db.get());
  latentd::storage::DatasetMeta meta;
  meta.name = "x1";
  meta.width = width;
  meta.k = k;
  meta.encoder = "topk";
  meta.hook_name = "blocks.2.hook_resid_post";
  meta.context_length = 128;
  meta.postings = postings;
  auto id_or = store.CreateDataset(meta);
  Check(id_or.status());
  const uint64_t id = *id_or;
  auto writer = store.OpenWriter(id);
  Check(writer.status());
  int64_t commits = 0;
  auto t0 = Clock::now();
  const double c0 = CpuSeconds();
  for (int64_t at = 0; at < rows; at += commit_rows) {
    const int64_t n = std::min(commit_rows, rows - at);
    std::vector<int64_t> local(indptr.begin() + at, indptr.begin() + at + n + 1);
    for (int64_t& v : local) v -= indptr[at];
    Check((*writer)->AppendSparse(n, local.data(), indices.data() + indptr[at],
                                  values.data() + indptr[at], tokens.data() + at));
    Check((*writer)->Commit());
    ++commits;
  }
  const double store_s = Seconds(t0, Clock::now());
  const double store_cpu = CpuSeconds() - c0;
  writer->reset();
  Check(db->CompactAll());
  const uint64_t disk = *db->BytesOnDisk();
  const auto info = *store.GetDataset(id);

  // ---- raw baseline: the same final key/value bytes, same number of synced batches ----
  struct Kv {
    Family family;
    std::string key, value;
  };
  std::vector<Kv> kvs;
  uint64_t logical = 0;
  for (Family f : {Family::kChunks, Family::kPostings, Family::kLatentIndex, Family::kMeta}) {
    auto it = db->NewIterator(f);
    for (it->SeekToFirst(); it->Valid(); it->Next()) {
      kvs.push_back({f, it->key().ToString(), it->value().ToString()});
      logical += it->key().size() + it->value().size();
    }
  }
  double raw_s = 1e30, raw_cpu = 1e30;
  for (int trial = 0; trial < 2; ++trial) {
    std::system(("rm -rf '" + base + "/raw'").c_str());
    auto raw_or = Db::Open(base + "/raw");
    Check(raw_or.status());
    std::unique_ptr<Db> raw = *std::move(raw_or);
    auto r0 = Clock::now();
    const double rc0 = CpuSeconds();
    rocksdb::WriteBatch batch;
    // Spread: batch i takes every commits-th kv starting at i, so families mix evenly.
    for (int64_t c = 0; c < commits; ++c) {
      batch.Clear();
      for (size_t i = c; i < kvs.size(); i += commits) {
        batch.Put(raw->handle(kvs[i].family), kvs[i].key, kvs[i].value);
      }
      Check(raw->Write(&batch, /*sync=*/true));
    }
    raw_s = std::min(raw_s, Seconds(r0, Clock::now()));  // the better of two runs
    raw_cpu = std::min(raw_cpu, CpuSeconds() - rc0);
  }

  // ---- reads ----
  std::mt19937 qrng(7);
  std::vector<double> read_us, row_us, latent_us, post_us;
  for (int i = 0; i < 200; ++i) {
    const int64_t start = qrng() % std::max<int64_t>(1, rows - 1024);
    auto a = Clock::now();
    auto csr = store.ReadRows(id, start, std::min<int64_t>(1024, rows));
    read_us.push_back(Seconds(a, Clock::now()) * 1e6);
    Check(csr.status());
    a = Clock::now();
    Check(store.RowLatents(id, qrng() % rows).status());
    row_us.push_back(Seconds(a, Clock::now()) * 1e6);
    const int32_t latent = qrng() % width;
    a = Clock::now();
    Check(store.GetLatentStats(id, latent).status());
    Check(store.TopActivations(id, latent, 20, 32, 8).status());
    latent_us.push_back(Seconds(a, Clock::now()) * 1e6);
    if (postings) {
      std::vector<int64_t> prow;
      std::vector<float> pval;
      a = Clock::now();
      Check(store.LatentPostings(id, latent, &prow, &pval));
      post_us.push_back(Seconds(a, Clock::now()) * 1e6);
    }
  }

  const double bpt = static_cast<double>(disk) / rows;
  std::printf("rows %lld, k %d, d_sae %d, fp16, postings %s, %lld commits of %lld rows\n",
              static_cast<long long>(rows), k, width, postings ? "on" : "off",
              static_cast<long long>(commits), static_cast<long long>(commit_rows));
  std::printf("bytes on disk after compaction: %llu (%.1f B/token); dataset bytes_on_disk %lld\n",
              static_cast<unsigned long long>(disk), bpt,
              static_cast<long long>(info.bytes_on_disk()));
  std::printf("  vs fixed-k u16+fp16 layout 128 B: %.3fx; vs ~100 B floor: %.3fx\n", bpt / 128,
              bpt / 100);
  std::printf(
      "commit: store %.2f s (%.0f rows/s), raw RocksDB same %llu bytes in %lld synced "
      "batches %.2f s; store overhead %+.1f%%\n",
      store_s, rows / store_s, static_cast<unsigned long long>(logical),
      static_cast<long long>(commits), raw_s, (store_s / raw_s - 1) * 100);
  std::printf(
      "commit CPU (process, RocksDB threads included): store %.2f s, raw %.2f s; store "
      "CPU overhead %+.1f%%\n",
      store_cpu, raw_cpu, (store_cpu / raw_cpu - 1) * 100);
  auto p = Summarize(read_us);
  std::printf("ReadRows(1024 rows): p50 %.0f us, p99 %.0f us\n", p.p50, p.p99);
  p = Summarize(row_us);
  std::printf("RowLatents(1 row): p50 %.0f us, p99 %.0f us\n", p.p50, p.p99);
  p = Summarize(latent_us);
  std::printf("GetLatent (stats + top-20, 32/8 context): p50 %.0f us, p99 %.0f us\n", p.p50, p.p99);
  if (postings) {
    p = Summarize(post_us);
    std::printf("LatentPostings (all rows of a latent): p50 %.0f us, p99 %.0f us\n", p.p50, p.p99);
  }
  std::system(("rm -rf '" + base + "'").c_str());
  return 0;
}
