#include "engine/extract_job.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <fstream>
#include <map>
#include <random>
#include <set>

#include "common/safetensors.h"
#include "engine/crosscoder_model.h"
#include "engine/extract_runner.h"
#include "engine/hook_name.h"
#include "engine/job_context_testing.h"
#include "engine/reference_model.h"
#include "engine/sae.h"
#include "gtest/gtest.h"
#include "storage/chunk_store.h"
#include "storage/db.h"

namespace latentd::engine {
namespace {

constexpr int kCtx = 8;

std::string Tmp(const std::string& name) {
  std::string d = std::string(getenv("TEST_TMPDIR") ? getenv("TEST_TMPDIR") : "/tmp") + "/" + name;
  mkdir(d.c_str(), 0755);
  return d;
}

// What a runner reported to `ctx`: the rows done of each progress report (in rows), the
// EXTRACT telemetry, the WARNING log lines.
std::vector<int64_t> RowsDone(const RecordingJobContext& ctx) {
  std::vector<int64_t> done;
  for (const RecordingJobContext::Progress& p : ctx.progress()) {
    EXPECT_EQ(p.unit, "rows");
    done.push_back(p.done);
  }
  return done;
}
std::vector<latentd::v1::ExtractTelemetry> ExtractSamples(const RecordingJobContext& ctx) {
  std::vector<latentd::v1::ExtractTelemetry> samples;
  for (const latentd::v1::Telemetry& t : ctx.telemetry()) {
    EXPECT_TRUE(t.has_extract());
    samples.push_back(t.extract());
  }
  return samples;
}
std::vector<std::string> Warnings(const RecordingJobContext& ctx) {
  std::vector<std::string> lines;
  for (const RecordingJobContext::LogLine& line : ctx.logs()) {
    if (line.level == latentd::v1::LogLine::WARNING) lines.push_back(line.text);
  }
  return lines;
}

class ExtractJobTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = Tmp("root");
    std::vector<uint16_t> ids(40 * kCtx);
    std::mt19937 rng(1);
    for (auto& t : ids) t = rng() % 64;
    std::ofstream(root_ + "/tokens.bin", std::ios::binary)
        .write(reinterpret_cast<char*>(ids.data()), ids.size() * 2);
    at::manual_seed(2);
    SaeConfig cfg;
    cfg.d_in = 16;
    cfg.d_sae = 48;
    cfg.k = 5;
    cfg.architecture = SaeArchitecture::kTopK;
    at::Tensor dec = at::randn({48, 16});
    dec = dec / dec.norm(2, 1, true);
    ASSERT_TRUE(SaveSae(Tmp("root/sae"),
                        {dec.t().contiguous(), at::zeros({48}), dec, at::zeros({16}), {}}, cfg)
                    .ok());
    at::Tensor dec2 = at::randn({48, 16});
    dec2 = dec2 / dec2.norm(2, 1, true);
    ASSERT_TRUE(SaveSae(Tmp("root/sae2"),
                        {dec2.t().contiguous(), at::zeros({48}), dec2, at::zeros({16}), {}}, cfg)
                    .ok());
    env_.data_roots = {root_};
  }

  // Spec() with two more outputs: an earlier layer encoded by sae2, and the first output's hook
  // encoded by sae2 into a dataset named "second".
  latentd::v1::ExtractSpec MultiSpec() {
    latentd::v1::ExtractSpec s = Spec();
    latentd::v1::ExtractOutput* early = s.add_more_outputs();
    early->set_hook_name("blocks.0.hook_resid_mid");
    early->mutable_sae()->set_path(root_ + "/sae2");
    latentd::v1::ExtractOutput* same_hook = s.add_more_outputs();
    same_hook->set_hook_name("blocks.1.hook_resid_post");
    same_hook->mutable_sae()->set_path(root_ + "/sae2");
    same_hook->set_dataset_name("second");
    return s;
  }

  // Spec() with the SAE in `sae_dir`, and a second output on the same hook encoded by the SAE in
  // `second_sae_dir` into the dataset `second_name`.
  latentd::v1::ExtractSpec TwoSaesOnOneHook(const std::string& sae_dir,
                                            const std::string& second_sae_dir,
                                            const std::string& second_name) {
    latentd::v1::ExtractSpec s = Spec();
    s.mutable_sae()->set_path(sae_dir);
    latentd::v1::ExtractOutput* more = s.add_more_outputs();
    more->set_hook_name(s.hook_name());
    more->mutable_sae()->set_path(second_sae_dir);
    more->set_dataset_name(second_name);
    return s;
  }

  latentd::v1::ExtractSpec Spec() {
    latentd::v1::ExtractSpec s;
    auto* m = s.mutable_model()->mutable_reference();
    m->set_d_model(16);
    m->set_n_layers(2);
    m->set_n_heads(2);
    m->set_vocab_size(64);
    m->set_context_length(kCtx);
    s.set_hook_name("blocks.1.hook_resid_post");
    s.mutable_tokens()->set_path(root_ + "/tokens.bin");
    s.mutable_tokens()->set_context_length(kCtx);
    s.mutable_sae()->set_path(root_ + "/sae");
    s.set_batch_sequences(3);
    s.set_commit_rows(30);
    return s;
  }

  // The token file's 40 sequences, [40, kCtx] int64.
  at::Tensor Tokens() const {
    std::vector<uint16_t> ids(40 * kCtx);
    std::ifstream(root_ + "/tokens.bin", std::ios::binary)
        .read(reinterpret_cast<char*>(ids.data()), ids.size() * 2);
    return at::tensor(std::vector<int64_t>(ids.begin(), ids.end())).view({40, kCtx});
  }

  std::unique_ptr<storage::Db> OpenDb(const std::string& name) {
    auto db = storage::Db::Open(Tmp(name));
    EXPECT_TRUE(db.ok()) << db.status();
    return std::move(*db);
  }

  std::string root_;
  ExtractEnv env_;
};

absl::StatusCode Code(const latentd::v1::ExtractSpec& s, const ExtractEnv& env) {
  return ValidateExtractSpec(s, env).code();
}

TEST_F(ExtractJobTest, ValidateRejectsBadSpecsNamingTheField) {
  EXPECT_TRUE(ValidateExtractSpec(Spec(), env_).ok()) << ValidateExtractSpec(Spec(), env_);
  auto s = Spec();
  s.mutable_tokens()->set_path("/etc/passwd");
  EXPECT_EQ(Code(s, env_), absl::StatusCode::kPermissionDenied);
  s = Spec();
  s.mutable_tokens()->set_path(root_ + "/../root/tokens.bin");  // resolves inside: fine
  EXPECT_EQ(Code(s, env_), absl::StatusCode::kOk);
  s.mutable_tokens()->set_path(root_ + "/missing.bin");
  EXPECT_EQ(Code(s, env_), absl::StatusCode::kNotFound);
  s = Spec();
  s.set_hook_name("blocks.1.resid");
  auto st = ValidateExtractSpec(s, env_);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(st.message()).find("extract.hook_name"), std::string::npos);
  s.set_hook_name("blocks.2.hook_resid_post");  // 2 layers
  EXPECT_EQ(Code(s, env_), absl::StatusCode::kInvalidArgument);
  s = Spec();
  s.set_hook_name("blocks.1.mlp.hook_post");  // width 64 != d_in 16
  st = ValidateExtractSpec(s, env_);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(st.message()).find("d_in"), std::string::npos);
  s = Spec();
  s.set_batch_sequences(-1);
  EXPECT_EQ(Code(s, env_), absl::StatusCode::kInvalidArgument);
  s = Spec();
  s.mutable_sae()->set_path(root_);  // no cfg.json
  EXPECT_EQ(Code(s, env_), absl::StatusCode::kNotFound);
  s = Spec();
  s.mutable_tokens()->set_context_length(kCtx + 1);  // beyond the model's context
  EXPECT_EQ(Code(s, env_), absl::StatusCode::kInvalidArgument);
  s = Spec();
  s.clear_model();
  EXPECT_EQ(Code(s, env_), absl::StatusCode::kInvalidArgument);
  ExtractEnv small = env_;
  small.device_memory_bytes = 4096;
  EXPECT_EQ(Code(Spec(), small), absl::StatusCode::kInvalidArgument);
  ExtractEnv no_roots = env_;
  no_roots.data_roots.clear();
  EXPECT_EQ(Code(Spec(), no_roots), absl::StatusCode::kPermissionDenied);
}

// After the rows are stored, the SAE's downstream loss over sequences spread over the shard (4 of
// 40: sequences 0, 10, 20, 30); asked of a job without an SAE, refused at submit.
TEST_F(ExtractJobTest, DownstreamLossIsMeasuredOverSequencesSpreadOverTheShard) {
  auto db = OpenDb("db_downstream");
  storage::ChunkStore store(db.get());
  env_.store = &store;
  RecordingJobContext ctx(1, 11);
  latentd::v1::ExtractSpec spec = Spec();
  spec.set_downstream_loss_sequences(4);
  auto result = RunExtract(spec, env_, &ctx);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->rows(), 40 * kCtx);  // every row stored, the loss on 4 sequences
  const latentd::v1::DownstreamLoss& d = result->downstream_loss();
  EXPECT_EQ(d.predictions(), 4 * (kCtx - 1));
  EXPECT_GT(d.clean(), 0);
  EXPECT_NE(d.with_sae(), d.clean());
  EXPECT_NE(d.zero_ablated(), d.clean());
  EXPECT_NEAR(d.recovered(), (d.zero_ablated() - d.with_sae()) / (d.zero_ablated() - d.clean()),
              1e-9);
  // A random model barely notices the hook zeroed: the fraction is flagged, not trusted.
  EXPECT_EQ(d.recovered_unreliable(), d.zero_ablated() - d.clean() < 0.01 * d.clean());
  // The clean loss is the model's own over sequences 0, 10, 20 and 30.
  const at::Tensor sampled = Tokens().index_select(0, at::tensor({0, 10, 20, 30}));
  auto model = CreateReferenceModel(*ResolveReferenceSpec(spec.model().reference()),
                                    *ParseHookName(spec.hook_name()), at::kCPU);
  ASSERT_TRUE(model.ok());
  double want = 0;
  {
    c10::InferenceMode inference;
    want = (*model)->NextTokenLossSum(sampled, {}) / (4 * (kCtx - 1));
  }
  EXPECT_NEAR(d.clean(), want, 1e-5 * want);
  // Not asked: not measured.
  RecordingJobContext plain_ctx(1, 12);
  auto plain = RunExtract(Spec(), env_, &plain_ctx);
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_FALSE(plain->has_downstream_loss());

  spec = Spec();
  spec.set_downstream_loss_sequences(-1);
  EXPECT_NE(ValidateExtractSpec(spec, env_).message().find("extract.downstream_loss_sequences"),
            std::string::npos);
  spec.set_downstream_loss_sequences(4);
  spec.set_mode(latentd::v1::DENSE);
  spec.clear_sae();
  EXPECT_NE(ValidateExtractSpec(spec, env_)
                .message()
                .find("extract.downstream_loss_sequences: measures an SAE's reconstruction"),
            std::string::npos)
      << ValidateExtractSpec(spec, env_);
}

