// X1 extraction benchmark (../shared/notes/workloads.md): the whole EXTRACT job (RunExtract into
// a real chunk store) against forward + encode alone of the same model in the same run (the
// compute floor), and against bench/extract_python_peer.py (python3-torch forward with a hook,
// TopK, scipy save_npz per chunk), side by side, alternating, best of --rounds.
//
//   bazel run -c opt //bench:extract_bench -- [--tokens=65536] [--rounds=3] [--threads=N]
//                                             [--no_peer] [--hooks=N [--torchscript]]
//                                             [--sae=topk|jumprelu]
// Default is the quick 65,536-token variant; --tokens=1048576 is the full X1. --hooks=N (2..4)
// measures instead one job of N outputs (blocks.0..N-1.hook_resid_post, each with the SAE) against
// N one-hook jobs of the same outputs, alternating which goes first, in the same run; with
// --torchscript the model is the same transformer as a TorchScript module returning every hidden
// state (bench/reference_torchscript.py, the Hugging Face export layout), which has no early exit.
// --sae=jumprelu encodes with a JumpReLU SAE instead (Gemma Scope's kind; also what a BatchTopK SAE
// becomes), the same weights with one threshold set on the model's activations so that k latents
// fire a row on average: its codes are ragged (a count per row), not k a row (no Python peer).
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/safetensors.h"
#include "engine/extract_job.h"
#include "engine/extract_pipeline.h"
#include "engine/reference_model.h"
#include "engine/sae.h"
#include "engine/token_source.h"
#include "rocksdb/db.h"
#include "storage/chunk_store.h"
#include "storage/db.h"

namespace {

using namespace latentd::engine;  // NOLINT: a benchmark binary
using latentd::StDtype;
using latentd::StTensorToWrite;
using latentd::WriteSafetensors;

class BenchContext : public JobContext {
 public:
  explicit BenchContext(uint64_t id) : id_(id) {
    devices_.push_back({DeviceKind::kCpu, 0, "cpu:0", 0});
  }
  uint64_t job_id() const override { return id_; }
  int attempt() const override { return 1; }
  const std::vector<DeviceRef>& devices() const override { return devices_; }
  bool cancel_requested() const override { return false; }
  void ReportProgress(int64_t, int64_t, const std::string&) override {}
  void ReportTelemetry(const latentd::v1::Telemetry& t) override { last_ = t.extract(); }
  void Log(latentd::v1::LogLine::Level, const std::string& text) override {
    if (absl::StartsWith(text, "extract: ")) std::printf("          %s\n", text.c_str());
  }
  latentd::v1::ExtractTelemetry last_;

