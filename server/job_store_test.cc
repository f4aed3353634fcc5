#include "server/job_store.h"

#include <cstdlib>
#include <memory>
#include <string>

#include "common/big_endian.h"
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
  auto jobs = store.LoadAll()->jobs;
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
  auto jobs = store.LoadAll()->jobs;
  ASSERT_EQ(jobs.size(), 1u);
  EXPECT_EQ(jobs[0].id(), 2u);
  EXPECT_TRUE(store.ReadEvents(1, 0, 100)->empty());
  EXPECT_EQ(store.ReadEvents(2, 0, 100)->size(), 1u);
  EXPECT_EQ(*store.LoadNextId(), 3u);  // ids are never reused
  EXPECT_TRUE(absl::IsNotFound(db->Get(storage::Family::kJobs, "Rr").status()));
}

// A damaged record (one that does not parse, or one naming another job's id) is left out and
// described; the others load.
TEST(JobStore, UnreadableRecordsAreLeftOutAndNamed) {
  auto db = *storage::Db::Open(FreshTestDir("job_store_damaged"));
  JobStore store(db.get());
  for (uint64_t id : {1, 2, 3}) {
    latentd::v1::Job job;
    job.set_id(id);
    ASSERT_TRUE(store.Create(job, {Event(id, 1)}).ok());
  }
  std::string key = "J";
  AppendBigEndian64(2, &key);
  ASSERT_TRUE(db->Put(storage::Family::kJobs, key, "\xff\xff\xff", true).ok());
  latentd::v1::Job impostor;
  impostor.set_id(1);
  key = "J";
  AppendBigEndian64(3, &key);
  ASSERT_TRUE(db->Put(storage::Family::kJobs, key, impostor.SerializeAsString(), true).ok());

  auto loaded = store.LoadAll();
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  ASSERT_EQ(loaded->jobs.size(), 1u);
  EXPECT_EQ(loaded->jobs[0].id(), 1u);
  ASSERT_EQ(loaded->unreadable.size(), 2u);
  EXPECT_EQ(loaded->unreadable[0], "job record 2: does not parse");
  EXPECT_EQ(loaded->unreadable[1], "job record 3: holds job id 1, not its own");
}

}  // namespace
}  // namespace latentd::server