// Two SAEs on one hook: each its own loss with the SAE, one zero-ablated loss for both, and the
// same figures as each SAE measured alone.
TEST_F(ExtractJobTest, DownstreamLossOfTwoSaesOnOneHook) {
  auto db = OpenDb("db_downstream_two");
  storage::ChunkStore store(db.get());
  env_.store = &store;
  const std::string other = root_ + "/sae2";
  latentd::v1::ExtractSpec spec = TwoSaesOnOneHook(root_ + "/sae", other, "second");
  spec.set_downstream_loss_sequences(3);
  RecordingJobContext ctx(1, 13);
  auto both = RunExtract(spec, env_, &ctx);
  ASSERT_TRUE(both.ok()) << both.status();
  const latentd::v1::DownstreamLoss& first = both->downstream_loss();
  const latentd::v1::DownstreamLoss& second = both->more_outputs(0).downstream_loss();
  EXPECT_EQ(first.zero_ablated(), second.zero_ablated());
  EXPECT_EQ(first.clean(), second.clean());
  EXPECT_NE(first.with_sae(), second.with_sae());
  latentd::v1::ExtractSpec alone = Spec();
  alone.mutable_sae()->set_path(other);
  alone.set_dataset_name("alone");
  alone.set_downstream_loss_sequences(3);
  RecordingJobContext alone_ctx(1, 14);
  auto single = RunExtract(alone, env_, &alone_ctx);
  ASSERT_TRUE(single.ok()) << single.status();
  EXPECT_NEAR(single->downstream_loss().with_sae(), second.with_sae(), 1e-6);
  EXPECT_NEAR(single->downstream_loss().zero_ablated(), second.zero_ablated(), 1e-6);
}

TEST_F(ExtractJobTest, RunsIntoTheChunkStoreAndMatchesTheInMemoryRun) {
  auto db = OpenDb("db1");
  storage::ChunkStore store(db.get());
  env_.store = &store;
  RecordingJobContext ctx(1, 7);
  auto result = RunExtract(Spec(), env_, &ctx);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->rows(), 40 * kCtx);
  EXPECT_GT(result->bytes_per_token(), 0);
  auto id = store.FindDataset("extract-7");
  ASSERT_TRUE(id.ok());
  EXPECT_EQ(*id, result->dataset_id());
  auto rows = store.ReadRows(*id, 0, 0);
  ASSERT_TRUE(rows.ok()) << rows.status();

  InMemoryDataset mem;
  mem.width = 48;
  SinkOpener opener = [&](const ExtractDatasetMeta& m) -> absl::StatusOr<OpenedSink> {
    EXPECT_EQ(m.encoder, "topk");
    EXPECT_EQ(m.width, 48);
    EXPECT_EQ(m.rows_planned, 40 * kCtx);
    return OpenedSink{1, std::make_unique<InMemoryRowSink>(&mem)};
  };
  RecordingJobContext ctx2(1, 8);
  ASSERT_TRUE(RunExtractToSink(Spec(), env_, &ctx2, opener).ok());
  EXPECT_EQ(rows->token_ids, mem.token_ids);
  EXPECT_EQ(rows->indptr, mem.indptr);
  ASSERT_EQ(rows->indices.size(), mem.indices.size());
  for (size_t i = 0; i < mem.indices.size(); ++i) {
    EXPECT_EQ(rows->indices[i], mem.indices[i]);
    EXPECT_NEAR(rows->values[i], mem.values[i], 1e-3 * std::abs(mem.values[i]) + 1e-6);
  }
  EXPECT_EQ(RowsDone(ctx).back(), 40 * kCtx);
  ASSERT_FALSE(ExtractSamples(ctx).empty());
  EXPECT_EQ(ExtractSamples(ctx).back().rows_total(), 40 * kCtx);
  EXPECT_GT(ExtractSamples(ctx).back().bytes_committed(), 0);

  // A rerun of the finished job is a no-op returning the same dataset.
  auto again = RunExtract(Spec(), env_, &ctx);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->dataset_id(), *id);
  // The name taken by another job.
  RecordingJobContext other(1, 9);
  auto spec = Spec();
  spec.set_dataset_name("extract-7");
  EXPECT_EQ(RunExtract(spec, env_, &other).status().code(), absl::StatusCode::kAlreadyExists);
}

// An SAE wider than 2^17 latents: the store's writer keeps no per-latent state (operands,
// floors, folds) and sorts each commit in its compact latent space. The job must store what the
// in-memory run holds, and the per-latent index must answer as a brute force over those rows.
TEST_F(ExtractJobTest, WideSaeIsStoredAndIndexedAsTheInMemoryRun) {
  constexpr int32_t kWide = (1 << 17) + 64;
  SaeConfig cfg;
  cfg.d_in = 16;
  cfg.d_sae = kWide;
  cfg.k = 5;
  cfg.architecture = SaeArchitecture::kTopK;
  at::manual_seed(3);
  at::Tensor dec = at::randn({kWide, 16});
  dec = dec / dec.norm(2, 1, true);
  ASSERT_TRUE(SaveSae(Tmp("root/wide_sae"),
                      {dec.t().contiguous(), at::zeros({kWide}), dec, at::zeros({16}), {}}, cfg)
                  .ok());
  latentd::v1::ExtractSpec spec = Spec();
  spec.mutable_sae()->set_path(root_ + "/wide_sae");
  spec.set_commit_rows(16);  // 20 commits: operands, folds and floors all happen

  auto db = OpenDb("db_wide");
  storage::ChunkStore store(db.get());
  env_.store = &store;
  RecordingJobContext ctx(1, 11);
  auto result = RunExtract(spec, env_, &ctx);
  ASSERT_TRUE(result.ok()) << result.status();
  InMemoryDataset mem;
  mem.width = kWide;
  SinkOpener opener = [&](const ExtractDatasetMeta&) -> absl::StatusOr<OpenedSink> {
    return OpenedSink{1, std::make_unique<InMemoryRowSink>(&mem)};
  };
  RecordingJobContext ctx2(1, 12);
  ASSERT_TRUE(RunExtractToSink(spec, env_, &ctx2, opener).ok());
  auto rows = store.ReadRows(result->dataset_id(), 0, 0);
  ASSERT_TRUE(rows.ok()) << rows.status();
  ASSERT_EQ(rows->indptr, mem.indptr);
  ASSERT_EQ(rows->indices, mem.indices);

  // Brute force over the stored rows: every latent's firings and its best row.
  std::map<int32_t, std::vector<std::pair<float, int64_t>>> by_latent;
  for (int64_t r = 0; r + 1 < static_cast<int64_t>(rows->indptr.size()); ++r) {
    for (int64_t i = rows->indptr[r]; i < rows->indptr[r + 1]; ++i) {
      by_latent[rows->indices[i]].emplace_back(rows->values[i], r);
    }
  }
  ASSERT_GT(by_latent.size(), 100u);
  for (auto& [latent, firings] : by_latent) {
    auto stats = store.GetLatentStats(result->dataset_id(), latent);
    ASSERT_TRUE(stats.ok()) << stats.status();
    ASSERT_EQ(stats->firing_count, static_cast<int64_t>(firings.size())) << "latent " << latent;
    std::sort(firings.begin(), firings.end(), [](const auto& a, const auto& b) {
      return a.first != b.first ? a.first > b.first : a.second < b.second;
    });
    EXPECT_EQ(stats->max, firings.front().first);
    auto top = store.TopActivations(result->dataset_id(), latent, 1, 0, 0);
    ASSERT_TRUE(top.ok()) << top.status();
    ASSERT_EQ(top->size(), 1u);
    EXPECT_EQ((*top)[0].row, firings.front().second) << "latent " << latent;
  }
  auto info = store.GetDataset(result->dataset_id());
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->dead_latents(), kWide - static_cast<int64_t>(by_latent.size()));
}

TEST_F(ExtractJobTest, CancelledJobsResumeToTheUninterruptedDataset) {
  for (int devices : {1, 2}) {
    auto db = OpenDb("db_resume" + std::to_string(devices));
    storage::ChunkStore store(db.get());
    env_.store = &store;
    RecordingJobContext straight(devices, 100);
    ASSERT_TRUE(RunExtract(Spec(), env_, &straight).ok());
    int runs = 0;
    absl::StatusOr<latentd::v1::ExtractResult> r = absl::CancelledError("");
    while (!r.ok()) {
      ASSERT_EQ(r.status().code(), absl::StatusCode::kCancelled) << r.status();
      ASSERT_LT(++runs, 40);
      RecordingJobContext ctx(devices, 200);
      ctx.CancelAfterChecks(2 + runs % 3);
      r = RunExtract(Spec(), env_, &ctx);
    }
    EXPECT_GT(runs, 1);
    // The SAE's fit over every row, although each run computed only some of them.
    const latentd::v1::SaeFit straight_fit =
        store.GetDataset(*store.FindDataset("extract-100"))->fit();
    EXPECT_EQ(straight_fit.rows(), 40 * kCtx);
    EXPECT_EQ(r->fit().rows(), 40 * kCtx);
    EXPECT_NEAR(r->fit().explained_variance(), straight_fit.explained_variance(), 1e-9);
    EXPECT_NEAR(r->fit().cosine_similarity(), straight_fit.cosine_similarity(), 1e-9);
    auto a = store.ReadRows(*store.FindDataset("extract-100"), 0, 0);
    auto b = store.ReadRows(*store.FindDataset("extract-200"), 0, 0);
    ASSERT_TRUE(a.ok() && b.ok());
    EXPECT_EQ(a->token_ids, b->token_ids);
    EXPECT_EQ(a->indptr, b->indptr);
    EXPECT_EQ(a->indices, b->indices);
    EXPECT_EQ(a->values, b->values);
  }
}

void ExpectSameRows(storage::ChunkStore* store, uint64_t a_id, uint64_t b_id) {
  auto a = store->ReadRows(a_id, 0, 0);
  auto b = store->ReadRows(b_id, 0, 0);
  ASSERT_TRUE(a.ok() && b.ok()) << a.status() << b.status();
  EXPECT_EQ(a->token_ids, b->token_ids);
  EXPECT_EQ(a->indptr, b->indptr);
  EXPECT_EQ(a->indices, b->indices);
  EXPECT_EQ(a->values, b->values);
}

