#include "engine/extract_pipeline.h"

#include <fstream>
#include <random>

#include "engine/reference_model.h"
#include "gtest/gtest.h"

namespace latentd::engine {
namespace {

constexpr int kCtx = 8;
constexpr int kVocab = 50;

std::string TokenFile(const std::string& name, int64_t n, int max_id = kVocab) {
  std::string path =
      std::string(getenv("TEST_TMPDIR") ? getenv("TEST_TMPDIR") : "/tmp") + "/" + name;
  std::vector<uint16_t> ids(n);
  std::mt19937 rng(5);
  for (auto& t : ids) t = rng() % max_id;
  std::ofstream(path, std::ios::binary).write(reinterpret_cast<char*>(ids.data()), n * 2);
  return path;
}

std::unique_ptr<TokenSource> Tokens(const std::string& path) {
  latentd::v1::TokenSource spec;
  spec.set_path(path);
  spec.set_context_length(kCtx);
  auto src = TokenSource::Open(spec);
  EXPECT_TRUE(src.ok()) << src.status();
  return std::move(*src);
}

// Activations that are a fixed function of the token (NaN for token `nan_token`).
class EmbeddingModel : public ActivationModel {
 public:
  explicit EmbeddingModel(int nan_token = -1)
      : table_(at::randn({kVocab, 16}, at::TensorOptions().dtype(at::kFloat))) {
    if (nan_token >= 0) table_[nan_token].fill_(std::nanf(""));
  }
  at::Tensor Forward(const at::Tensor& tokens) override {
    return table_.index_select(0, tokens.reshape({-1})).view({tokens.size(0), tokens.size(1), 16});
  }
  int64_t hook_width() const override { return 16; }
  int64_t vocab_size() const override { return kVocab; }
  int64_t max_context() const override { return 0; }
  int64_t parameter_bytes() const override { return table_.numel() * 4; }
  int64_t activation_bytes_per_token(int64_t) const override { return 64; }
  const std::string& model_id() const override { return id_; }
  const std::string& weight_hash() const override { return id_; }
  at::Tensor table_;
  std::string id_ = "embedding";
};

// Two hooks, each a fixed function of the token: table 0, and table 1 (NaN for `nan_token`),
// of which the model returns those in `hooks`.
class TwoHookModel : public ActivationModel {
 public:
  TwoHookModel(std::vector<int> hooks, int nan_token = -1) : hooks_(std::move(hooks)) {
    at::manual_seed(21);
    tables_ = {at::randn({kVocab, 16}), at::randn({kVocab, 16})};
    if (nan_token >= 0) tables_[1][nan_token].fill_(std::nanf(""));
  }
  at::Tensor Forward(const at::Tensor& tokens) override { return ForwardHooks(tokens)[0]; }
  std::vector<at::Tensor> ForwardHooks(const at::Tensor& tokens) override {
    std::vector<at::Tensor> out;
    for (int h : hooks_) {
      out.push_back(tables_[h]
                        .index_select(0, tokens.reshape({-1}))
                        .view({tokens.size(0), tokens.size(1), 16}));
    }
    return out;
  }
  int64_t hook_width() const override { return 16; }
  std::vector<int64_t> hook_widths() const override {
    return std::vector<int64_t>(hooks_.size(), 16);
  }
  int64_t vocab_size() const override { return kVocab; }
  int64_t max_context() const override { return 0; }
  int64_t parameter_bytes() const override { return 2 * kVocab * 16 * 4; }
  int64_t activation_bytes_per_token(int64_t) const override { return 128; }
  const std::string& model_id() const override { return id_; }
  const std::string& weight_hash() const override { return id_; }

