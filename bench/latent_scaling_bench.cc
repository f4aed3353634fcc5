// Latent scaling over a model-diffing dataset in the chunk store (docs/STORAGE.md, "Latent
// scaling"): two DENSE datasets (the two models' activations, random) and the SPARSE codes a
// random TopK crosscoder over both gives them, then the fit of `latents` latents spread over the
// dictionary, against the reads a fit without the store's postings makes: every row of both
// DENSE datasets and of the codes. The same store, one run, alternating, `rounds` times.
//
//   bazel run -c opt //bench:latent_scaling_bench -- rows=32768 d=768 d_sae=16384 latents=100
#include <ATen/ATen.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "bench/bench_args.h"
#include "engine/extract_job.h"
#include "engine/latent_scaling.h"
#include "engine/sae.h"
#include "storage/chunk_store.h"
#include "storage/db.h"

namespace {

using Clock = std::chrono::steady_clock;
using latentd::bench::IntArg;
namespace engine = latentd::engine;
namespace storage = latentd::storage;

void Check(const absl::Status& s) {
  if (!s.ok()) {
    std::fprintf(stderr, "latent_scaling_bench: %s\n", s.ToString().c_str());
    std::exit(1);
  }
}

double Seconds(Clock::time_point since) {
  return std::chrono::duration<double>(Clock::now() - since).count();
}

uint64_t Create(storage::ChunkStore* store, const std::string& name, storage::DatasetKind kind,
                int32_t width) {
  storage::DatasetMeta meta;
  meta.name = name;
  meta.kind = kind;
  meta.width = width;
  meta.value_dtype = storage::ValueDtype::kFloat16;
  meta.context_length = 128;
  auto id = store->CreateDataset(meta);
  Check(id.status());
  return *id;
}

}  // namespace