// One job of three outputs stores, in three datasets, exactly what three one-hook jobs store.
TEST_F(ExtractJobTest, MoreOutputsStoreWhatOneHookJobsStore) {
  auto db = OpenDb("db_multi");
  storage::ChunkStore store(db.get());
  env_.store = &store;
  const latentd::v1::ExtractSpec multi = MultiSpec();
  ASSERT_TRUE(ValidateExtractJob(multi, env_).ok()) << ValidateExtractJob(multi, env_);
  RecordingJobContext ctx(1, 20);
  auto result = RunExtract(multi, env_, &ctx);
  ASSERT_TRUE(result.ok()) << result.status();
  const std::vector<std::string> names = {"extract-20", "extract-20.blocks.0.hook_resid_mid",
                                          "second"};
  ASSERT_EQ(result->more_outputs_size(), 2);
  EXPECT_EQ(result->dataset_id(), *store.FindDataset(names[0]));
  for (int o = 0; o < 3; ++o) {
    auto id = store.FindDataset(names[o]);
    ASSERT_TRUE(id.ok()) << names[o];
    auto info = store.GetDataset(*id);
    ASSERT_TRUE(info.ok());
    EXPECT_TRUE(info->complete());
    EXPECT_EQ(info->rows_committed(), 40 * kCtx);
    EXPECT_EQ(info->hook_name(), ExtractOutputSpec(multi, o).hook_name());
    if (o > 0) {
      const latentd::v1::ExtractOutputResult& more = result->more_outputs(o - 1);
      EXPECT_EQ(more.dataset_id(), *id);
      EXPECT_EQ(more.dataset_name(), names[o]);
      EXPECT_EQ(more.hook_name(), info->hook_name());
      EXPECT_EQ(more.rows(), 40 * kCtx);
      EXPECT_EQ(more.nnz(), info->nnz());
      EXPECT_GT(more.bytes_per_token(), 0);
    }
    latentd::v1::ExtractSpec one = ExtractOutputSpec(multi, o);
    one.set_dataset_name("alone-" + std::to_string(o));
    RecordingJobContext alone(1, 30 + o);
    auto single = RunExtract(one, env_, &alone);
    ASSERT_TRUE(single.ok()) << single.status();
    ExpectSameRows(&store, *id, single->dataset_id());
  }
  // The same SAE on two hooks, and two SAEs on one hook, give different rows.
  auto first = store.ReadRows(*store.FindDataset(names[0]), 0, 0);
  auto second = store.ReadRows(*store.FindDataset(names[2]), 0, 0);
  ASSERT_TRUE(first.ok() && second.ok());
  EXPECT_NE(first->indices, second->indices);
  EXPECT_EQ(RowsDone(ctx).back(), 40 * kCtx);
}

// An SAE whose cfg.json names the hook it was trained on is checked against the hook it is given
// (other names of the same activation count as the same): a mismatch is warned at the start.
TEST_F(ExtractJobTest, AnSaeTrainedOnAnotherHookIsWarnedAtTheStart) {
  auto sae = Sae::Load(root_ + "/sae");
  ASSERT_TRUE(sae.ok());
  SaeConfig elsewhere = sae->config();
  elsewhere.hook_name = "blocks.0.hook_resid_post";
  ASSERT_TRUE(SaveSae(Tmp("root/sae_layer0"), sae->weights(), elsewhere).ok());
  SaeConfig same = sae->config();
  same.hook_name = "blocks.2.hook_resid_pre";  // what blocks.1.hook_resid_post is, named after
  ASSERT_TRUE(SaveSae(Tmp("root/sae_next_pre"), sae->weights(), same).ok());
  auto db = OpenDb("db_hook_warning");
  storage::ChunkStore store(db.get());
  env_.store = &store;
  // Both on blocks.1.hook_resid_post.
  const latentd::v1::ExtractSpec spec =
      TwoSaesOnOneHook(root_ + "/sae_next_pre", root_ + "/sae_layer0", "layer0");
  RecordingJobContext ctx(1, 71);
  ASSERT_TRUE(RunExtract(spec, env_, &ctx).ok());
  std::vector<std::string> hook_warnings;
  for (const std::string& w : Warnings(ctx)) {
    if (w.find("was trained on hook") != std::string::npos) hook_warnings.push_back(w);
  }
  ASSERT_EQ(hook_warnings.size(), 1u);
  EXPECT_NE(hook_warnings[0].find("dataset layer0: its SAE was trained on hook "
                                  "blocks.0.hook_resid_post (its cfg.json says), and this output "
                                  "reads blocks.1.hook_resid_post"),
            std::string::npos)
      << hook_warnings[0];
}

// Every SPARSE output reports how well its SAE reconstructs the hook; one that does worse than
// the mean is called out: the usual sign of an SAE for another hook or model.
TEST_F(ExtractJobTest, TheSaeFitIsReportedAndAMisfitIsWarned) {
  // A ReLU SAE that reconstructs exactly: latents j and 16 + j are relu(x_j) and relu(-x_j).
  SaeConfig exact_cfg;
  exact_cfg.d_in = 16;
  exact_cfg.d_sae = 48;
  exact_cfg.architecture = SaeArchitecture::kRelu;
  at::Tensor dec = at::zeros({48, 16});
  dec.slice(0, 0, 16) = at::eye(16);
  dec.slice(0, 16, 32) = -at::eye(16);
  ASSERT_TRUE(SaveSae(Tmp("root/exact_sae"),
                      {dec.t().contiguous(), at::zeros({48}), dec, at::zeros({16}), {}}, exact_cfg)
                  .ok());
  // The test's TopK SAE with its decoder 1000 times too long.
  auto sae = Sae::Load(root_ + "/sae");
  ASSERT_TRUE(sae.ok());
  SaeWeights scaled = sae->weights();
  scaled.W_dec = scaled.W_dec * 1000;
  ASSERT_TRUE(SaveSae(Tmp("root/scaled_sae"), scaled, sae->config()).ok());

  auto db = OpenDb("db_fit");
  storage::ChunkStore store(db.get());
  env_.store = &store;
  latentd::v1::ExtractSpec spec =
      TwoSaesOnOneHook(root_ + "/exact_sae", root_ + "/scaled_sae", "scaled");
  RecordingJobContext ctx(1, 70);
  auto result = RunExtract(spec, env_, &ctx);
  ASSERT_TRUE(result.ok()) << result.status();
  const latentd::v1::SaeFit& exact = result->fit();
  EXPECT_EQ(exact.rows(), 40 * kCtx);
  EXPECT_NEAR(exact.explained_variance(), 1.0, 1e-5);
  EXPECT_NEAR(exact.cosine_similarity(), 1.0, 1e-5);
  EXPECT_LT(exact.mse(), 1e-9);
  EXPECT_NEAR(ExtractSamples(ctx).back().explained_variance(), 1.0, 1e-5);
  const latentd::v1::SaeFit& misfit = result->more_outputs(0).fit();
  EXPECT_EQ(misfit.rows(), 40 * kCtx);
  EXPECT_LT(misfit.explained_variance(), -100);
  ASSERT_EQ(Warnings(ctx).size(), 1u);
  EXPECT_NE(Warnings(ctx)[0].find("dataset scaled: the SAE reconstructs hook "
                                  "blocks.1.hook_resid_post worse than the rows' mean"),
            std::string::npos)
      << Warnings(ctx)[0];
  // The datasets keep their totals: a rerun of the finished job computes nothing and reports
  // them, and so does the dataset summary.
  RecordingJobContext rerun(1, 70);
  auto again = RunExtract(spec, env_, &rerun);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->fit().rows(), 40 * kCtx);
  EXPECT_EQ(again->fit().explained_variance(), exact.explained_variance());
  EXPECT_EQ(again->more_outputs(0).fit().explained_variance(), misfit.explained_variance());
  auto info = store.GetDataset(result->dataset_id());
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->fit().rows(), 40 * kCtx);
  EXPECT_EQ(info->fit().explained_variance(), exact.explained_variance());
}

// A transcoder reads one hook and predicts another: its fit and its downstream loss are about
// the hook it predicts. One that computes the MLP's output exactly from mlp.hook_post (z = the
// activations' positive and negative parts, W_dec the MLP's W_out and its negation) fits it
// perfectly and leaves the loss as it is; one on ln2.hook_normalized stores the latents of that
// hook (the MLP's normed input) and is measured against hook_mlp_out, its default output.
TEST_F(ExtractJobTest, ATranscoderIsMeasuredAgainstTheHookItPredicts) {
  auto resolved = ResolveReferenceSpec(Spec().model().reference());
  ASSERT_TRUE(resolved.ok());
  auto model = CreateReferenceModel(
      *resolved,
      {*ParseHookName("blocks.1.hook_resid_mid"), *ParseHookName("blocks.1.ln2.hook_normalized"),
       *ParseHookName("blocks.1.hook_mlp_out")},
      at::kCPU);
  ASSERT_TRUE(model.ok());
  at::Tensor W_out, b_out;
  for (const auto& [name, t] : (*model)->NamedWeights()) {
    if (name == "blocks.1.mlp.W_out") W_out = t;
    if (name == "blocks.1.mlp.b_out") b_out = t;
  }
  ASSERT_EQ(W_out.sizes(), (std::vector<int64_t>{64, 16}));
  SaeConfig exact;
  exact.d_in = 64;
  exact.d_sae = 128;
  exact.architecture = SaeArchitecture::kJumpRelu;
  exact.apply_b_dec_to_input = false;
  exact.transcoder = true;
  exact.d_out = 16;
  exact.hook_name_out = "blocks.1.hook_mlp_out";
  // The activations' positive and negative parts as latents (z = relu(x), relu(-x), threshold 0),
  // decoded through W_out and -W_out: the prediction is x W_out + b_out, the MLP's output.
  // `exact` with its hook_name_out as it stands, in root/<name>.
  auto save_exact = [&](const std::string& name) {
    const at::Tensor eye = at::eye(64);
    return SaveSae(Tmp("root/" + name),
                   {at::cat({eye, -eye}, 1), at::zeros({128}), at::cat({W_out, -W_out}),
                    b_out.clone(), at::zeros({128})},
                   exact);
  };
  ASSERT_TRUE(save_exact("exact_tc").ok());
  SaeConfig ln2 = exact;
  ln2.d_in = 16;
  ln2.d_sae = 48;
  ln2.architecture = SaeArchitecture::kTopK;
  ln2.k = 5;
  ln2.hook_name_out = "";  // the MLP output of its block
  at::manual_seed(5);
  ASSERT_TRUE(
      SaveSae(Tmp("root/ln2_tc"),
              {at::randn({16, 48}), at::zeros({48}), at::randn({48, 16}) * 0.1, at::zeros({16})},
              ln2)
          .ok());

  auto db = OpenDb("db_transcoder");
  storage::ChunkStore store(db.get());
  env_.store = &store;
  latentd::v1::ExtractSpec spec = Spec();
  spec.set_hook_name("blocks.1.mlp.hook_post");
  spec.mutable_sae()->set_path(root_ + "/exact_tc");
  spec.set_downstream_loss_sequences(4);
  latentd::v1::ExtractOutput* more = spec.add_more_outputs();
  more->set_hook_name("blocks.1.ln2.hook_normalized");
  more->mutable_sae()->set_path(root_ + "/ln2_tc");
  more->set_dataset_name("ln2");
  RecordingJobContext ctx(1, 90);
  auto result = RunExtract(spec, env_, &ctx);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->rows(), 40 * kCtx);
  EXPECT_NEAR(result->fit().explained_variance(), 1.0, 1e-5);
  EXPECT_EQ(result->fit().predicted_hook(), "blocks.1.hook_mlp_out");
  EXPECT_EQ(result->more_outputs(0).fit().predicted_hook(), "blocks.1.hook_mlp_out");  // default
  const latentd::v1::DownstreamLoss& d = result->downstream_loss();
  EXPECT_NEAR(d.with_sae(), d.clean(), 1e-5 * d.clean());
  EXPECT_GT(std::abs(d.zero_ablated() - d.clean()), 1e-4);  // the MLP's output zeroed
  auto info = store.GetDataset(result->dataset_id());
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->hook_name(), "blocks.1.mlp.hook_post");
  EXPECT_EQ(info->hook_name_out(), "blocks.1.hook_mlp_out");
  EXPECT_EQ(info->fit().predicted_hook(), "blocks.1.hook_mlp_out");  // the summary says it too

  // The ln2 transcoder, against the same hooks computed here.
  const at::Tensor tokens = Tokens();
  std::vector<at::Tensor> hooked;
  {
    c10::InferenceMode inference;
    hooked = (*model)->ForwardHooks(tokens);
  }
  const at::Tensor mid = hooked[0].reshape({-1, 16}), x = hooked[1].reshape({-1, 16});
  const at::Tensor y = hooked[2].reshape({-1, 16});
  EXPECT_TRUE(at::allclose(x, at::layer_norm(mid, {16}), 1e-5, 1e-5));  // ln2 is ones / zeros
  auto tc = Sae::Load(root_ + "/ln2_tc");
  ASSERT_TRUE(tc.ok());
  const at::Tensor predicted = tc->Predict(x, tc->EncodeSparse(x)).to(at::kDouble);
  const at::Tensor yd = y.to(at::kDouble);
  const double ev = 1 - (yd - predicted).pow(2).sum().item<double>() /
                            (yd - yd.mean(0)).pow(2).sum().item<double>();
  EXPECT_NEAR(result->more_outputs(0).fit().explained_variance(), ev, 1e-6 * std::abs(ev) + 1e-4);
  auto ln2_id = store.FindDataset("ln2");
  ASSERT_TRUE(ln2_id.ok());
  auto rows = store.ReadRows(*ln2_id, 0, 0);
  ASSERT_TRUE(rows.ok());
  const SparseCodes codes = tc->EncodeSparse(x);
  ASSERT_EQ(rows->indptr.back(), codes.values.numel());
  for (int64_t r = 0; r < 40 * kCtx; r += 37) {
    std::set<int> want;
    for (int64_t j = 0; j < 5; ++j) {
      if (codes.values[r][j].item<float>() > 0) want.insert(codes.indices[r][j].item<int>());
    }
    const std::set<int> got(rows->indices.begin() + rows->indptr[r],
                            rows->indices.begin() + rows->indptr[r + 1]);
    EXPECT_EQ(got, want) << "row " << r;
  }

  // Refused at submit: an output hook the forward computes first, or of another width.
  latentd::v1::ExtractSpec bad = Spec();
  bad.set_hook_name("blocks.1.mlp.hook_post");
  exact.hook_name_out = "blocks.0.hook_mlp_out";
  ASSERT_TRUE(save_exact("early_tc").ok());
  bad.mutable_sae()->set_path(root_ + "/early_tc");
  absl::Status s = ValidateExtractSpec(bad, env_);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("computes blocks.0.hook_mlp_out first"), std::string::npos) << s;
  exact.hook_name_out = "blocks.1.mlp.hook_post";  // 64 wide, d_out 16
  ASSERT_TRUE(save_exact("wide_tc").ok());
  bad.set_hook_name("blocks.0.mlp.hook_post");
  bad.mutable_sae()->set_path(root_ + "/wide_tc");
  s = ValidateExtractSpec(bad, env_);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("d_out 16 != width 64"), std::string::npos) << s;
}