 private:
  std::vector<int> hooks_;
  std::vector<at::Tensor> tables_;
  std::string id_ = "two-hooks";
};

Sae MakeSae(SaeArchitecture arch, int64_t d_in, uint64_t seed) {
  at::manual_seed(seed);
  SaeConfig cfg;
  cfg.d_in = d_in;
  cfg.d_sae = 64;
  cfg.architecture = arch;
  cfg.k = 6;
  auto sae = Sae::Create(cfg, {at::randn({d_in, 64}), at::randn({64}) * 0.1, at::randn({64, d_in}),
                               at::randn({d_in}) * 0.1, at::rand({64})});
  EXPECT_TRUE(sae.ok());
  return *sae;
}

std::vector<PipelineReplica> Replicas(int n, int nan_token = -1,
                                      SaeArchitecture arch = SaeArchitecture::kTopK) {
  at::manual_seed(11);
  std::vector<PipelineReplica> out;
  auto proto = std::make_unique<EmbeddingModel>(nan_token);
  for (int i = 0; i < n; ++i) {
    PipelineReplica r;
    auto m = std::make_unique<EmbeddingModel>(nan_token);
    m->table_ = proto->table_.clone();
    r.model = std::move(m);
    r.saes.push_back(MakeSae(arch, 16, 3));
    r.cpu_threads = 1;
    out.push_back(std::move(r));
  }
  return out;
}

PipelineOptions Opts(bool sparse = true) {
  PipelineOptions o;
  o.sparse = sparse;
  o.batch_sequences = 3;
  o.commit_rows = 40;  // every 2 batches (24 rows per batch)
  return o;
}

void ExpectSameDataset(const InMemoryDataset& a, const InMemoryDataset& b) {
  EXPECT_EQ(a.token_ids, b.token_ids);
  EXPECT_EQ(a.indptr, b.indptr);
  EXPECT_EQ(a.indices, b.indices);
  EXPECT_EQ(a.values, b.values);
}

TEST(ExtractPipelineTest, StoresExactlyTheEncodedLatentsOfEveryRow) {
  for (auto arch : {SaeArchitecture::kTopK, SaeArchitecture::kRelu, SaeArchitecture::kJumpRelu}) {
    auto tokens = Tokens(TokenFile("t1.bin", 100 * kCtx + 3));
    auto replicas = Replicas(1, -1, arch);
    InMemoryDataset ds;
    ds.width = 64;
    InMemoryRowSink sink(&ds);
    auto result = RunExtractPipeline(*tokens, &replicas, &sink, Opts(), {});
    ASSERT_TRUE(result.ok()) << result.status();
    EXPECT_EQ(ds.rows(), 100 * kCtx);
    EXPECT_TRUE(ds.complete);
    EXPECT_EQ(result->nnz_this_run, static_cast<int64_t>(ds.indices.size()));
    std::vector<int64_t> ids(100 * kCtx);
    ASSERT_TRUE(tokens->Read(0, 100, ids.data()).ok());
    at::Tensor x = replicas[0]
                       .model->Forward(at::from_blob(ids.data(), {100, kCtx}, at::kLong))
                       .reshape({-1, 16});
    at::Tensor z = replicas[0].saes[0].EncodeDense(x);
    // How well the SAE reconstructs the rows, as a user computes it from x and x_hat.
    const at::Tensor err = x - replicas[0].saes[0].Decode(z);
    const double sse = err.to(at::kDouble).pow(2).sum().item<double>();
    const double sst = (x.to(at::kDouble) - x.to(at::kDouble).mean(0)).pow(2).sum().item<double>();
    const storage::ReconstructionFit& fit = result->outputs[0].fit;
    EXPECT_EQ(ds.fit.rows, fit.rows);  // the sink got the same sums with the rows
    EXPECT_EQ(fit.rows, 100 * kCtx);
    EXPECT_NEAR(fit.explained_variance(), 1 - sse / sst, 1e-6 * std::max(1.0, sse / sst));
    EXPECT_NEAR(fit.mse(), sse / (100 * kCtx * 16), 1e-6 * fit.mse());
    for (int64_t r = 0; r < ds.rows(); ++r) {
      ASSERT_EQ(ds.token_ids[r], ids[r]);
      at::Tensor nz = z[r].nonzero().reshape({-1});
      ASSERT_EQ(ds.indptr[r + 1] - ds.indptr[r], nz.numel()) << "row " << r;
      for (int64_t j = 0; j < nz.numel(); ++j) {
        const int64_t pos = ds.indptr[r] + j;
        EXPECT_EQ(ds.indices[pos], nz[j].item<int64_t>());
        EXPECT_NEAR(ds.values[pos], z[r][ds.indices[pos]].item<float>(), 1e-5);
      }
    }
  }
}

TEST(ExtractPipelineTest, DenseModeStoresTheHiddenStates) {
  auto tokens = Tokens(TokenFile("t2.bin", 20 * kCtx));
  auto replicas = Replicas(2);
  InMemoryDataset ds;
  ds.width = 16;
  InMemoryRowSink sink(&ds);
  ASSERT_TRUE(RunExtractPipeline(*tokens, &replicas, &sink, Opts(false), {}).ok());
  ASSERT_EQ(ds.values.size(), 20u * kCtx * 16);
  for (int64_t r = 0; r < ds.rows(); r += 7) {
    at::Tensor want =
        static_cast<EmbeddingModel*>(replicas[0].model.get())->table_[ds.token_ids[r]];
    for (int j = 0; j < 16; ++j) EXPECT_EQ(ds.values[r * 16 + j], want[j].item<float>());
  }
}

// Cancels at a random commit, resumes on the same dataset, and compares with an uninterrupted run.
TEST(ExtractPipelineTest, ResumeAfterCancellationEqualsAnUninterruptedRun) {
  const std::string path = TokenFile("t3.bin", 61 * kCtx);
  for (int devices : {1, 2}) {
    auto tokens = Tokens(path);
    InMemoryDataset want;
    want.width = 64;
    {
      auto replicas = Replicas(devices);
      InMemoryRowSink sink(&want);
      ASSERT_TRUE(RunExtractPipeline(*tokens, &replicas, &sink, Opts(), {}).ok());
    }
    std::mt19937 rng(devices);
    for (int trial = 0; trial < 3; ++trial) {
      InMemoryDataset got;
      got.width = 64;
      int runs = 0;
      while (!got.complete) {
        ASSERT_LT(++runs, 50);
        auto replicas = Replicas(devices);
        InMemoryRowSink sink(&got);  // a fresh writer: pending rows of the last run are gone
        int checks = 0;
        const int cancel_at = 1 + rng() % 8;
        const int64_t resume_at = got.rows();
        std::vector<int64_t> progress;
        PipelineCallbacks cb;
        cb.cancelled = [&] { return ++checks > cancel_at; };
        cb.progress = [&](int64_t done, int64_t) { progress.push_back(done); };
        auto result = RunExtractPipeline(*tokens, &replicas, &sink, Opts(), cb);
        ASSERT_FALSE(progress.empty());
        EXPECT_EQ(progress.front(), resume_at);  // the run reports where it resumes
        if (!result.ok()) {
          ASSERT_EQ(result.status().code(), absl::StatusCode::kCancelled) << result.status();
          EXPECT_EQ(got.rows() % (3 * kCtx), 0);  // watermark on the batch grid
        }
      }
      EXPECT_GT(runs, 1);
      ExpectSameDataset(got, want);
      // The sums given with rows that never committed died with them: the dataset's totals
      // are those of the uninterrupted run.
      EXPECT_EQ(got.fit.rows, 61 * kCtx);
      EXPECT_EQ(want.fit.rows, 61 * kCtx);
      EXPECT_NEAR(got.fit.explained_variance(), want.fit.explained_variance(), 1e-9);
      EXPECT_NEAR(got.fit.squared_error, want.fit.squared_error, 1e-9 * want.fit.squared_error);
    }
  }
}

TEST(ExtractPipelineTest, TwoDevicesStoreWhatOneDeviceStores) {
  auto tokens = Tokens(TokenFile("t4.bin", 31 * kCtx));
  InMemoryDataset one, two;
  one.width = two.width = 64;
  auto r1 = Replicas(1), r2 = Replicas(2);
  InMemoryRowSink s1(&one), s2(&two);
  ASSERT_TRUE(RunExtractPipeline(*tokens, &r1, &s1, Opts(), {}).ok());
  ASSERT_TRUE(RunExtractPipeline(*tokens, &r2, &s2, Opts(), {}).ok());
  ExpectSameDataset(one, two);
}

TEST(ExtractPipelineTest, AFailedCommitLeavesOnlyCommittedRowsAndTheRetryCompletes) {
  auto tokens = Tokens(TokenFile("t5.bin", 30 * kCtx));
  InMemoryDataset ds, want;
  ds.width = want.width = 64;
  {
    auto replicas = Replicas(1);
    InMemoryRowSink sink(&want);
    ASSERT_TRUE(RunExtractPipeline(*tokens, &replicas, &sink, Opts(), {}).ok());
  }
  {
    auto replicas = Replicas(2);
    InMemoryRowSink sink(&ds, /*fail_commit_at=*/3);
    auto r = RunExtractPipeline(*tokens, &replicas, &sink, Opts(), {});
    EXPECT_EQ(r.status().code(), absl::StatusCode::kUnavailable);
    EXPECT_EQ(ds.rows(), 2 * 48);  // two commits of two batches each
  }
  auto replicas = Replicas(2);
  InMemoryRowSink sink(&ds);
  ASSERT_TRUE(RunExtractPipeline(*tokens, &replicas, &sink, Opts(), {}).ok());
  ExpectSameDataset(ds, want);
}

TEST(ExtractPipelineTest, TokenIdBeyondTheVocabularyFailsWithoutPartialData) {
  auto tokens = Tokens(TokenFile("t6.bin", 30 * kCtx, kVocab + 1));
  auto replicas = Replicas(1);
  InMemoryDataset ds;
  ds.width = 64;
  InMemoryRowSink sink(&ds);
  auto r = RunExtractPipeline(*tokens, &replicas, &sink, Opts(), {});
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(r.status().message()).find("vocab_size"), std::string::npos);
  EXPECT_EQ(ds.rows() % 48, 0);
  EXPECT_FALSE(ds.complete);
}

TEST(ExtractPipelineTest, NonFiniteActivationsFailOrAreSkippedByPolicy) {
  auto tokens = Tokens(TokenFile("t7.bin", 30 * kCtx));
  std::vector<int64_t> ids(30 * kCtx);
  ASSERT_TRUE(tokens->Read(0, 30, ids.data()).ok());
  const int nan_token = static_cast<int>(ids[100]);
  {
    auto replicas = Replicas(1, nan_token);
    InMemoryDataset ds;
    ds.width = 64;
    InMemoryRowSink sink(&ds);
    auto r = RunExtractPipeline(*tokens, &replicas, &sink, Opts(), {});
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(std::string(r.status().message()).find("non-finite"), std::string::npos);
    EXPECT_LE(ds.rows(), 100);
  }
  auto replicas = Replicas(1, nan_token);
  InMemoryDataset ds;
  ds.width = 64;
  InMemoryRowSink sink(&ds);
  PipelineOptions o = Opts();
  o.skip_non_finite = true;
  auto r = RunExtractPipeline(*tokens, &replicas, &sink, o, {});
  ASSERT_TRUE(r.ok()) << r.status();
  int64_t expected_skips = std::count(ids.begin(), ids.end(), nan_token);
  EXPECT_EQ(r->rows_skipped_non_finite, expected_skips);
  for (int64_t row = 0; row < ds.rows(); ++row) {
    const bool empty = ds.indptr[row + 1] == ds.indptr[row];
    if (ds.token_ids[row] == nan_token) {
      EXPECT_TRUE(empty);
    }
  }
  for (float v : ds.values) EXPECT_TRUE(std::isfinite(v));
}

TEST(ExtractPipelineTest, RunsTheReferenceModelAndReportsProgress) {
  latentd::v1::ReferenceModelSpec spec;
  spec.set_d_model(16);
  spec.set_n_layers(2);
  spec.set_n_heads(2);
  spec.set_vocab_size(kVocab);
  spec.set_context_length(kCtx);
  auto tokens = Tokens(TokenFile("t8.bin", 12 * kCtx));
  std::vector<PipelineReplica> replicas(1);
  replicas[0].model =
      std::move(*CreateReferenceModel(spec, *ParseHookName("blocks.1.hook_resid_post"), at::kCPU));
  replicas[0].saes = {MakeSae(SaeArchitecture::kTopK, 16, 4)};
  InMemoryDataset ds;
  ds.width = 64;
  InMemoryRowSink sink(&ds);
  std::vector<int64_t> progress;
  int telemetry = 0;
  PipelineCallbacks cb;
  cb.progress = [&](int64_t done, int64_t total) {
    EXPECT_EQ(total, 12 * kCtx);
    progress.push_back(done);
  };
  cb.telemetry = [&](const latentd::v1::ExtractTelemetry& t) {
    ++telemetry;
    EXPECT_GT(t.bytes_committed(), 0);
    EXPECT_GT(t.host_rss_bytes(), 0);
  };
  auto r = RunExtractPipeline(*tokens, &replicas, &sink, Opts(), cb);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_GE(progress.size(), 2u);
  // A report where the run starts, so a job committing once still shows its total (and a rate).
  EXPECT_EQ(progress.front(), 0);
  EXPECT_EQ(progress.back(), 12 * kCtx);
  EXPECT_TRUE(std::is_sorted(progress.begin(), progress.end()));
  EXPECT_GE(telemetry, 1);
  EXPECT_EQ(r->nnz_this_run, static_cast<int64_t>(ds.indices.size()));
}

TEST(ExtractPipelineTest, SaeWidthMismatchIsInvalidArgument) {
  auto tokens = Tokens(TokenFile("t9.bin", 4 * kCtx));
  auto replicas = Replicas(1);
  replicas[0].saes = {MakeSae(SaeArchitecture::kTopK, 8, 1)};
  InMemoryDataset ds;
  ds.width = 64;
  InMemoryRowSink sink(&ds);
  EXPECT_EQ(RunExtractPipeline(*tokens, &replicas, &sink, Opts(), {}).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// Replicas of a TwoHookModel returning `hooks`, hook h encoded by SAE seed 30 + h.
std::vector<PipelineReplica> HookReplicas(int n, std::vector<int> hooks, int nan_token = -1) {
  std::vector<PipelineReplica> out;
  for (int i = 0; i < n; ++i) {
    PipelineReplica r;
    r.model = std::make_unique<TwoHookModel>(hooks, nan_token);
    for (int h : hooks) r.saes.push_back(MakeSae(SaeArchitecture::kRelu, 16, 30 + h));
    r.cpu_threads = 1;
    out.push_back(std::move(r));
  }
  return out;
}

// What each hook's dataset holds when the model reads it alone.
std::vector<InMemoryDataset> OneHookRuns(const TokenSource& tokens) {
  std::vector<InMemoryDataset> want(2);
  for (int h = 0; h < 2; ++h) {
    want[h].width = 64;
    auto replicas = HookReplicas(1, {h});
    InMemoryRowSink sink(&want[h]);
    auto r = RunExtractPipeline(tokens, &replicas, &sink, Opts(), {});
    EXPECT_TRUE(r.ok()) << r.status();
  }
  return want;
}

TEST(ExtractPipelineTest, TwoHooksFillTwoSinksAsTwoOneHookRuns) {
  auto tokens = Tokens(TokenFile("t10.bin", 25 * kCtx));
  const std::vector<InMemoryDataset> want = OneHookRuns(*tokens);
  EXPECT_NE(want[0].indices, want[1].indices);
  for (int devices : {1, 2}) {
    std::vector<InMemoryDataset> got(2);
    got[0].width = got[1].width = 64;
    InMemoryRowSink s0(&got[0]), s1(&got[1]);
    auto replicas = HookReplicas(devices, {0, 1});
    auto r = RunExtractPipeline(*tokens, &replicas, {&s0, &s1}, Opts(), {});
    ASSERT_TRUE(r.ok()) << r.status();
    ASSERT_EQ(r->outputs.size(), 2u);
    for (int h = 0; h < 2; ++h) {
      ExpectSameDataset(got[h], want[h]);
      EXPECT_TRUE(got[h].complete);
      EXPECT_EQ(r->outputs[h].rows, 25 * kCtx);
      EXPECT_EQ(r->outputs[h].nnz_this_run, static_cast<int64_t>(got[h].indices.size()));
    }
    EXPECT_EQ(r->rows_this_run, 25 * kCtx);  // the model ran over each row once
    EXPECT_EQ(r->nnz_this_run, r->outputs[0].nnz_this_run + r->outputs[1].nnz_this_run);
  }
  // DENSE outputs have no SAE to fit.
  {
    std::vector<InMemoryDataset> dense(2);
    dense[0].width = dense[1].width = 16;
    InMemoryRowSink d0(&dense[0]), d1(&dense[1]);
    auto replicas = HookReplicas(1, {0, 1});
    auto r = RunExtractPipeline(*tokens, &replicas, {&d0, &d1}, Opts(false), {});
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->outputs[0].fit.rows, 0);
    EXPECT_EQ(dense[1].values.size(), 25u * kCtx * 16);
  }
  // Hooks in the other order fill the sinks in that order.
  std::vector<InMemoryDataset> swapped(2);
  swapped[0].width = swapped[1].width = 64;
  InMemoryRowSink s0(&swapped[0]), s1(&swapped[1]);
  auto replicas = HookReplicas(1, {1, 0});
  ASSERT_TRUE(RunExtractPipeline(*tokens, &replicas, {&s0, &s1}, Opts(), {}).ok());
  ExpectSameDataset(swapped[0], want[1]);
  ExpectSameDataset(swapped[1], want[0]);
  // One sink per hook, no fewer.
  InMemoryDataset lone;
  lone.width = 64;
  InMemoryRowSink sink(&lone);
  EXPECT_EQ(RunExtractPipeline(*tokens, &replicas, &sink, Opts(), {}).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// A crash between two outputs' commits leaves them at different watermarks: the next run
// starts the model at the earlier one and each output takes only the rows past its own.
TEST(ExtractPipelineTest, OutputsResumeAtTheirOwnWatermarks) {
  auto tokens = Tokens(TokenFile("t11.bin", 30 * kCtx));
  const std::vector<InMemoryDataset> want = OneHookRuns(*tokens);
  std::vector<InMemoryDataset> got(2);
  got[0].width = got[1].width = 64;
  {
    InMemoryRowSink s0(&got[0]), s1(&got[1], /*fail_commit_at=*/2);
    auto replicas = HookReplicas(2, {0, 1});
    auto r = RunExtractPipeline(*tokens, &replicas, {&s0, &s1}, Opts(), {});
    EXPECT_EQ(r.status().code(), absl::StatusCode::kUnavailable) << r.status();
  }
  ASSERT_EQ(got[0].rows(), 2 * 48);  // output 0 committed its second commit, output 1 did not
  ASSERT_EQ(got[1].rows(), 48);
  InMemoryRowSink s0(&got[0]), s1(&got[1]);
  auto replicas = HookReplicas(2, {0, 1});
  std::vector<int64_t> progress;
  PipelineCallbacks cb;
  cb.progress = [&](int64_t done, int64_t) { progress.push_back(done); };
  auto r = RunExtractPipeline(*tokens, &replicas, {&s0, &s1}, Opts(), cb);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(progress.front(), 48);  // what both outputs held
  EXPECT_EQ(r->rows_this_run, 30 * kCtx - 48);
  EXPECT_EQ(r->outputs[0].rows_this_run, 30 * kCtx - 96);
  EXPECT_EQ(r->outputs[1].rows_this_run, 30 * kCtx - 48);
  EXPECT_EQ(r->outputs[0].fit.rows, 30 * kCtx - 96);  // the rows this run stored
  EXPECT_EQ(r->outputs[1].fit.rows, 30 * kCtx - 48);
  ExpectSameDataset(got[0], want[0]);
  ExpectSameDataset(got[1], want[1]);
}

TEST(ExtractPipelineTest, NonFiniteRowsAreJudgedPerOutput) {
  auto tokens = Tokens(TokenFile("t12.bin", 20 * kCtx));
  std::vector<int64_t> ids(20 * kCtx);
  ASSERT_TRUE(tokens->Read(0, 20, ids.data()).ok());
  const int nan_token = static_cast<int>(ids[50]);
  {
    std::vector<InMemoryDataset> got(2);
    got[0].width = got[1].width = 64;
    InMemoryRowSink s0(&got[0]), s1(&got[1]);
    auto replicas = HookReplicas(1, {0, 1}, nan_token);
    auto r = RunExtractPipeline(*tokens, &replicas, {&s0, &s1}, Opts(), {});
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(r.status().message().find("of output 1"), std::string::npos) << r.status();
    EXPECT_EQ(got[0].rows(), got[1].rows());  // nothing beyond the last commit of either
  }
  std::vector<InMemoryDataset> got(2);
  got[0].width = got[1].width = 64;
  InMemoryRowSink s0(&got[0]), s1(&got[1]);
  auto replicas = HookReplicas(1, {0, 1}, nan_token);
  PipelineOptions o = Opts();
  o.skip_non_finite = true;
  auto r = RunExtractPipeline(*tokens, &replicas, {&s0, &s1}, o, {});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->outputs[0].rows_skipped_non_finite, 0);
  EXPECT_EQ(r->outputs[1].rows_skipped_non_finite, std::count(ids.begin(), ids.end(), nan_token));
  // NaN rows count for nothing in the fit, which stays finite.
  EXPECT_EQ(r->outputs[0].fit.rows, 20 * kCtx);
  EXPECT_EQ(r->outputs[1].fit.rows, 20 * kCtx - r->outputs[1].rows_skipped_non_finite);
  EXPECT_TRUE(std::isfinite(r->outputs[1].fit.explained_variance()));
  EXPECT_TRUE(std::isfinite(r->outputs[1].fit.mean_cosine()));
  for (int64_t row = 0; row < got[0].rows(); ++row) {
    if (ids[row] != nan_token) continue;
    EXPECT_GT(got[0].indptr[row + 1], got[0].indptr[row]);  // hook 0 is finite there
    EXPECT_EQ(got[1].indptr[row + 1], got[1].indptr[row]);  // hook 1's row is stored empty
  }
}

}  // namespace
}  // namespace latentd::engine