 private:
  uint64_t id_;
  std::vector<DeviceRef> devices_;
};

void Check(const absl::Status& s, const char* what) {
  if (!s.ok()) {
    std::fprintf(stderr, "%s: %s\n", what, s.ToString().c_str());
    std::exit(1);
  }
}

// Zipf(1.1) ids over the vocabulary, by inverse CDF.
std::vector<uint16_t> ZipfTokens(int64_t n, int vocab, uint64_t seed) {
  std::vector<double> cdf(vocab);
  double sum = 0;
  for (int i = 0; i < vocab; ++i) cdf[i] = (sum += std::pow(i + 1.0, -1.1));
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> u(0, sum);
  std::vector<uint16_t> ids(n);
  for (auto& t : ids)
    t = static_cast<uint16_t>(std::lower_bound(cdf.begin(), cdf.end(), u(rng)) - cdf.begin());
  return ids;
}

using Clock = std::chrono::steady_clock;

// Wall seconds of RunExtract of `spec` as job `job_id` into a fresh store under `db_dir`.
double TimedJob(const latentd::v1::ExtractSpec& spec, ExtractEnv env, const std::string& db_dir,
                uint64_t job_id) {
  auto db = latentd::storage::Db::Open(db_dir);
  Check(db.status(), "db");
  latentd::storage::ChunkStore store(db->get());
  env.store = &store;
  BenchContext ctx(job_id);
  const auto start = Clock::now();
  Check(RunExtract(spec, env, &ctx).status(), "RunExtract");
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// One job of `hooks` outputs against `hooks` one-hook jobs (each a dataset of its own too).
void CompareHooks(const latentd::v1::ExtractSpec& base, const ExtractEnv& env,
                  const std::string& dir, int hooks, int rounds) {
  latentd::v1::ExtractSpec multi = base;
  std::vector<latentd::v1::ExtractSpec> singles;
  for (int h = 0; h < hooks; ++h) {
    latentd::v1::ExtractSpec one = base;
    one.set_hook_name(absl::StrCat("blocks.", h, ".hook_resid_post"));
    singles.push_back(one);
    if (h == 0) {
      multi.set_hook_name(one.hook_name());
    } else {
      latentd::v1::ExtractOutput* more = multi.add_more_outputs();
      more->set_hook_name(one.hook_name());
      *more->mutable_sae() = base.sae();
    }
  }
  Check(ValidateExtractSpec(multi, env), "spec");
  std::printf("%d hooks (blocks.0..%d.hook_resid_post), one job against %d one-hook jobs\n", hooks,
              hooks - 1, hooks);
  double best_multi = 1e30, best_singles = 1e30;
  uint64_t job_id = 100;
  for (int round = 0; round < rounds; ++round) {
    for (int turn = 0; turn < 2; ++turn) {
      if ((turn == 0) == (round % 2 == 0)) {
        const double s = TimedJob(multi, env, absl::StrCat(dir, "/multi", round), ++job_id);
        best_multi = std::min(best_multi, s);
        std::printf("round %d  one job of %d outputs   %8.2f s\n", round, hooks, s);
      } else {
        double s = 0;
        for (int h = 0; h < hooks; ++h) {
          s += TimedJob(singles[h], env, absl::StrCat(dir, "/single", round, "-", h), ++job_id);
        }
        best_singles = std::min(best_singles, s);
        std::printf("round %d  %d one-hook jobs        %8.2f s\n", round, hooks, s);
      }
    }
  }
  std::printf("\nbest of %d rounds: one job %.2f s, %d jobs %.2f s -> %.2fx less wall\n", rounds,
              best_multi, hooks, best_singles, best_singles / best_multi);
}

}  // namespace

int main(int argc, char** argv) {
  setvbuf(stdout, nullptr, _IOLBF, 0);
  int64_t num_tokens = 65536;
  int rounds = 3;
  int threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  bool peer = true;
  int hooks = 1;
  bool torchscript = false;
  bool jumprelu = false;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (absl::StartsWith(a, "--tokens="))
      num_tokens = std::atoll(a.c_str() + 9);
    else if (absl::StartsWith(a, "--rounds="))
      rounds = std::atoi(a.c_str() + 9);
    else if (absl::StartsWith(a, "--threads="))
      threads = std::atoi(a.c_str() + 10);
    else if (a == "--no_peer")
      peer = false;
    else if (absl::StartsWith(a, "--hooks="))
      hooks = std::atoi(a.c_str() + 8);
    else if (a == "--torchscript")
      torchscript = true;
    else if (a == "--sae=jumprelu")
      jumprelu = true;
    else if (a == "--sae=topk")
      jumprelu = false;
    else {
      std::fprintf(stderr, "unknown flag %s\n", a.c_str());
      return 2;
    }
  }
  const int kCtx = 128, kVocab = 4096, kDsae = 4096, kK = 32;
  char tmpl[] = "/tmp/extract-bench-XXXXXX";
  const std::string dir = mkdtemp(tmpl);
  const std::string tokens_path = dir + "/tokens.bin";
  {
    auto ids = ZipfTokens(num_tokens, kVocab, 1234);
    std::ofstream(tokens_path, std::ios::binary)
        .write(reinterpret_cast<char*>(ids.data()), ids.size() * 2);
  }
  // SAE: unit-norm decoder rows from a seed, W_enc = W_dec^T, zero biases.
  at::manual_seed(42);
  at::Tensor w_dec = at::randn({kDsae, 256});
  w_dec = w_dec / w_dec.norm(2, 1, true);
  latentd::v1::ExtractSpec spec;
  spec.mutable_model()->mutable_reference();  // X1 defaults, seed 0
  spec.set_hook_name("blocks.2.hook_resid_post");
  spec.mutable_tokens()->set_path(tokens_path);
  spec.mutable_tokens()->set_context_length(kCtx);
  spec.mutable_sae()->set_path(dir + "/sae");
  // The reference weights for the Python peer.
  auto hook = *ParseHookName(spec.hook_name());
  auto model = CreateReferenceModel(spec.model().reference(), hook, at::kCPU);
  Check(model.status(), "model");
  SaeConfig sae_cfg;
  sae_cfg.d_in = 256;
  sae_cfg.d_sae = kDsae;
  sae_cfg.k = jumprelu ? 0 : kK;
  sae_cfg.architecture = jumprelu ? SaeArchitecture::kJumpRelu : SaeArchitecture::kTopK;
  sae_cfg.hook_name = "blocks.2.hook_resid_post";
  at::Tensor threshold;
  if (jumprelu) {
    // One threshold: the (1 - k / d_sae) quantile of the pre-activations on 8 sequences.
    auto tokens = TokenSource::Open(spec.tokens());
    Check(tokens.status(), "tokens");
    std::vector<int64_t> ids(8 * (*tokens)->context_length());
    Check((*tokens)->Read(0, 8, ids.data()), "sample tokens");
    at::NoGradGuard no_grad;
    const at::Tensor x = (*model)->Forward(at::tensor(ids).view({8, -1})).reshape({-1, 256});
    const at::Tensor pre = at::matmul(x, w_dec.t()).flatten();
    const int64_t above = pre.numel() * kK / kDsae;
    const float cut = std::get<0>(pre.topk(above)).min().item<float>();
    threshold = at::full({kDsae}, cut);
  }
  Check(SaveSae(dir + "/sae",
                {w_dec.t().contiguous(), at::zeros({kDsae}), w_dec, at::zeros({256}), threshold},
                sae_cfg),
        "SaveSae");
  if (jumprelu) peer = false;  // the peer encodes TopK
  {
    auto named = (*model)->NamedWeights();
    std::vector<StTensorToWrite> tensors;
    for (auto& [name, t] : named)
      tensors.push_back({name, StDtype::kF32, t.sizes().vec(), t.data_ptr()});
    Check(WriteSafetensors(dir + "/reference.safetensors", tensors), "reference weights");
  }
  ExtractEnv env;
  env.data_roots = {dir};
  Check(ValidateExtractSpec(spec, env), "spec");
  if (hooks > 1) {
    if (hooks > 4) {
      std::fprintf(stderr, "--hooks: at most 4 (the reference model's layers)\n");
      return 2;
    }
    if (torchscript) {
      const std::string cmd =
          absl::StrCat("cd bench && /usr/bin/python3 reference_torchscript.py --dir=", dir);
      if (std::system(cmd.c_str()) != 0) {
        std::fprintf(stderr, "scripting the model failed (%s)\n", cmd.c_str());
        return 1;
      }
      spec.mutable_model()->mutable_torchscript()->set_path(dir + "/reference.pt");
      spec.mutable_model()->mutable_torchscript()->set_vocab_size(kVocab);
    }
    std::printf("X1 extraction: %lld tokens, %s model, TopK d_sae %d k %d, %d threads\n",
                static_cast<long long>(num_tokens), torchscript ? "TorchScript" : "reference",
                kDsae, kK, threads);
    CompareHooks(spec, env, dir, hooks, rounds);
    return 0;
  }