// circuit-tracer's cross-layer transcoder on the reference model's two layers: layer L's latents
// read blocks.L.hook_resid_mid and write to blocks.L.hook_mlp_out and every later layer's, so
// layer 1's fit sums the decoders of layers 0 and 1; the job extracts both from one pass.
TEST_F(ExtractJobTest, ACrossLayerTranscodersFitSumsTheLayersTheJobExtracts) {
  const std::string clt = Tmp("root/clt");
  mkdir(clt.c_str(), 0755);
  std::ofstream(clt + "/config.yaml") << "model_kind: cross_layer_transcoder\n"
                                         "feature_input_hook: hook_resid_mid\n"
                                         "feature_output_hook: hook_mlp_out\n";
  at::manual_seed(9);
  std::vector<at::Tensor> W_enc, b_enc, b_dec, W_dec;
  for (int l = 0; l < 2; ++l) {
    W_enc.push_back(at::randn({24, 16}));
    b_enc.push_back(at::randn({24}) * 0.1);
    b_dec.push_back(at::randn({16}) * 0.01);
    W_dec.push_back(at::randn({24, 2 - l, 16}) * 0.01);
    const std::string i = std::to_string(l);
    ASSERT_TRUE(WriteSafetensors(clt + "/W_enc_" + i + ".safetensors",
                                 {{"W_enc_" + i, StDtype::kF32, {24, 16}, W_enc[l].data_ptr()},
                                  {"b_enc_" + i, StDtype::kF32, {24}, b_enc[l].data_ptr()},
                                  {"b_dec_" + i, StDtype::kF32, {16}, b_dec[l].data_ptr()}})
                    .ok());
    ASSERT_TRUE(
        WriteSafetensors(clt + "/W_dec_" + i + ".safetensors",
                         {{"W_dec_" + i, StDtype::kF32, {24, 2 - l, 16}, W_dec[l].data_ptr()}})
            .ok());
  }
  auto db = OpenDb("db_clt");
  storage::ChunkStore store(db.get());
  env_.store = &store;
  // Layer 1 first: its fit waits for the codes of layer 0, the job's second output.
  latentd::v1::ExtractSpec spec = Spec();
  spec.set_hook_name("blocks.1.hook_resid_mid");
  spec.mutable_sae()->set_path(clt);
  spec.set_dataset_name("clt1");
  spec.set_downstream_loss_sequences(40);
  latentd::v1::ExtractOutput* more = spec.add_more_outputs();
  more->set_hook_name("blocks.0.hook_resid_mid");
  more->mutable_sae()->set_path(clt);
  more->set_dataset_name("clt0");
  RecordingJobContext ctx(1, 91);
  auto result = RunExtract(spec, env_, &ctx);
  ASSERT_TRUE(result.ok()) << result.status();
  for (const std::string& w : Warnings(ctx)) {  // (a random CLT: the misfit warning is right)
    EXPECT_EQ(w.find("not measured"), std::string::npos) << w;
  }
  EXPECT_EQ(result->fit().predicted_hook(), "blocks.1.hook_mlp_out");
  EXPECT_EQ(result->more_outputs(0).fit().predicted_hook(), "blocks.0.hook_mlp_out");

  // The same, computed here from the model's hooks with circuit-tracer's formulas.
  auto resolved = ResolveReferenceSpec(Spec().model().reference());
  ASSERT_TRUE(resolved.ok());
  auto model = CreateReferenceModel(
      *resolved,
      {*ParseHookName("blocks.0.hook_resid_mid"), *ParseHookName("blocks.0.hook_mlp_out"),
       *ParseHookName("blocks.1.hook_resid_mid"), *ParseHookName("blocks.1.hook_mlp_out")},
      at::kCPU);
  ASSERT_TRUE(model.ok());
  const at::Tensor tokens = Tokens();
  std::vector<at::Tensor> hooked;
  {
    c10::InferenceMode inference;
    hooked = (*model)->ForwardHooks(tokens);
  }
  std::vector<at::Tensor> z, y;
  for (int l = 0; l < 2; ++l) {
    z.push_back(at::relu(at::linear(hooked[2 * l].reshape({-1, 16}), W_enc[l], b_enc[l])));
    y.push_back(hooked[2 * l + 1].reshape({-1, 16}).to(at::kDouble));
  }
  const std::vector<at::Tensor> predicted = {
      at::mm(z[0], W_dec[0].select(1, 0)) + b_dec[0],
      at::mm(z[0], W_dec[0].select(1, 1)) + at::mm(z[1], W_dec[1].select(1, 0)) + b_dec[1]};
  auto ev = [&](int l) {
    const at::Tensor p = predicted[l].to(at::kDouble);
    return 1 - (y[l] - p).pow(2).sum().item<double>() /
                   (y[l] - y[l].mean(0)).pow(2).sum().item<double>();
  };
  // Layer 1 without layer 0's share would fit otherwise: the sum is what is measured.
  const at::Tensor own_only = (at::mm(z[1], W_dec[1].select(1, 0)) + b_dec[1]).to(at::kDouble);
  const double ev_own = 1 - (y[1] - own_only).pow(2).sum().item<double>() /
                                (y[1] - y[1].mean(0)).pow(2).sum().item<double>();
  ASSERT_GT(std::abs(ev(1) - ev_own), 1e-3);
  EXPECT_NEAR(result->fit().explained_variance(), ev(1), 1e-6 * std::abs(ev(1)) + 1e-5);
  EXPECT_NEAR(result->more_outputs(0).fit().explained_variance(), ev(0),
              1e-6 * std::abs(ev(0)) + 1e-5);
  // Layer 1's downstream loss: its MLP output replaced by the CLT's prediction there, from the
  // pass's own (clean up to there) inputs of layers 0 and 1.
  {
    c10::InferenceMode inference;
    const HookSplice replaced{*ParseHookName("blocks.1.hook_mlp_out"),
                              [&](const at::Tensor& a) { return predicted[1].view(a.sizes()); }};
    const double predictions = 40.0 * (kCtx - 1);
    EXPECT_NEAR(result->downstream_loss().with_sae(),
                (*model)->NextTokenLossSum(tokens, {replaced}) / predictions, 1e-5);
    const HookSplice own_only_spliced{
        *ParseHookName("blocks.1.hook_mlp_out"),
        [&](const at::Tensor& a) { return own_only.to(at::kFloat).view(a.sizes()); }};
    EXPECT_GT(std::abs(result->downstream_loss().with_sae() -
                       (*model)->NextTokenLossSum(tokens, {own_only_spliced}) / predictions),
              1e-6);
    EXPECT_NEAR(result->more_outputs(0).downstream_loss().clean(),
                (*model)->NextTokenLossSum(tokens, {}) / predictions, 1e-5);
    // circuit-tracer's replacement model up to layer 1: layer 0's MLP output replaced, then
    // layer 1's latents read from that pass and its MLP output replaced too.
    at::Tensor z1_replaced;
    const HookSplices replacement = {
        {*ParseHookName("blocks.0.hook_mlp_out"),
         [&](const at::Tensor& a) { return predicted[0].view(a.sizes()); }},
        {*ParseHookName("blocks.1.hook_resid_mid"),
         [&](const at::Tensor& a) {
           z1_replaced = at::relu(at::linear(a.reshape({-1, 16}), W_enc[1], b_enc[1]));
           return a;
         }},
        {*ParseHookName("blocks.1.hook_mlp_out"), [&](const at::Tensor& a) {
           return (at::mm(z[0], W_dec[0].select(1, 1)) +
                   at::mm(z1_replaced, W_dec[1].select(1, 0)) + b_dec[1])
               .view(a.sizes());
         }}};
    const double want_replaced = (*model)->NextTokenLossSum(tokens, replacement) / predictions;
    EXPECT_NEAR(result->downstream_loss().with_layers_replaced(), want_replaced, 1e-5);
    EXPECT_GT(std::abs(want_replaced - result->downstream_loss().with_sae()), 1e-6);
    // Layer 0 alone is its own replacement model.
    EXPECT_NEAR(result->more_outputs(0).downstream_loss().with_layers_replaced(),
                result->more_outputs(0).downstream_loss().with_sae(), 1e-9);
  }
  // Each dataset holds its own layer's latents.
  for (int l = 0; l < 2; ++l) {
    auto id = store.FindDataset(l == 0 ? "clt0" : "clt1");
    ASSERT_TRUE(id.ok());
    auto rows = store.ReadRows(*id, 0, 0);
    ASSERT_TRUE(rows.ok());
    for (int64_t r = 0; r < 40 * kCtx; r += 29) {
      std::set<int> want;
      for (int64_t j = 0; j < 24; ++j) {
        if (z[l][r][j].item<float>() > 0) want.insert(static_cast<int>(j));
      }
      const std::set<int> got(rows->indices.begin() + rows->indptr[r],
                              rows->indices.begin() + rows->indptr[r + 1]);
      EXPECT_EQ(got, want) << "layer " << l << " row " << r;
    }
  }

  // Layer 1 alone: its latents are stored, its fit is not measured, and the job says why.
  latentd::v1::ExtractSpec alone = Spec();
  alone.set_hook_name("blocks.1.hook_resid_mid");
  alone.mutable_sae()->set_path(clt);
  alone.set_dataset_name("clt1_alone");
  RecordingJobContext alone_ctx(1, 92);
  auto alone_result = RunExtract(alone, env_, &alone_ctx);
  ASSERT_TRUE(alone_result.ok()) << alone_result.status();
  EXPECT_FALSE(alone_result->has_fit());
  ASSERT_EQ(Warnings(alone_ctx).size(), 1u);
  EXPECT_NE(Warnings(alone_ctx)[0].find("fit is not measured"), std::string::npos);
  EXPECT_NE(Warnings(alone_ctx)[0].find("layer(s) 0"), std::string::npos) << Warnings(alone_ctx)[0];
  EXPECT_EQ(alone_result->nnz(), result->nnz());
  // Its downstream loss needs layer 0's latents from the same pass: refused without them.
  alone.set_downstream_loss_sequences(2);
  absl::Status s = ValidateExtractSpec(alone, env_);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("needs the latents of its layers 0 too"), std::string::npos) << s;
  // A layer the release lacks: one of a single layer (its decoder writes to it alone).
  const std::string one = Tmp("root/clt_one");
  mkdir(one.c_str(), 0755);
  const at::Tensor W_dec_one = W_dec[0].narrow(1, 0, 1).contiguous();
  ASSERT_TRUE(WriteSafetensors(one + "/W_enc_0.safetensors",
                               {{"W_enc_0", StDtype::kF32, {24, 16}, W_enc[0].data_ptr()},
                                {"b_enc_0", StDtype::kF32, {24}, b_enc[0].data_ptr()},
                                {"b_dec_0", StDtype::kF32, {16}, b_dec[0].data_ptr()}})
                  .ok());
  ASSERT_TRUE(WriteSafetensors(one + "/W_dec_0.safetensors",
                               {{"W_dec_0", StDtype::kF32, {24, 1, 16}, W_dec_one.data_ptr()}})
                  .ok());
  alone.set_downstream_loss_sequences(0);
  alone.mutable_sae()->set_path(one);
  s = ValidateExtractSpec(alone, env_);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("layer 1 is not in the circuit-tracer release"), std::string::npos)
      << s;
}