int main(int argc, char** argv) {
  const int64_t rows = IntArg(argc, argv, "rows", 32768);
  const int64_t d = IntArg(argc, argv, "d", 768);
  const int64_t d_sae = IntArg(argc, argv, "d_sae", 16384);
  const int64_t k = IntArg(argc, argv, "k", 64);
  const int64_t latents = IntArg(argc, argv, "latents", 100);
  const int64_t rounds = IntArg(argc, argv, "rounds", 3);
  const std::string dir = "/tmp/latent_scaling_bench";
  std::system(("rm -rf '" + dir + "'").c_str());
  auto db = storage::Db::Open(dir);
  Check(db.status());
  storage::ChunkStore store(db->get());

  engine::SaeConfig cfg;
  cfg.d_in = 2 * d;
  cfg.d_sae = d_sae;
  cfg.k = static_cast<int32_t>(k);
  cfg.architecture = engine::SaeArchitecture::kTopK;
  cfg.apply_b_dec_to_input = false;
  cfg.crosscoder_sources = 2;
  at::manual_seed(1);
  engine::SaeWeights w;
  w.W_enc = at::randn({2 * d, d_sae}) / std::sqrt(2.0 * d);
  w.b_enc = at::zeros({d_sae});
  w.W_dec = at::randn({d_sae, 2 * d}) / std::sqrt(static_cast<double>(d));
  w.b_dec = at::zeros({2 * d});
  auto sae = engine::Sae::Create(cfg, w);
  Check(sae.status());

  const uint64_t base = Create(&store, "base", storage::DatasetKind::kDense, d);
  const uint64_t chat = Create(&store, "chat", storage::DatasetKind::kDense, d);
  const uint64_t codes = Create(&store, "diff", storage::DatasetKind::kSparse, d_sae);
  {
    auto base_writer = store.OpenWriter(base);
    auto chat_writer = store.OpenWriter(chat);
    auto codes_writer = store.OpenWriter(codes);
    Check(base_writer.status());
    Check(chat_writer.status());
    Check(codes_writer.status());
    const auto t0 = Clock::now();
    for (int64_t at = 0; at < rows; at += 4096) {
      const int64_t n = std::min<int64_t>(4096, rows - at);
      const at::Tensor x = at::randn({n, 2 * d});
      const engine::SparseCodes z = sae->EncodeSparse(x);
      std::vector<int64_t> indptr{0};
      std::vector<int32_t> indices;
      std::vector<float> values;
      const at::Tensor zi = z.indices.contiguous(), zv = z.values.contiguous();
      for (int64_t r = 0; r < n; ++r) {
        for (int64_t i = 0; i < k; ++i) {
          const float v = zv.data_ptr<float>()[r * k + i];
          if (v == 0) continue;
          indices.push_back(zi.data_ptr<int32_t>()[r * k + i]);
          values.push_back(v);
        }
        indptr.push_back(static_cast<int64_t>(indices.size()));
      }
      const std::vector<int32_t> tokens(n, 0);
      const at::Tensor x_base = x.slice(1, 0, d).contiguous();
      const at::Tensor x_chat = x.slice(1, d, 2 * d).contiguous();
      Check((*base_writer)->AppendDense(n, x_base.data_ptr<float>(), tokens.data()));
      Check((*chat_writer)->AppendDense(n, x_chat.data_ptr<float>(), tokens.data()));
      Check((*codes_writer)
                ->AppendSparse(n, indptr.data(), indices.data(), values.data(), tokens.data()));
      Check((*base_writer)->Commit());
      Check((*chat_writer)->Commit());
      Check((*codes_writer)->Commit());
    }
    Check((*base_writer)->MarkComplete());
    Check((*chat_writer)->MarkComplete());
    Check((*codes_writer)->MarkComplete());
    std::printf("wrote %lld rows (d %lld each, d_sae %lld, k %lld) in %.1f s\n",
                static_cast<long long>(rows), static_cast<long long>(d),
                static_cast<long long>(d_sae), static_cast<long long>(k), Seconds(t0));
  }

  const engine::StoredDenseOpener open = engine::ChunkStoreDenseOpener(&store);
  auto base_rows = open(base, "base");
  auto chat_rows = open(chat, "chat");
  Check(base_rows.status());
  Check(chat_rows.status());
  const engine::CrosscoderDatasetRows read =
      engine::ChunkStoreCrosscoderRows(&store, codes, {*base_rows, *chat_rows});
  engine::LatentScalingQuery query;
  for (int64_t i = 0; i < latents; ++i) query.latents.push_back(i * d_sae / latents);

  std::printf("%-6s %-10s %-10s %-10s %-10s %s\n", "ROUND", "PAIRS", "ROWS_READ", "FIT_S", "SCAN_S",
              "FIT/SCAN");
  for (int64_t round = 0; round < rounds; ++round) {
    auto t0 = Clock::now();
    auto fitted = engine::FitLatentScaling(*sae, query, read, nullptr);
    Check(fitted.status());
    const double fit = Seconds(t0);
    int64_t pairs = 0;
    for (const engine::LatentScale& l : fitted->latents) pairs += l.rows;
    // What a fit without postings reads: every row of both models and of the codes.
    t0 = Clock::now();
    std::vector<float> values;
    for (int64_t at = 0; at < rows; at += 4096) {
      const int64_t n = std::min<int64_t>(4096, rows - at);
      Check((*base_rows)->ReadValues(at, n, &values));
      Check((*chat_rows)->ReadValues(at, n, &values));
      Check(store.ReadRows(codes, at, n).status());
    }
    const double scan = Seconds(t0);
    std::printf("%-6lld %-10lld %-10lld %-10.3f %-10.3f %.2f\n", static_cast<long long>(round),
                static_cast<long long>(pairs), static_cast<long long>(fitted->rows_read), fit, scan,
                fit / scan);
  }
  std::system(("rm -rf '" + dir + "'").c_str());
  return 0;
}
