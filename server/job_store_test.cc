#include "server/job_store.h"

#include <cstdlib>
#include <memory>
#include <string>

#include "common/test_dir.h"
#include "gtest/gtest.h"

namespace latentd::server {
namespace {

latentd::v1::JobEvent Event(uint64_t job, int64_t seq) {
  latentd::v1::JobEvent e;
  e.set_job_id(job);
  e.set_sequence(seq);
  e.mutable_log()->set_text("event " + std::to_string(seq));
  return e;
}

TEST(JobStore, RecordsEventsAndCounterSurviveReopen) {
  std::string dir = FreshTestDir("job_store");
  {
    auto db = *storage::Db::Open(dir);
    JobStore store(db.get());
    EXPECT_EQ(*store.LoadNextId(), 1u);
    latentd::v1::Job job;
    job.set_id(1);
    job.set_request_id("r");
    ASSERT_TRUE(store.Create(job, {Event(1, 1)}).ok());
    job.set_state(latentd::v1::RUNNING);
    ASSERT_TRUE(store.Update(job, {Event(1, 2), Event(1, 3)}, /*sync=*/false).ok());
    latentd::v1::Job other;
    other.set_id(2);
    ASSERT_TRUE(store.Create(other, {Event(2, 1)}).ok());
  }
  auto db = *storage::Db::Open(dir);
  JobStore store(db.get());
  EXPECT_EQ(*store.LoadNextId(), 3u);
  auto jobs = *store.LoadAll();
  ASSERT_EQ(jobs.size(), 2u);
  EXPECT_EQ(jobs[0].state(), latentd::v1::RUNNING);
  EXPECT_EQ(jobs[0].request_id(), "r");
  auto events = *store.ReadEvents(1, 0, 100);
  ASSERT_EQ(events.size(), 3u);  // job 2's events are not mixed in
  EXPECT_EQ(events[2].sequence(), 3);
  auto tail = *store.ReadEvents(1, 1, 1);
  ASSERT_EQ(tail.size(), 1u);
  EXPECT_EQ(tail[0].sequence(), 2);
}

TEST(JobStore, DeleteRemovesRecordEventsAndRequestIdButNotTheCounter) {
  auto db = *storage::Db::Open(FreshTestDir("job_store_delete"));
  JobStore store(db.get());
  latentd::v1::Job job;
  job.set_id(1);
  job.set_request_id("r");
  ASSERT_TRUE(store.Create(job, {Event(1, 1), Event(1, 2)}).ok());
  latentd::v1::Job other;
  other.set_id(2);
  ASSERT_TRUE(store.Create(other, {Event(2, 1)}).ok());
  ASSERT_TRUE(store.Delete(job).ok());
  auto jobs = *store.LoadAll();
  ASSERT_EQ(jobs.size(), 1u);
  EXPECT_EQ(jobs[0].id(), 2u);
  EXPECT_TRUE(store.ReadEvents(1, 0, 100)->empty());
  EXPECT_EQ(store.ReadEvents(2, 0, 100)->size(), 1u);
  EXPECT_EQ(*store.LoadNextId(), 3u);  // ids are never reused
  EXPECT_TRUE(absl::IsNotFound(db->Get(storage::Family::kJobs, "Rr").status()));
}

}  // namespace
}  // namespace latentd::server