// One SAE on several hooks is loaded once, and the memory check counts it once: a device that
// holds the job with one SAE shared refuses it with three copies of that SAE in three places.
TEST_F(ExtractJobTest, AnSaeOnSeveralHooksCountsOnce) {
  auto sae = Sae::Load(root_ + "/sae");
  ASSERT_TRUE(sae.ok());
  for (const char* copy : {"/sae_copy1", "/sae_copy2"}) {
    ASSERT_TRUE(SaveSae(Tmp(std::string("root") + copy), sae->weights(), sae->config()).ok());
  }
  latentd::v1::ExtractSpec shared = Spec(), copies = Spec();
  for (const char* hook : {"blocks.0.hook_resid_post", "blocks.0.hook_resid_mid"}) {
    latentd::v1::ExtractOutput* a = shared.add_more_outputs();
    a->set_hook_name(hook);
    a->mutable_sae()->set_path(root_ + "/sae");
    latentd::v1::ExtractOutput* b = copies.add_more_outputs();
    b->set_hook_name(hook);
  }
  copies.mutable_more_outputs(0)->mutable_sae()->set_path(root_ + "/sae_copy1");
  copies.mutable_more_outputs(1)->mutable_sae()->set_path(root_ + "/sae_copy2");
  // The least device memory the shared job passes with (bisection over the submit check).
  auto fits = [&](const latentd::v1::ExtractSpec& spec, int64_t bytes) {
    ExtractEnv env = env_;
    env.device_memory_bytes = bytes;
    return ValidateExtractSpec(spec, env).ok();
  };
  int64_t lo = 1, hi = int64_t{1} << 40;
  while (lo + 1 < hi) {
    const int64_t mid = lo + (hi - lo) / 2;
    (fits(shared, mid) ? hi : lo) = mid;
  }
  EXPECT_TRUE(fits(shared, hi));
  EXPECT_FALSE(fits(copies, hi));
  // And the shared job stores what the job of copies stores.
  auto db = OpenDb("db_shared_sae");
  storage::ChunkStore store(db.get());
  env_.store = &store;
  shared.set_dataset_name("shared");
  copies.set_dataset_name("copies");
  RecordingJobContext a(1, 80), b(1, 81);
  auto ra = RunExtract(shared, env_, &a);
  auto rb = RunExtract(copies, env_, &b);
  ASSERT_TRUE(ra.ok() && rb.ok()) << ra.status() << rb.status();
  ExpectSameRows(&store, ra->dataset_id(), rb->dataset_id());
  for (int o = 0; o < 2; ++o) {
    ExpectSameRows(&store, ra->more_outputs(o).dataset_id(), rb->more_outputs(o).dataset_id());
  }
}

// On CPU-only machines the submit-time memory check counts the batch a CPU runs by default
// (8 sequences at 256 tokens), so a long-context job is not refused for 32 it would never run.
TEST_F(ExtractJobTest, TheCpuMemoryCheckCountsTheCpuBatch) {
  latentd::v1::ExtractSpec spec = Spec();
  spec.mutable_model()->mutable_reference()->set_context_length(256);
  spec.mutable_tokens()->set_context_length(256);
  spec.set_batch_sequences(0);
  auto fits = [&](const latentd::v1::ExtractSpec& s, bool cpu_only, int64_t bytes) {
    ExtractEnv env = env_;
    env.device_memory_bytes = bytes;
    env.cpu_only = cpu_only;
    return ValidateExtractSpec(s, env).ok();
  };
  int64_t lo = 1, hi = int64_t{1} << 40;
  while (lo + 1 < hi) {
    const int64_t mid = lo + (hi - lo) / 2;
    (fits(spec, true, mid) ? hi : lo) = mid;
  }
  EXPECT_TRUE(fits(spec, true, hi));
  EXPECT_FALSE(fits(spec, /*cpu_only=*/false, hi));  // GPUs run 32 a pass
  spec.set_batch_sequences(32);                      // a spec's own batch counts as given
  EXPECT_FALSE(fits(spec, true, hi));
}

TEST_F(ExtractJobTest, MoreOutputsAreCheckedNamingTheOutput) {
  auto expect_invalid = [&](const latentd::v1::ExtractSpec& spec, const std::string& field) {
    absl::Status s = ValidateExtractSpec(spec, env_);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_NE(s.message().find(field), std::string::npos) << field << ": " << s;
  };
  ASSERT_TRUE(ValidateExtractSpec(MultiSpec(), env_).ok())
      << ValidateExtractSpec(MultiSpec(), env_);
  auto s = MultiSpec();
  s.mutable_more_outputs(0)->set_hook_name("blocks.0.resid");
  expect_invalid(s, "extract.more_outputs[0].hook_name");
  s.mutable_more_outputs(0)->set_hook_name("blocks.5.hook_resid_post");  // 2 layers
  expect_invalid(s, "extract.more_outputs[0].hook_name: layer 5");
  s = MultiSpec();
  s.mutable_more_outputs(1)->set_hook_name("blocks.1.mlp.hook_post");  // 64 wide, sae2 d_in 16
  expect_invalid(s, "extract.more_outputs[1].sae: d_in 16 != width 64");
  s = MultiSpec();
  s.mutable_more_outputs(1)->clear_sae();
  expect_invalid(s, "extract.more_outputs[1].sae");
  s = MultiSpec();
  s.mutable_more_outputs(0)->set_dataset_name("mid");
  s.mutable_more_outputs(1)->set_dataset_name("mid");
  expect_invalid(s, "extract.more_outputs[1].dataset_name: mid is output 1's dataset too");
  s = MultiSpec();
  s.mutable_more_outputs(1)->clear_dataset_name();  // same hook as output 0: same default name?
  EXPECT_TRUE(ValidateExtractSpec(s, env_).ok());   // no: output 0's is "extract-<id>"
  s.set_mode(latentd::v1::DENSE);
  s.clear_sae();
  expect_invalid(s, "extract.more_outputs[0].sae: given with mode DENSE");
  for (auto& more : *s.mutable_more_outputs()) more.clear_sae();
  s.mutable_more_outputs(1)->set_hook_name("blocks.0.hook_resid_mid");  // a second copy
  expect_invalid(s, "extract.more_outputs[1].dataset_name");
  s.mutable_more_outputs(1)->set_dataset_name("copy");
  EXPECT_TRUE(ValidateExtractSpec(s, env_).ok()) << ValidateExtractSpec(s, env_);
  s = MultiSpec();
  s.mutable_more_outputs(0)->mutable_sae()->set_path("/etc");
  EXPECT_EQ(Code(s, env_), absl::StatusCode::kPermissionDenied);
  s = MultiSpec();
  while (s.more_outputs_size() < 64) *s.add_more_outputs() = s.more_outputs(0);
  expect_invalid(s, "extract.more_outputs: at most 63");
}

