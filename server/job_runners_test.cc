#include "server/job_runners.h"

#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "common/test_dir.h"
#include "engine/checkpoint.h"
#include "engine/job_context_testing.h"
#include "gtest/gtest.h"

namespace latentd::server {
namespace {

// Deleting a cancelled TRAIN job must take its kept checkpoint with it.
TEST(JobRunners, ForgettingATrainJobRemovesItsCheckpoint) {
  auto db = storage::Db::Open(FreshTestDir("job_runners"));
  ASSERT_TRUE(db.ok()) << db.status();
  storage::ChunkStore store(db->get());
  storage::ArtifactStore artifacts(db->get());
  auto pool = engine::DevicePool::Create("cpu:1");
  ASSERT_TRUE(pool.ok()) << pool.status();
  RunnerEnvironment env;
  env.pool = pool->get();
  env.store = &store;
  env.artifacts = &artifacts;
  auto runners = MakeJobRunners(env);
  ASSERT_TRUE(runners.at(latentd::v1::TRAIN).forget);
  engine::DbCheckpointStore kept(db->get(), 7), other(db->get(), 8);
  ASSERT_TRUE(kept.Commit({40, "state at forty"}).ok());
  ASSERT_TRUE(other.Commit({10, "another job's"}).ok());
  ASSERT_TRUE(runners.at(latentd::v1::TRAIN).forget(7).ok());
  EXPECT_FALSE(kept.LatestStep()->has_value());
  EXPECT_TRUE(other.LatestStep()->has_value());
  EXPECT_TRUE(runners.at(latentd::v1::TRAIN).forget(7).ok());  // nothing left: still fine

  // Which job each type continues, so that job is not deleted under it.
  latentd::v1::JobSpec train, extract;
  train.mutable_train()->set_resume_from_job_id(7);
  extract.mutable_extract()->set_resume_from_job_id(9);
  EXPECT_EQ(runners.at(latentd::v1::TRAIN).continues(train), 7u);
  EXPECT_EQ(runners.at(latentd::v1::EXTRACT).continues(extract), 9u);
  EXPECT_FALSE(runners.at(latentd::v1::PROBE).continues);
}

// EXPORT runs an ExportDataset request without a device, reports rows, and stops when cancelled
// leaving nothing at its path.
TEST(JobRunners, AnExportJobReportsRowsAndStopsWhenCancelled) {
  const std::string dir = FreshTestDir("job_runners_export");
  auto db = storage::Db::Open(dir + "/db");
  ASSERT_TRUE(db.ok()) << db.status();
  storage::ChunkStore store(db->get());
  storage::ArtifactStore artifacts(db->get());
  auto pool = engine::DevicePool::Create("cpu:1");
  ASSERT_TRUE(pool.ok()) << pool.status();
  storage::DatasetMeta meta;
  meta.name = "dense";
  meta.kind = storage::DatasetKind::kDense;
  meta.value_dtype = storage::ValueDtype::kFloat32;
  meta.width = 1024;
  const uint64_t id = *store.CreateDataset(meta);
  {
    auto writer = store.OpenWriter(id);
    ASSERT_TRUE(writer.ok());
    std::vector<float> values(20000 * 1024, 1.5f);  // 5 blocks of 4M values
    std::vector<int32_t> tokens(20000, 9);
    ASSERT_TRUE((*writer)->AppendDense(20000, values.data(), tokens.data()).ok());
    ASSERT_TRUE((*writer)->Commit().ok());
  }
  RunnerEnvironment env;
  env.pool = pool->get();
  env.store = &store;
  env.artifacts = &artifacts;
  env.export_root = dir + "/exports";
  std::filesystem::create_directories(env.export_root);
  const JobRunner runner = MakeJobRunners(env).at(latentd::v1::EXPORT);
  EXPECT_FALSE(runner.holds_devices);

  latentd::v1::JobSpec spec;
  spec.set_type(latentd::v1::EXPORT);
  spec.mutable_export_()->set_dataset_id(id);
  spec.mutable_export_()->set_path("dense.npz");
  ASSERT_TRUE(runner.validate(spec).ok());
  engine::RecordingJobContext whole;
  auto result = runner.run(spec, &whole);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->export_().rows(), 20000);
  ASSERT_EQ(whole.progress().size(), 6u);
  // From where it starts (so the rate has a start even when it writes one block) to the end.
  EXPECT_EQ(whole.progress().front().ToString(), "0/20000 rows");
  EXPECT_EQ(whole.progress().back().ToString(), "20000/20000 rows");

  spec.mutable_export_()->set_path("stopped.npz");
  engine::RecordingJobContext cancelled;
  cancelled.CancelAfterChecks(1);  // stop after the first block
  EXPECT_EQ(runner.run(spec, &cancelled).status().code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(cancelled.progress().size(), 2u);
  EXPECT_FALSE(std::filesystem::exists(env.export_root + "/stopped.npz"));
  EXPECT_FALSE(std::filesystem::exists(env.export_root + "/stopped.npz.tmp"));

  spec.mutable_export_()->set_path("/elsewhere.npz");
  EXPECT_EQ(runner.validate(spec).code(), absl::StatusCode::kPermissionDenied);
}

}  // namespace
}  // namespace latentd::server
