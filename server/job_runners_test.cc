#include "server/job_runners.h"

#include <memory>

#include "common/test_dir.h"
#include "engine/checkpoint.h"
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

}  // namespace
}  // namespace latentd::server