// Cancelled (or failed) several times, each time continued by a new job that names the one
// before: the datasets end as the uninterrupted job's, whatever the chain.
TEST_F(ExtractJobTest, MoreOutputsContinueThroughAChainOfJobs) {
  auto db = OpenDb("db_multi_chain");
  storage::ChunkStore store(db.get());
  env_.store = &store;
  latentd::v1::ExtractSpec uninterrupted = MultiSpec();
  uninterrupted.mutable_more_outputs(1)->set_dataset_name("second-straight");
  RecordingJobContext straight(1, 40);
  ASSERT_TRUE(RunExtract(uninterrupted, env_, &straight).ok());

  std::map<uint64_t, latentd::v1::Job> jobs;
  env_.find_job = [&jobs](uint64_t job_id) -> absl::StatusOr<latentd::v1::Job> {
    auto it = jobs.find(job_id);
    if (it == jobs.end()) return absl::NotFoundError("no such job");
    return it->second;
  };
  latentd::v1::ExtractSpec spec = MultiSpec();
  uint64_t job_id = 50;
  absl::StatusOr<latentd::v1::ExtractResult> r = absl::CancelledError("");
  for (int run = 0; !r.ok(); ++run, ++job_id) {
    ASSERT_EQ(r.status().code(), absl::StatusCode::kCancelled) << r.status();
    ASSERT_LT(run, 20);
    if (run > 0) {
      spec = MultiSpec();
      spec.set_resume_from_job_id(job_id - 1);
      spec.mutable_more_outputs(1)->clear_dataset_name();  // names come from the first job
      ASSERT_TRUE(ValidateExtractJob(spec, env_).ok()) << ValidateExtractJob(spec, env_);
    }
    RecordingJobContext ctx(1, job_id);
    ctx.CancelAfterChecks(3);
    r = RunExtract(spec, env_, &ctx);
    jobs[job_id].set_id(job_id);
    jobs[job_id].set_state(r.ok() ? latentd::v1::SUCCEEDED : latentd::v1::CANCELLED);
    *jobs[job_id].mutable_spec()->mutable_extract() = spec;
  }
  EXPECT_GT(job_id, 52u);  // at least two continuations
  EXPECT_EQ(r->more_outputs(0).dataset_name(), "extract-50.blocks.0.hook_resid_mid");
  EXPECT_EQ(r->more_outputs(1).dataset_name(), "second");
  for (const auto& [mine, theirs] : std::vector<std::pair<std::string, std::string>>{
           {"extract-50", "extract-40"},
           {"extract-50.blocks.0.hook_resid_mid", "extract-40.blocks.0.hook_resid_mid"},
           {"second", "second-straight"}}) {
    ExpectSameRows(&store, *store.FindDataset(mine), *store.FindDataset(theirs));
    EXPECT_EQ(store.GetRecord(*store.FindDataset(mine))->meta.job_id, job_id - 1);
  }
}

// A sink that stores 100 B a row on a disk with `free` bytes left.
class SmallDiskSink : public InMemoryRowSink {
 public:
  SmallDiskSink(InMemoryDataset* ds, int64_t free) : InMemoryRowSink(ds), free_(free) {}
  int64_t bytes_committed() const override { return rows_committed() * 100; }
  int64_t free_disk_bytes() const override { return free_; }

 private:
  int64_t free_;
};

// When the first commits show the rest will not fit, the job says so once, with the numbers.
TEST_F(ExtractJobTest, WarnsOnceWhenTheRemainingRowsWillNotFitOnTheDisk) {
  for (int64_t free : {int64_t{1} << 40, int64_t{500}}) {
    InMemoryDataset mem;
    mem.width = 48;
    SinkOpener opener = [&](const ExtractDatasetMeta&) -> absl::StatusOr<OpenedSink> {
      return OpenedSink{1, std::make_unique<SmallDiskSink>(&mem, free)};
    };
    RecordingJobContext ctx(1, 11);
    ASSERT_TRUE(RunExtractToSink(Spec(), env_, &ctx, opener).ok());
    if (free > 500) {
      EXPECT_TRUE(Warnings(ctx).empty());
      continue;
    }
    ASSERT_EQ(Warnings(ctx).size(), 1u);  // commits of 30 rows: 10 chances, one warning
    EXPECT_NE(Warnings(ctx)[0].find("at the 100.0 B/row"), std::string::npos) << Warnings(ctx)[0];
    EXPECT_NE(Warnings(ctx)[0].find("0.0 MB free"), std::string::npos) << Warnings(ctx)[0];
  }
}

// A dry run says what the job would do, after the checks a submit makes (and fails as it fails).
TEST_F(ExtractJobTest, ADryRunDescribesTheJobAfterTheSubmitChecks) {
  latentd::v1::ExtractSpec spec = MultiSpec();
  spec.set_dataset_name("first");
  auto lines = DescribeExtractJob(spec, env_);
  ASSERT_TRUE(lines.ok()) << lines.status();
  std::string all;
  for (const std::string& line : *lines) all += line + "\n";
  for (const std::string& want :
       {std::string("tokens: u16:") + root_ + "/tokens.bin", std::string(" rows ("),
        std::string("model: the reference model: 2 layers, d_model 16"),
        "dataset first: blocks.1.hook_resid_post (16 wide) -> SPARSE latents of the SAE in " +
            root_ + "/sae: topk, d_sae 48, k 5",
        std::string("dataset first.blocks.0.hook_resid_mid: blocks.0.hook_resid_mid (16 wide)"),
        std::string("dataset second: blocks.1.hook_resid_post (16 wide)"),
        std::string("a commit every"), std::string("disk: at least"),
        std::string("device memory: about")}) {
    EXPECT_NE(all.find(want), std::string::npos) << want << "\nin:\n" << all;
  }
  latentd::v1::ExtractSpec bad = spec;
  bad.set_hook_name("blocks.9.hook_resid_post");
  EXPECT_EQ(DescribeExtractJob(bad, env_).status(), ValidateExtractJob(bad, env_));
  EXPECT_FALSE(ValidateExtractJob(bad, env_).ok());
}

// A job whose dataset cannot fit is refused at submit, with the numbers, not hours later.
TEST_F(ExtractJobTest, ADatasetLargerThanTheFreeDiskIsRefusedAtSubmit) {
  auto db = OpenDb("db_disk_floor");
  storage::ChunkStore store(db.get());
  env_.store = &store;
  EXPECT_TRUE(ValidateExtractJob(Spec(), env_).ok()) << ValidateExtractJob(Spec(), env_);
  // 2^40 bytes of uint16 token ids that take no disk (a sparse file): 2^39 tokens, whose TopK
  // latents need terabytes however well they compress.
  const std::string huge = root_ + "/huge_tokens.bin";
  {
    std::ofstream(huge, std::ios::binary).put('\0');
    ASSERT_EQ(truncate(huge.c_str(), int64_t{1} << 40), 0);
  }
  latentd::v1::ExtractSpec spec = Spec();
  spec.mutable_tokens()->set_path(huge);
  absl::Status s = ValidateExtractJob(spec, env_);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  EXPECT_NE(s.message().find("x 5 latents x 2 B values"), std::string::npos) << s;
  EXPECT_NE(s.message().find("GB free"), std::string::npos) << s;
  spec.set_mode(latentd::v1::DENSE);
  spec.clear_sae();
  s = ValidateExtractJob(spec, env_);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  EXPECT_NE(s.message().find("x 16 x 2 B values"), std::string::npos) << s;
  std::remove(huge.c_str());
}

// A job that failed (disk full) or was cancelled keeps its committed rows; a new job with the
// same spec continues its dataset and ends with the uninterrupted run's rows.
TEST_F(ExtractJobTest, CancelledJobIsContinuedByANewJobToTheUninterruptedDataset) {
  auto db = OpenDb("db_continue");
  storage::ChunkStore store(db.get());
  env_.store = &store;
  RecordingJobContext straight(1, 400);
  ASSERT_TRUE(RunExtract(Spec(), env_, &straight).ok());
  RecordingJobContext first(1, 500);
  first.CancelAfterChecks(3);
  absl::Status cancelled = RunExtract(Spec(), env_, &first).status();
  ASSERT_EQ(cancelled.code(), absl::StatusCode::kCancelled);
  EXPECT_NE(cancelled.message().find("resume_from_job_id 500"), std::string::npos) << cancelled;
  const uint64_t id = *store.FindDataset("extract-500");
  const int64_t kept = store.GetRecord(id)->rows_committed;
  EXPECT_GT(kept, 0);

  std::map<uint64_t, latentd::v1::Job> jobs;
  for (auto [job_id, state] : {std::pair{uint64_t{500}, latentd::v1::CANCELLED},
                               std::pair{uint64_t{501}, latentd::v1::RUNNING}}) {
    jobs[job_id].set_id(job_id);
    jobs[job_id].set_state(state);
    *jobs[job_id].mutable_spec()->mutable_extract() = Spec();
  }
  env_.find_job = [&jobs](uint64_t job_id) -> absl::StatusOr<latentd::v1::Job> {
    auto it = jobs.find(job_id);
    if (it == jobs.end()) return absl::NotFoundError("no such job");
    return it->second;
  };
  latentd::v1::ExtractSpec next = Spec();
  next.set_resume_from_job_id(500);
  latentd::v1::ExtractSpec other = next;
  other.set_batch_sequences(4);
  absl::Status s = ValidateExtractJob(other, env_);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("batch_sequences"), std::string::npos) << s;
  other = next;
  other.set_dataset_name("elsewhere");
  EXPECT_EQ(ValidateExtractJob(other, env_).code(), absl::StatusCode::kInvalidArgument);
  other.set_dataset_name("extract-500");
  EXPECT_TRUE(ValidateExtractJob(other, env_).ok());
  other = next;
  other.set_resume_from_job_id(501);
  EXPECT_EQ(ValidateExtractJob(other, env_).code(), absl::StatusCode::kFailedPrecondition);
  other.set_resume_from_job_id(77);
  EXPECT_EQ(ValidateExtractJob(other, env_).code(), absl::StatusCode::kNotFound);
  ASSERT_TRUE(ValidateExtractJob(next, env_).ok()) << ValidateExtractJob(next, env_);

  RecordingJobContext continued(1, 600);
  auto r = RunExtract(next, env_, &continued);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->dataset_id(), id);
  EXPECT_EQ(RowsDone(continued).front(), kept);  // it began at the kept rows
  EXPECT_EQ(store.GetRecord(id)->meta.job_id, 600u);
  auto a = store.ReadRows(*store.FindDataset("extract-400"), 0, 0);
  auto b = store.ReadRows(id, 0, 0);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->token_ids, b->token_ids);
  EXPECT_EQ(a->indptr, b->indptr);
  EXPECT_EQ(a->indices, b->indices);
  EXPECT_EQ(a->values, b->values);
  EXPECT_EQ(r->nnz(), static_cast<int64_t>(b->indices.size()));  // the dataset's, not this run's
  // Taken over: job 500 has no dataset left to continue.
  s = ValidateExtractJob(next, env_);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_NE(s.message().find("job 600"), std::string::npos) << s;
}