  std::printf(
      "X1 extraction: %lld tokens (%lld sequences x %d), hook %s, %s d_sae %d k %d, %d threads\n",
      static_cast<long long>(num_tokens), static_cast<long long>(num_tokens / kCtx), kCtx,
      spec.hook_name().c_str(), jumprelu ? "JumpReLU (k on average)" : "TopK", kDsae, kK, threads);
  double best_floor = 0, best_job = 0, best_peer = 0, bytes_per_token = 0;
  int64_t device_mem = 0, rss = 0;
  for (int round = 0; round < rounds; ++round) {
    // Compute floor: forward + encode, nothing copied or stored.
    {
      auto tokens = TokenSource::Open(spec.tokens());
      Check(tokens.status(), "tokens");
      PipelineReplica r;
      r.model = std::move(*CreateReferenceModel(spec.model().reference(), hook, at::kCPU));
      r.saes.push_back(*Sae::Load(dir + "/sae"));
      r.cpu_threads = threads;
      PipelineOptions o;
      o.batch_sequences = 32;
      auto tps = MeasureComputeFloorTokensPerSecond(**tokens, &r, o, (*tokens)->num_sequences());
      Check(tps.status(), "floor");
      best_floor = std::max(best_floor, *tps);
      std::printf("round %d  compute floor   %10.0f tokens/s\n", round, *tps);
    }
    // The whole job into a fresh chunk store.
    {
      const std::string db_dir = absl::StrCat(dir, "/db", round);
      auto db = latentd::storage::Db::Open(db_dir);
      Check(db.status(), "db");
      latentd::storage::ChunkStore store(db->get());
      env.store = &store;
      BenchContext ctx(round + 1);
      auto result = RunExtract(spec, env, &ctx);
      Check(result.status(), "RunExtract");
      best_job = std::max(best_job, result->tokens_per_second());
      bytes_per_token = result->bytes_per_token();
      device_mem = ctx.last_.device_memory_bytes();
      rss = ctx.last_.host_rss_bytes();
      // As stored once RocksDB has flushed and compacted (the live figure counts memtables).
      for (int f = 0; f < latentd::storage::kNumFamilies; ++f) {
        auto* h = (*db)->handle(static_cast<latentd::storage::Family>(f));
        (*db)->raw()->Flush(rocksdb::FlushOptions(), h).PermitUncheckedError();
        (*db)
            ->raw()
            ->CompactRange(rocksdb::CompactRangeOptions(), h, nullptr, nullptr)
            .PermitUncheckedError();
      }
      auto info = store.GetDataset(result->dataset_id());
      Check(info.status(), "GetDataset");
      const double rows = static_cast<double>(result->rows());
      bytes_per_token = info->bytes_on_disk() / rows;
      std::printf(
          "round %d  extract job     %10.0f tokens/s  (%.1f B/token live, %.1f B/token "
          "compacted, nnz/token %.1f)\n",
          round, result->tokens_per_second(), result->bytes_per_token(), bytes_per_token,
          result->nnz() / rows);
    }
    if (peer) {
      const std::string cmd =
          absl::StrCat("/usr/bin/python3 bench/extract_python_peer.py --dir=", dir,
                       " --threads=", threads, " --out=", dir, "/peer", round);
      FILE* p = popen(cmd.c_str(), "r");
      char line[512];
      double tps = 0;
      while (p != nullptr && fgets(line, sizeof line, p) != nullptr) {
        if (absl::StartsWith(line, "tokens_per_second ")) tps = std::atof(line + 18);
      }
      if (p == nullptr || pclose(p) != 0 || tps <= 0) {
        std::fprintf(stderr, "python peer failed (%s)\n", cmd.c_str());
        return 1;
      }
      best_peer = std::max(best_peer, tps);
      std::printf("round %d  python peer     %10.0f tokens/s\n", round, tps);
    }
  }
  std::printf("\nbest of %d rounds:\n", rounds);
  std::printf("  compute floor (forward + encode)  %10.0f tokens/s\n", best_floor);
  std::printf(
      "  extract job (store, copies, ...)  %10.0f tokens/s  = %.3f of the floor (overhead "
      "%.1f%%)\n",
      best_job, best_job / best_floor, 100.0 * (best_floor / best_job - 1));
  if (peer) {
    std::printf("  python peer (hooks, topk, npz)    %10.0f tokens/s  -> latentd %.2fx faster\n",
                best_peer, best_job / best_peer);
  }
  std::printf(
      "  bytes per token stored            %10.1f B (fixed-k u16 index + fp16 value: 128 B; floor "
      "~100 B)\n",
      bytes_per_token);
  std::printf("  memory at the end                 RSS %lld MiB\n",
              static_cast<long long>(rss >> 20));
  (void)device_mem;
  return 0;
}
