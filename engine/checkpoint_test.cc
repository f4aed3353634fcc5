#include "engine/checkpoint.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>

#include "rocksdb/write_batch.h"

namespace latentd::engine {
namespace {

std::string TempDir(const std::string& name) {
  const char* base = std::getenv("TEST_TMPDIR");
  std::string dir = std::string(base ? base : "/tmp") + "/" + name;
  std::filesystem::remove_all(dir);
  return dir;
}

TEST(DbCheckpointStoreTest, NewestCommitWinsAndSurvivesReopen) {
  const std::string dir = TempDir("ckpt_reopen");
  {
    auto db = storage::Db::Open(dir);
    ASSERT_TRUE(db.ok()) << db.status();
    DbCheckpointStore store(db->get(), 42);
    auto none = store.LoadLatest();
    ASSERT_TRUE(none.ok());
    EXPECT_FALSE(none->has_value());
    ASSERT_TRUE(store.Commit({10, "state at ten"}).ok());
    ASSERT_TRUE(store.Commit({20, std::string(100000, 'x')}).ok());
    // Another job's checkpoints are separate.
    DbCheckpointStore other(db->get(), 43);
    ASSERT_TRUE(other.Commit({5, "other"}).ok());
  }
  auto db = storage::Db::Open(dir);
  ASSERT_TRUE(db.ok());
  DbCheckpointStore store(db->get(), 42);
  auto latest = store.LoadLatest();
  ASSERT_TRUE(latest.ok()) << latest.status();
  ASSERT_TRUE(latest->has_value());
  EXPECT_EQ((*latest)->step, 20);
  EXPECT_EQ((*latest)->blob, std::string(100000, 'x'));
  // The superseded blob was deleted in the same batch.
  EXPECT_TRUE(absl::IsNotFound(
      db->get()
          ->Get(storage::Family::kChunks,
                std::string("ckpt/") + std::string(7, '\0') + "*" + std::string(7, '\0') + "\n")
          .status()));
  ASSERT_TRUE(store.Clear().ok());
  EXPECT_FALSE(store.LoadLatest()->has_value());
  EXPECT_TRUE(DbCheckpointStore(db->get(), 43).LoadLatest()->has_value());
}

TEST(DbCheckpointStoreTest, AdoptionMovesTheCheckpointToTheNewJob) {
  auto db = storage::Db::Open(TempDir("ckpt_adopt"));
  ASSERT_TRUE(db.ok()) << db.status();
  DbCheckpointStore cancelled(db->get(), 5), next(db->get(), 6), third(db->get(), 7);
  EXPECT_EQ(next.AdoptFrom(5).status().code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(cancelled.Commit({30, "state at thirty"}).ok());
  EXPECT_EQ(**cancelled.LatestStep(), 30);

  auto adopted = next.AdoptFrom(5);
  ASSERT_TRUE(adopted.ok()) << adopted.status();
  EXPECT_EQ(**adopted, 30);
  EXPECT_EQ((*next.LoadLatest())->blob, "state at thirty");
  EXPECT_FALSE(cancelled.LatestStep()->has_value());
  EXPECT_FALSE(cancelled.LoadLatest()->has_value());
  // Only one job may continue from it.
  EXPECT_EQ(third.AdoptFrom(5).status().code(), absl::StatusCode::kFailedPrecondition);
  // The adopting job, resumed after a crash, keeps what it holds (here a newer checkpoint).
  ASSERT_TRUE(next.Commit({40, "state at forty"}).ok());
  ASSERT_TRUE(cancelled.Commit({30, "stale"}).ok());
  auto again = next.AdoptFrom(5);
  ASSERT_TRUE(again.ok());
  EXPECT_FALSE(again->has_value());
  EXPECT_EQ((*next.LoadLatest())->step, 40);
}

TEST(DbCheckpointStoreTest, CorruptBlobIsDataLossNotAGoodCheckpoint) {
  const std::string dir = TempDir("ckpt_corrupt");
  auto db = storage::Db::Open(dir);
  ASSERT_TRUE(db.ok());
  DbCheckpointStore store(db->get(), 7);
  ASSERT_TRUE(store.Commit({3, "abcdef"}).ok());
  std::string key =
      std::string("ckpt/") + std::string(7, '\0') + "\x07" + std::string(7, '\0') + "\x03";
  ASSERT_TRUE(db->get()->Put(storage::Family::kChunks, key, "abcdeX", true).ok());
  auto latest = store.LoadLatest();
  EXPECT_EQ(latest.status().code(), absl::StatusCode::kDataLoss);
}

}  // namespace
}  // namespace latentd::engine