// A job resumed after a restart must not finish its dataset with other SAE weights than it
// started with (the user replaced the file in between): the rows would mix two dictionaries.
TEST_F(ExtractJobTest, ResumeWithChangedSaeWeightsIsRefused) {
  auto db = OpenDb("db_sae_changed");
  storage::ChunkStore store(db.get());
  env_.store = &store;
  RecordingJobContext first(1, 300);
  first.CancelAfterChecks(2);
  ASSERT_EQ(RunExtract(Spec(), env_, &first).status().code(), absl::StatusCode::kCancelled);
  const uint64_t id = *store.FindDataset("extract-300");
  const std::string recorded = store.GetDataset(id)->sae_weight_hash();
  EXPECT_EQ(recorded.rfind("crc32c:", 0), 0u) << recorded;
  EXPECT_GT(store.GetRecord(id)->rows_committed, 0);

  SaeConfig cfg;
  cfg.d_in = 16;
  cfg.d_sae = 48;
  cfg.k = 5;
  cfg.architecture = SaeArchitecture::kTopK;
  at::manual_seed(3);
  at::Tensor dec = at::randn({48, 16});
  ASSERT_TRUE(SaveSae(root_ + "/sae",
                      {dec.t().contiguous(), at::zeros({48}), dec, at::zeros({16}), {}}, cfg)
                  .ok());
  RecordingJobContext again(1, 300);
  absl::Status refused = RunExtract(Spec(), env_, &again).status();
  EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition) << refused;
  EXPECT_NE(refused.message().find("another SAE"), std::string::npos) << refused;
  EXPECT_EQ(store.GetDataset(id)->sae_weight_hash(), recorded);
}

// CPUs run long sequences a few at a time (attention's scores grow with the square of the
// context); GPUs keep 32.
// Spec()'s model and tokens stored DENSE as float32 by job `job_id`, at `hook`; its dataset.
uint64_t StoreDense(const ExtractEnv& env, latentd::v1::ExtractSpec spec, uint64_t job_id,
                    const std::string& hook) {
  spec.clear_sae();
  spec.set_mode(latentd::v1::DENSE);
  spec.set_value_dtype(latentd::v1::FLOAT32);
  spec.set_hook_name(hook);
  RecordingJobContext ctx(1, job_id);
  auto dense = RunExtract(spec, env, &ctx);
  EXPECT_TRUE(dense.ok()) << dense.status();
  return dense.ok() ? dense->dataset_id() : 0;
}

// The SPARSE spec that encodes stored datasets `ids` with the SAE in `sae_dir`.
latentd::v1::ExtractSpec StoredSpec(const std::vector<uint64_t>& ids, const std::string& sae_dir) {
  latentd::v1::ExtractSpec s;
  latentd::v1::StoredActivationsSpec* stored = s.mutable_model()->mutable_stored();
  for (uint64_t id : ids) stored->add_dataset_ids(id);
  s.mutable_sae()->set_path(sae_dir);
  s.set_batch_sequences(3);
  s.set_commit_rows(30);
  return s;
}

// An SAE trained on a DENSE dataset gives its latents over the same rows without the model: the
// job over the stored float32 rows stores exactly what the job running the model stores (the
// same rows, batched alike), on one device or two, and for a shard of the sequences.
TEST_F(ExtractJobTest, EncodingStoredActivationsStoresWhatRunningTheModelStores) {
  auto db = OpenDb("db_stored");
  storage::ChunkStore store(db.get());
  env_.store = &store;
  const uint64_t dense = StoreDense(env_, Spec(), 300, "blocks.1.hook_resid_post");
  RecordingJobContext model_ctx(1, 301);
  auto from_model = RunExtract(Spec(), env_, &model_ctx);
  ASSERT_TRUE(from_model.ok()) << from_model.status();
  for (int devices : {1, 2}) {
    RecordingJobContext ctx(devices, 302 + devices);
    auto stored = RunExtract(StoredSpec({dense}, root_ + "/sae"), env_, &ctx);
    ASSERT_TRUE(stored.ok()) << stored.status();
    EXPECT_EQ(stored->rows(), 40 * kCtx);
    ExpectSameRows(&store, from_model->dataset_id(), stored->dataset_id());
    EXPECT_NEAR(stored->fit().explained_variance(), from_model->fit().explained_variance(), 1e-9);
    auto record = store.GetRecord(stored->dataset_id());
    ASSERT_TRUE(record.ok());
    const auto model_record = store.GetRecord(from_model->dataset_id());
    EXPECT_EQ(record->meta.hook_name, "blocks.1.hook_resid_post");
    EXPECT_EQ(record->meta.layer, 1);
    EXPECT_EQ(record->meta.model_id, model_record->meta.model_id);
    EXPECT_EQ(record->meta.model_weight_hash, model_record->meta.model_weight_hash);
    EXPECT_EQ(record->meta.context_length, kCtx);
    EXPECT_EQ(record->meta.token_order_start, 0);
    // All the stored rows: the tokens' own source, so that the dataset holds the same rows as
    // any dataset extracted from them (latentctl's siblings, LatentsOnRows across datasets).
    EXPECT_EQ(record->meta.token_source, model_record->meta.token_source);
    EXPECT_TRUE(record->complete);
  }
  // Sequences 5..14 of the stored rows are those of the model run over that shard of the file.
  latentd::v1::ExtractSpec shard = Spec();
  shard.mutable_tokens()->set_sequence_start(5);
  shard.mutable_tokens()->set_sequence_count(10);
  RecordingJobContext shard_ctx(1, 310);
  auto shard_model = RunExtract(shard, env_, &shard_ctx);
  ASSERT_TRUE(shard_model.ok()) << shard_model.status();
  latentd::v1::ExtractSpec stored_shard = StoredSpec({dense}, root_ + "/sae");
  stored_shard.mutable_tokens()->set_sequence_start(5);
  stored_shard.mutable_tokens()->set_sequence_count(10);
  RecordingJobContext stored_shard_ctx(1, 311);
  auto shard_stored = RunExtract(stored_shard, env_, &stored_shard_ctx);
  ASSERT_TRUE(shard_stored.ok()) << shard_stored.status();
  EXPECT_EQ(shard_stored->rows(), 10 * kCtx);
  ExpectSameRows(&store, shard_model->dataset_id(), shard_stored->dataset_id());
  EXPECT_EQ(store.GetRecord(shard_stored->dataset_id())->meta.token_order_start, 5 * kCtx);
  // A part of them: the stored dataset it was cut from.
  EXPECT_EQ(
      store.GetRecord(shard_stored->dataset_id())
          ->meta.token_source.rfind(
              "stored:dataset " + std::to_string(dense) + "[sequences 5..15, L=8] of u16:", 0),
      0u)
      << store.GetRecord(shard_stored->dataset_id())->meta.token_source;
}

// Hidden states stored as float16 (EXTRACT DENSE's default) are encoded from their rounded
// values: nearly the model run's latents, not bit for bit.
TEST_F(ExtractJobTest, AFloat16DenseDatasetGivesNearlyTheModelRunsLatents) {
  auto db = OpenDb("db_stored_f16");
  storage::ChunkStore store(db.get());
  env_.store = &store;
  latentd::v1::ExtractSpec dense = Spec();
  dense.clear_sae();
  dense.set_mode(latentd::v1::DENSE);
  dense.set_value_dtype(latentd::v1::FLOAT16);
  RecordingJobContext dense_ctx(1, 350);
  auto stored_rows = RunExtract(dense, env_, &dense_ctx);
  ASSERT_TRUE(stored_rows.ok()) << stored_rows.status();
  RecordingJobContext model_ctx(1, 351), stored_ctx(1, 352);
  auto from_model = RunExtract(Spec(), env_, &model_ctx);
  auto from_stored =
      RunExtract(StoredSpec({stored_rows->dataset_id()}, root_ + "/sae"), env_, &stored_ctx);
  ASSERT_TRUE(from_model.ok() && from_stored.ok()) << from_stored.status();
  auto a = store.ReadRows(from_model->dataset_id(), 0, 0);
  auto b = store.ReadRows(from_stored->dataset_id(), 0, 0);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->token_ids, b->token_ids);
  int64_t same_rows = 0;
  for (int64_t r = 0; r < a->num_rows; ++r) {
    const std::vector<int32_t> x(a->indices.begin() + a->indptr[r],
                                 a->indices.begin() + a->indptr[r + 1]);
    const std::vector<int32_t> y(b->indices.begin() + b->indptr[r],
                                 b->indices.begin() + b->indptr[r + 1]);
    if (std::set<int32_t>(x.begin(), x.end()) != std::set<int32_t>(y.begin(), y.end())) continue;
    ++same_rows;
    for (int64_t e = a->indptr[r]; e < a->indptr[r + 1]; ++e) {
      EXPECT_NEAR(a->values[e], b->values[e], 1e-2 * std::abs(a->values[e]) + 1e-3);
    }
  }
  EXPECT_GE(same_rows, a->num_rows * 95 / 100) << same_rows << " of " << a->num_rows;
}

// Several SAEs over one stored dataset (an SAE sweep): one job reads the rows once, and each
// output's dataset holds what a job of that SAE alone stores; unnamed outputs are numbered.
TEST_F(ExtractJobTest, SeveralSaesEncodeOneStoredDatasetInOneJob) {
  auto db = OpenDb("db_stored_sweep");
  storage::ChunkStore store(db.get());
  env_.store = &store;
  const uint64_t dense = StoreDense(env_, Spec(), 360, "blocks.1.hook_resid_post");
  latentd::v1::ExtractSpec sweep = StoredSpec({dense}, root_ + "/sae");
  sweep.add_more_outputs()->mutable_sae()->set_path(root_ + "/sae2");
  latentd::v1::ExtractOutput* named = sweep.add_more_outputs();
  named->set_hook_name("blocks.1.hook_resid_post");
  named->mutable_sae()->set_path(root_ + "/sae2");
  named->set_dataset_name("sae2-again");
  RecordingJobContext ctx(1, 361);
  auto swept = RunExtract(sweep, env_, &ctx);
  ASSERT_TRUE(swept.ok()) << swept.status();
  ASSERT_EQ(swept->more_outputs_size(), 2);
  EXPECT_EQ(swept->more_outputs(0).dataset_name(), "extract-361.1");
  EXPECT_EQ(swept->more_outputs(1).dataset_name(), "sae2-again");
  EXPECT_EQ(swept->more_outputs(0).hook_name(), "blocks.1.hook_resid_post");
  for (const auto& [sae, dataset] :
       {std::pair{std::string("/sae"), swept->dataset_id()},
        std::pair{std::string("/sae2"), swept->more_outputs(0).dataset_id()},
        std::pair{std::string("/sae2"), swept->more_outputs(1).dataset_id()}}) {
    RecordingJobContext alone_ctx(1, 370 + dataset);
    auto alone = RunExtract(StoredSpec({dense}, root_ + sae), env_, &alone_ctx);
    ASSERT_TRUE(alone.ok()) << alone.status();
    ExpectSameRows(&store, alone->dataset_id(), dataset);
  }
}

