// The loop users need, at engine level: EXTRACT dense activations of the reference model ->
// TRAIN a TopK SAE on them with smfac -> EXTRACT sparse latents with the trained SAE (named by
// its artifact id) -> per-latent queries answer. Tiny sizes; the same code path as the daemon.
#include <gtest/gtest.h>
#include <torch/types.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>

#include "common/status_macros.h"
#include "engine/extract_job.h"
#include "engine/job_context_testing.h"
#include "engine/optimizer_factory.h"
#include "engine/train_job.h"
#include "storage/artifact_store.h"
#include "storage/chunk_store.h"
#include "storage/db.h"

namespace latentd::engine {
namespace {

constexpr int kContext = 16;

// The TRAIN telemetry samples a runner reported to `ctx`.
std::vector<latentd::v1::TrainTelemetry> TrainSamples(const RecordingJobContext& ctx) {
  std::vector<latentd::v1::TrainTelemetry> samples;
  for (const latentd::v1::Telemetry& t : ctx.telemetry()) {
    if (t.has_train()) samples.push_back(t.train());
  }
  return samples;
}

TEST(TrainEndToEndTest, ExtractDenseTrainSmfacExtractSparseQuery) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::string root = std::string(tmp ? tmp : "/tmp") + "/train_e2e";
  std::filesystem::remove_all(root);
  std::filesystem::create_directories(root + "/artifacts");
  std::vector<uint16_t> ids(64 * kContext);
  std::mt19937 rng(3);
  for (auto& t : ids) t = static_cast<uint16_t>(rng() % 64);
  std::ofstream(root + "/tokens.bin", std::ios::binary)
      .write(reinterpret_cast<const char*>(ids.data()), ids.size() * 2);

  auto db = storage::Db::Open(root + "/db");
  ASSERT_TRUE(db.ok()) << db.status();
  storage::ChunkStoreOptions store_options;
  store_options.chunk_rows = 128;
  storage::ChunkStore store(db->get(), store_options);
  storage::ArtifactStore artifacts(db->get());

  ExtractEnv extract_env;
  extract_env.store = &store;
  extract_env.data_roots = {root};
  extract_env.sae_artifact_dir = [&](uint64_t id) -> absl::StatusOr<std::string> {
    ASSIGN_OR_RETURN(latentd::v1::Artifact artifact, artifacts.Get(id));
    return artifact.path();
  };
  latentd::v1::ExtractSpec dense;
  auto* model = dense.mutable_model()->mutable_reference();
  model->set_d_model(16);
  model->set_n_layers(2);
  model->set_n_heads(2);
  model->set_vocab_size(64);
  model->set_context_length(kContext);
  dense.set_hook_name("blocks.1.hook_resid_post");
  dense.mutable_tokens()->set_path(root + "/tokens.bin");
  dense.mutable_tokens()->set_context_length(kContext);
  dense.set_mode(latentd::v1::DENSE);
  dense.set_value_dtype(latentd::v1::FLOAT32);
  dense.set_dataset_name("dense");
  RecordingJobContext extract_dense(/*num_devices=*/1, 1);
  ASSERT_TRUE(ValidateExtractSpec(dense, extract_env).ok());
  auto dense_result = RunExtract(dense, extract_env, &extract_dense);
  ASSERT_TRUE(dense_result.ok()) << dense_result.status();
  EXPECT_EQ(dense_result->rows(), 64 * kContext);

  TrainEnv train_env;
  train_env.store = &store;
  train_env.artifact_dir = root + "/artifacts";
  train_env.data_roots = {root};
  train_env.artifacts = &artifacts;
  latentd::v1::TrainSpec train;
  train.set_dataset_id(dense_result->dataset_id());
  train.mutable_sae()->set_d_sae(64);
  train.mutable_sae()->set_k(4);
  train.mutable_optimizer()->set_name("smfac");
  train.mutable_optimizer()->set_lr(3e-2);
  train.mutable_optimizer()->set_window(16);
  train.mutable_optimizer()->set_density(0.01);
  train.mutable_optimizer()->set_damp(1e-4);
  train.mutable_schedule()->set_kind(latentd::v1::COSINE);
  train.mutable_schedule()->set_warmup_steps(5);
  train.set_batch_size(64);
  train.set_steps(100);
  train.set_telemetry_every(10);
  train.set_checkpoint_every(25);
  ASSERT_TRUE(ValidateTrainSpec(train, train_env).ok());
  RecordingJobContext training(/*num_devices=*/1, 2);
  auto trained = RunTrain(train, train_env, &training);
  ASSERT_TRUE(trained.ok()) << trained.status();
  const std::vector<latentd::v1::TrainTelemetry> samples = TrainSamples(training);
  ASSERT_EQ(samples.size(), 10u);
  EXPECT_LT(samples.back().loss(), 0.7 * samples.front().loss());
  // The telemetry is the optimizer's accounting, which equals its static estimate.
  const int64_t d = 2 * 16 * 64 + 64 + 16;
  auto config = OptimizerConfigFromProto(train.optimizer());
  const OptimizerMemory expected =
      EstimateOptimizerMemory(*config, {{16, 64}, {64}, {64, 16}, {16}});
  for (const auto& [name, bytes] : expected.components) {
    EXPECT_EQ(samples.back().optimizer_state_bytes().at(name), bytes) << name;
  }
  EXPECT_EQ(samples.back().optimizer_state_total_bytes(), expected.total());
  EXPECT_EQ(samples.back().dense_mfac_history_bytes(), 4 * 16 * d);
  EXPECT_EQ(trained->peak_optimizer_state_bytes(), expected.total());

  latentd::v1::ExtractSpec sparse = dense;
  sparse.set_mode(latentd::v1::SPARSE);
  sparse.set_value_dtype(latentd::v1::FLOAT16);
  sparse.mutable_sae()->set_artifact_id(trained->artifact_id());
  sparse.set_dataset_name("sparse");
  ASSERT_TRUE(ValidateExtractSpec(sparse, extract_env).ok());
  RecordingJobContext extract_sparse(/*num_devices=*/1, 3);
  auto sparse_result = RunExtract(sparse, extract_env, &extract_sparse);
  ASSERT_TRUE(sparse_result.ok()) << sparse_result.status();
  EXPECT_EQ(sparse_result->rows(), 64 * kContext);
  EXPECT_GT(sparse_result->nnz(), 0);
  EXPECT_LE(sparse_result->nnz(), 4 * 64 * kContext);
  // GetLatent's data: a latent firing on row 5 has statistics counting it.
  auto row = store.RowLatents(sparse_result->dataset_id(), 5);
  ASSERT_TRUE(row.ok()) << row.status();
  ASSERT_FALSE(row->indices.empty());
  EXPECT_LE(row->indices.size(), 4u);
  auto stats = store.GetLatentStats(sparse_result->dataset_id(), row->indices[0]);
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_GE(stats->firing_count, 1);
  EXPECT_GT(stats->max, 0.0f);
}

}  // namespace
}  // namespace latentd::engine
