#include "storage/db.h"

#include <sys/statvfs.h>

#include <cstdlib>
#include <string>

#include "common/test_dir.h"
#include "gtest/gtest.h"

namespace latentd::storage {
namespace {

TEST(Db, FamiliesAreSeparateAndSurviveReopen) {
  std::string dir = FreshTestDir("db_families");
  {
    auto db = Db::Open(dir);
    ASSERT_TRUE(db.ok()) << db.status();
    ASSERT_TRUE((*db)->Put(Family::kJobs, "k", "job", /*sync=*/true).ok());
    ASSERT_TRUE((*db)->Put(Family::kMeta, "k", "meta", /*sync=*/true).ok());
  }
  auto db = Db::Open(dir);
  ASSERT_TRUE(db.ok()) << db.status();
  EXPECT_EQ(*(*db)->Get(Family::kJobs, "k"), "job");
  EXPECT_EQ(*(*db)->Get(Family::kMeta, "k"), "meta");
  EXPECT_EQ((*db)->Get(Family::kChunks, "k").status().code(), absl::StatusCode::kNotFound);
}

TEST(Db, BatchIsAtomicAcrossFamilies) {
  std::string dir = FreshTestDir("db_batch");
  auto db = Db::Open(dir);
  ASSERT_TRUE(db.ok());
  rocksdb::WriteBatch batch;
  batch.Put((*db)->handle(Family::kChunks), "c", std::string(100000, 'x'));
  batch.Put((*db)->handle(Family::kMeta), "w", "1");
  ASSERT_TRUE((*db)->Write(&batch, /*sync=*/true).ok());
  EXPECT_EQ((*db)->Get(Family::kChunks, "c")->size(), 100000u);
  ASSERT_TRUE((*db)->CompactAll().ok());
  auto bytes = (*db)->BytesOnDisk();
  ASSERT_TRUE(bytes.ok());
  EXPECT_GT(*bytes, 0u);
}

TEST(Db, OpenMissingWithoutCreateFails) {
  DbOptions options;
  options.create_if_missing = false;
  auto db = Db::Open(FreshTestDir("db_missing"), options);
  EXPECT_FALSE(db.ok());
}

TEST(Db, FreeDiskBytesIsWhatTheFileSystemSays) {
  std::string dir = FreshTestDir("db_free");
  auto db = Db::Open(dir);
  ASSERT_TRUE(db.ok());
  struct statvfs fs;
  ASSERT_EQ(statvfs(dir.c_str(), &fs), 0);
  const int64_t expected = static_cast<int64_t>(fs.f_bavail) * static_cast<int64_t>(fs.f_frsize);
  // Other processes write meanwhile: the same to within 1 GB.
  EXPECT_NEAR(static_cast<double>((*db)->FreeDiskBytes()), static_cast<double>(expected), 1e9);
  EXPECT_GT((*db)->FreeDiskBytes(), 0);
}

}  // namespace
}  // namespace latentd::storage