// A crosscoder over two stored datasets (one model's two layers here; two models' one hook in
// model diffing) stores what the crosscoder stores while the model runs with both hooks; a job
// cancelled part way continues to the same rows.
TEST_F(ExtractJobTest, ACrosscoderEncodesItsSourcesStoredDatasetsSideBySide) {
  auto db = OpenDb("db_stored_crosscoder");
  storage::ChunkStore store(db.get());
  env_.store = &store;
  const std::vector<std::string> hooks = {"blocks.0.hook_resid_post", "blocks.1.hook_resid_post"};
  const uint64_t first = StoreDense(env_, Spec(), 320, hooks[0]);
  const uint64_t second = StoreDense(env_, Spec(), 321, hooks[1]);
  CrosscoderModelOptions options;
  options.sources = 2;
  options.d_in = 16;
  options.d_sae = 48;
  options.k = 4;
  options.seed = 3;
  CrosscoderModelImpl crosscoder(options);
  crosscoder.InitWeights();
  // Scaled and calibrated on the rows it will encode, so that its latents fire on them.
  std::vector<float> values[2];
  std::vector<int32_t> tokens;
  ASSERT_TRUE(store.ReadDense(first, 0, 40 * kCtx, &values[0], &tokens).ok());
  ASSERT_TRUE(store.ReadDense(second, 0, 40 * kCtx, &values[1], &tokens).ok());
  const at::Tensor rows =
      at::cat({at::tensor(values[0]).view({-1, 16}), at::tensor(values[1]).view({-1, 16})}, 1);
  crosscoder.InitFromData(rows);
  crosscoder.CalibrateBatchThreshold({rows});
  const std::string dir = Tmp("root/crosscoder");
  ASSERT_TRUE(crosscoder.Save(dir, {{hooks[0], "ref", "live"}, {hooks[1], "ref", "live"}}).ok());

  latentd::v1::ExtractSpec live = Spec();
  live.set_hook_name(hooks[0]);
  live.add_crosscoder_hooks(hooks[1]);
  live.mutable_sae()->set_path(dir);
  RecordingJobContext live_ctx(1, 322);
  auto from_model = RunExtract(live, env_, &live_ctx);
  ASSERT_TRUE(from_model.ok()) << from_model.status();
  EXPECT_GT(from_model->nnz(), 0);

  int runs = 0;
  absl::StatusOr<latentd::v1::ExtractResult> stored = absl::CancelledError("");
  while (!stored.ok()) {
    ASSERT_EQ(stored.status().code(), absl::StatusCode::kCancelled) << stored.status();
    ASSERT_LT(++runs, 40);
    RecordingJobContext ctx(1, 323);
    ctx.CancelAfterChecks(3);
    stored = RunExtract(StoredSpec({first, second}, dir), env_, &ctx);
  }
  EXPECT_GT(runs, 1);
  ExpectSameRows(&store, from_model->dataset_id(), stored->dataset_id());
  EXPECT_EQ(store.GetRecord(stored->dataset_id())->meta.hook_name, hooks[0]);

  // The same datasets in the other order are other sources: other latents.
  RecordingJobContext swapped_ctx(1, 324);
  auto swapped = RunExtract(StoredSpec({second, first}, dir), env_, &swapped_ctx);
  ASSERT_TRUE(swapped.ok()) << swapped.status();
  auto a = store.ReadRows(stored->dataset_id(), 0, 0);
  auto b = store.ReadRows(swapped->dataset_id(), 0, 0);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->token_ids, b->token_ids);
  EXPECT_NE(a->indices, b->indices);
}

// Each way a spec over stored activations can be wrong, refused at submit naming the field.
TEST_F(ExtractJobTest, StoredActivationsSpecsAreCheckedNamingTheField) {
  auto db = OpenDb("db_stored_bad");
  storage::ChunkStore store(db.get());
  env_.store = &store;
  const uint64_t dense = StoreDense(env_, Spec(), 330, "blocks.1.hook_resid_post");
  const uint64_t other_hook = StoreDense(env_, Spec(), 331, "blocks.0.hook_resid_post");
  RecordingJobContext sparse_ctx(1, 332);
  auto sparse = RunExtract(Spec(), env_, &sparse_ctx);
  ASSERT_TRUE(sparse.ok());
  latentd::v1::ExtractSpec fewer = Spec();  // a DENSE job over other tokens: 32 sequences
  fewer.mutable_tokens()->set_sequence_count(32);
  const uint64_t fewer_rows = StoreDense(env_, fewer, 333, "blocks.1.hook_resid_post");
  // A DENSE job cancelled part way: its dataset is incomplete.
  latentd::v1::ExtractSpec partial = Spec();
  partial.clear_sae();
  partial.set_mode(latentd::v1::DENSE);
  RecordingJobContext partial_ctx(1, 334);
  partial_ctx.CancelAfterChecks(3);
  ASSERT_EQ(RunExtract(partial, env_, &partial_ctx).status().code(), absl::StatusCode::kCancelled);
  const uint64_t incomplete = *store.FindDataset("extract-334");

  ExtractEnv checked = env_;
  checked.open_stored_dense = ChunkStoreDenseOpener(&store);
  EXPECT_TRUE(ValidateExtractSpec(StoredSpec({dense}, root_ + "/sae"), checked).ok());
  auto expect = [&](const latentd::v1::ExtractSpec& spec, absl::StatusCode code,
                    const std::string& field) {
    const absl::Status s = ValidateExtractSpec(spec, checked);
    EXPECT_EQ(s.code(), code) << s;
    EXPECT_NE(s.message().find(field), std::string::npos) << field << " not in " << s;
    // The job's own checks (extract_job.h) answer alike.
    EXPECT_EQ(ValidateExtractJob(spec, env_).code(), code);
  };
  const std::string sae = root_ + "/sae";
  const std::string ids = "extract.model.stored.dataset_ids";
  expect(StoredSpec({}, sae), absl::StatusCode::kInvalidArgument, ids);
  expect(StoredSpec({999}, sae), absl::StatusCode::kNotFound, ids + "[0]: no dataset 999");
  expect(StoredSpec({sparse->dataset_id()}, sae), absl::StatusCode::kInvalidArgument,
         ids + "[0]: dataset " + std::to_string(sparse->dataset_id()) + " (extract-332) is SPARSE");
  expect(StoredSpec({incomplete}, sae), absl::StatusCode::kFailedPrecondition,
         "not complete: is job 334 still running");
  expect(StoredSpec({dense, dense}, sae), absl::StatusCode::kInvalidArgument,
         ids + "[1]: dataset " + std::to_string(dense) + " is named twice");
  expect(StoredSpec({dense, other_hook}, sae), absl::StatusCode::kInvalidArgument,
         "datasets side by side need a crosscoder");
  expect(StoredSpec({dense, fewer_rows}, sae), absl::StatusCode::kInvalidArgument,
         ids + "[1]: dataset " + std::to_string(fewer_rows) + " holds 256 rows");
  latentd::v1::ExtractSpec s = StoredSpec({dense}, sae);
  s.clear_sae();
  expect(s, absl::StatusCode::kInvalidArgument, "extract.sae: required");
  s = StoredSpec({dense}, sae);
  s.set_mode(latentd::v1::DENSE);
  expect(s, absl::StatusCode::kInvalidArgument, "extract.mode: DENSE");
  s = StoredSpec({dense}, sae);
  s.set_hook_name("blocks.0.hook_resid_post");
  expect(s, absl::StatusCode::kInvalidArgument,
         "extract.hook_name: dataset " + std::to_string(dense) +
             " holds activations of blocks.1.hook_resid_post");
  s = StoredSpec({dense}, sae);
  s.mutable_tokens()->set_path(root_ + "/tokens.bin");
  expect(s, absl::StatusCode::kInvalidArgument, "extract.tokens.path");
  s = StoredSpec({dense}, sae);
  s.mutable_tokens()->set_context_length(kCtx * 2);
  expect(s, absl::StatusCode::kInvalidArgument, "extract.tokens.context_length");
  s = StoredSpec({dense}, sae);
  s.mutable_tokens()->set_sequence_start(40);
  expect(s, absl::StatusCode::kInvalidArgument, "extract.tokens.sequence_start: 40 outside the 40");
  s = StoredSpec({dense}, sae);
  s.mutable_tokens()->set_sequence_start(30);
  s.mutable_tokens()->set_sequence_count(11);
  expect(s, absl::StatusCode::kInvalidArgument, "extract.tokens.sequence_count");
  s = StoredSpec({dense}, sae);
  s.add_more_outputs()->set_hook_name("blocks.0.hook_resid_post");
  s.mutable_more_outputs(0)->mutable_sae()->set_path(sae);
  expect(s, absl::StatusCode::kInvalidArgument,
         "extract.more_outputs[0].hook_name: dataset " + std::to_string(dense) +
             " holds activations of blocks.1.hook_resid_post");
  s = StoredSpec({dense}, sae);
  s.set_downstream_loss_sequences(4);
  expect(s, absl::StatusCode::kInvalidArgument, "extract.downstream_loss_sequences");
  s = StoredSpec({dense}, sae);
  s.add_crosscoder_hooks("blocks.0.hook_resid_post");
  expect(s, absl::StatusCode::kInvalidArgument, "extract.crosscoder_hooks");
  // A daemon without a store to read from.
  ExtractEnv storeless = env_;
  storeless.store = nullptr;
  EXPECT_EQ(ValidateExtractSpec(StoredSpec({dense}, sae), storeless).code(),
            absl::StatusCode::kFailedPrecondition);
}

// A dry run names each stored dataset it reads.
TEST_F(ExtractJobTest, ADryRunOfStoredActivationsNamesTheirDatasets) {
  auto db = OpenDb("db_stored_plan");
  storage::ChunkStore store(db.get());
  env_.store = &store;
  const uint64_t dense = StoreDense(env_, Spec(), 340, "blocks.1.hook_resid_post");
  auto lines = DescribeExtractJob(StoredSpec({dense}, root_ + "/sae"), env_);
  ASSERT_TRUE(lines.ok()) << lines.status();
  std::string all;
  for (const std::string& line : *lines) all += line + "\n";
  for (const std::string& want :
       {"tokens: stored:dataset " + std::to_string(dense) + "[sequences 0..40, L=8] of u16:",
        "model: none; stored dataset " + std::to_string(dense) +
            " (extract-340): blocks.1.hook_resid_post of ",
        std::string("dataset extract-<job id>: blocks.1.hook_resid_post (16 wide) -> SPARSE "
                    "latents of the SAE")}) {
    EXPECT_NE(all.find(want), std::string::npos) << want << "\nin:\n" << all;
  }
}

TEST(ExtractDefaultsTest, BatchShrinksWithTheContextOnCpus) {
  EXPECT_EQ(DefaultBatchSequences(128, /*all_cpu=*/true), 32);
  EXPECT_EQ(DefaultBatchSequences(64, true), 32);
  EXPECT_EQ(DefaultBatchSequences(256, true), 8);
  EXPECT_EQ(DefaultBatchSequences(512, true), 2);
  EXPECT_EQ(DefaultBatchSequences(1024, true), 1);
  EXPECT_EQ(DefaultBatchSequences(8192, true), 1);
  EXPECT_EQ(DefaultBatchSequences(1024, /*all_cpu=*/false), 32);
}

}  // namespace
}  // namespace latentd::engine
