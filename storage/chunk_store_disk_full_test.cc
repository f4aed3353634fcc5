// A full disk during a commit: the commit fails with RESOURCE_EXHAUSTED, the writer refuses
// further use, the store stays readable with everything committed before, and after space
// returns a reopened writer resumes at the watermark.
#include <atomic>
#include <cstdlib>

#include "common/test_dir.h"
#include "gtest/gtest.h"
#include "rocksdb/env.h"
#include "rocksdb/file_system.h"
#include "storage/chunk_store.h"

namespace latentd::storage {
namespace {

std::atomic<bool> disk_full{false};

class FullDiskFile : public rocksdb::FSWritableFileOwnerWrapper {
 public:
  using FSWritableFileOwnerWrapper::FSWritableFileOwnerWrapper;
  rocksdb::IOStatus Append(const rocksdb::Slice& data, const rocksdb::IOOptions& o,
                           rocksdb::IODebugContext* d) override {
    if (disk_full) return rocksdb::IOStatus::NoSpace("injected: no space left on device");
    return FSWritableFileOwnerWrapper::Append(data, o, d);
  }
  rocksdb::IOStatus Append(const rocksdb::Slice& data, const rocksdb::IOOptions& o,
                           const rocksdb::DataVerificationInfo& v,
                           rocksdb::IODebugContext* d) override {
    if (disk_full) return rocksdb::IOStatus::NoSpace("injected: no space left on device");
    return FSWritableFileOwnerWrapper::Append(data, o, v, d);
  }
};

class FullDiskFileSystem : public rocksdb::FileSystemWrapper {
 public:
  FullDiskFileSystem() : FileSystemWrapper(rocksdb::FileSystem::Default()) {}
  const char* Name() const override { return "FullDiskFileSystem"; }
  rocksdb::IOStatus NewWritableFile(const std::string& f, const rocksdb::FileOptions& o,
                                    std::unique_ptr<rocksdb::FSWritableFile>* r,
                                    rocksdb::IODebugContext* d) override {
    std::unique_ptr<rocksdb::FSWritableFile> inner;
    rocksdb::IOStatus s = target()->NewWritableFile(f, o, &inner, d);
    if (s.ok()) r->reset(new FullDiskFile(std::move(inner)));
    return s;
  }
};

DatasetMeta Meta() {
  DatasetMeta m;
  m.name = "full";
  m.width = 32;
  return m;
}

absl::Status AppendRows(DatasetWriter* w, int64_t n) {
  std::vector<int64_t> indptr{0};
  std::vector<int32_t> idx, tok;
  std::vector<float> val;
  for (int64_t r = 0; r < n; ++r) {
    idx.push_back(static_cast<int32_t>(
        (w->rows_committed() + w->rows_in_flight() + w->rows_pending() + r) % 32));
    val.push_back(1.5f);
    indptr.push_back(static_cast<int64_t>(idx.size()));
    tok.push_back(7);
  }
  return w->AppendSparse(n, indptr.data(), idx.data(), val.data(), tok.data());
}

TEST(ChunkStoreDiskFull, CommitFailsCleanlyAndCommittedRowsSurvive) {
  const std::string dir = FreshTestDir("disk_full");
  auto fs = std::make_shared<FullDiskFileSystem>();
  std::unique_ptr<rocksdb::Env> env = rocksdb::NewCompositeEnv(fs);
  uint64_t id;
  {
    DbOptions o;
    o.env = env.get();
    auto db = Db::Open(dir, o);
    ASSERT_TRUE(db.ok()) << db.status();
    ChunkStore store(db->get());
    id = *store.CreateDataset(Meta());
    auto w = store.OpenWriter(id);
    ASSERT_TRUE(w.ok());
    ASSERT_TRUE(AppendRows(w->get(), 100).ok());
    ASSERT_TRUE((*w)->Commit().ok());

    disk_full = true;
    ASSERT_TRUE(AppendRows(w->get(), 50).ok());
    absl::Status s = (*w)->Commit();
    EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
    EXPECT_NE(s.message().find("keeps 100 committed rows"), std::string::npos) << s;
    EXPECT_EQ((*w)->Commit().code(), absl::StatusCode::kFailedPrecondition);  // must reopen

    // Still readable, with exactly the committed rows.
    auto info = store.GetDataset(id);
    ASSERT_TRUE(info.ok()) << info.status();
    EXPECT_EQ(info->rows_committed(), 100);
    auto rows = store.ReadRows(id, 0, 0);
    ASSERT_TRUE(rows.ok()) << rows.status();
    EXPECT_EQ(rows->num_rows, 100);
    disk_full = false;
  }
  DbOptions o;
  o.env = env.get();
  auto db = Db::Open(dir, o);
  ASSERT_TRUE(db.ok()) << db.status();
  ChunkStore store(db->get());
  auto w = store.OpenWriter(id);
  ASSERT_TRUE(w.ok());
  EXPECT_EQ((*w)->rows_committed(), 100);
  ASSERT_TRUE(AppendRows(w->get(), 50).ok());
  ASSERT_TRUE((*w)->Commit().ok());
  EXPECT_EQ(store.ReadRows(id, 0, 0)->num_rows, 150);
  EXPECT_EQ(store.GetLatentStats(id, 3)->firing_count, 5);  // rows 3, 35, 67, 99, 131
}

// A background write that fails is reported by the next call that waits for it, and nothing of
// it (or of what was encoded after it) reaches the store.
TEST(ChunkStoreDiskFull, AsyncCommitFailureSurfacesAtTheNextWait) {
  const std::string dir = FreshTestDir("disk_full_async");
  auto fs = std::make_shared<FullDiskFileSystem>();
  std::unique_ptr<rocksdb::Env> env = rocksdb::NewCompositeEnv(fs);
  DbOptions o;
  o.env = env.get();
  auto db = Db::Open(dir, o);
  ASSERT_TRUE(db.ok()) << db.status();
  ChunkStore store(db->get());
  uint64_t id = *store.CreateDataset(Meta());
  auto w = store.OpenWriter(id);
  ASSERT_TRUE(w.ok());
  ASSERT_TRUE(AppendRows(w->get(), 100).ok());
  ASSERT_TRUE((*w)->CommitAsync().ok());
  ASSERT_TRUE((*w)->WaitDurable().ok());
  EXPECT_EQ((*w)->rows_committed(), 100);

  disk_full = true;
  ASSERT_TRUE(AppendRows(w->get(), 50).ok());
  ASSERT_TRUE((*w)->CommitAsync().ok());  // handed over; the write fails in the background
  EXPECT_EQ((*w)->rows_in_flight(), 50);
  ASSERT_TRUE(AppendRows(w->get(), 30).ok());
  absl::Status s = (*w)->CommitAsync();
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  EXPECT_NE(s.message().find("rows [100, 150)"), std::string::npos) << s;
  EXPECT_EQ((*w)->rows_committed(), 100);
  EXPECT_EQ((*w)->WaitDurable().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ((*w)->Commit().code(), absl::StatusCode::kFailedPrecondition);  // must reopen
  disk_full = false;
  w->reset();
  EXPECT_EQ(store.GetDataset(id)->rows_committed(), 100);
  EXPECT_EQ(store.ReadRows(id, 0, 0)->num_rows, 100);
}

// A writer without resident per-latent state folds a block from the store before the batch
// that brings its 16th operand; when the disk fills there, that commit fails like any other
// and a resumed writer continues from the committed rows.
TEST(ChunkStoreDiskFull, WideWriterFailsCleanlyWhileFoldingABlock) {
  const std::string dir = FreshTestDir("disk_full_wide");
  auto fs = std::make_shared<FullDiskFileSystem>();
  std::unique_ptr<rocksdb::Env> env = rocksdb::NewCompositeEnv(fs);
  ChunkStoreOptions wide;
  wide.resident_latent_state_max_width = 0;
  uint64_t id;
  {
    DbOptions o;
    o.env = env.get();
    auto db = Db::Open(dir, o);
    ASSERT_TRUE(db.ok()) << db.status();
    ChunkStore store(db->get(), wide);
    id = *store.CreateDataset(Meta());
    auto w = store.OpenWriter(id);
    ASSERT_TRUE(w.ok());
    for (int c = 0; c < 15; ++c) {  // 15 operands on the one block
      ASSERT_TRUE(AppendRows(w->get(), 4).ok());
      ASSERT_TRUE((*w)->Commit().ok());
    }
    disk_full = true;
    ASSERT_TRUE(AppendRows(w->get(), 4).ok());
    absl::Status s = (*w)->Commit();  // the 16th: the block is folded first
    EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
    EXPECT_NE(s.message().find("keeps 60 committed rows"), std::string::npos) << s;
    EXPECT_EQ(store.GetDataset(id)->rows_committed(), 60);
    EXPECT_EQ(store.GetLatentStats(id, 3)->firing_count, 2);  // rows 3, 35
    disk_full = false;
  }
  DbOptions o;
  o.env = env.get();
  auto db = Db::Open(dir, o);
  ASSERT_TRUE(db.ok()) << db.status();
  ChunkStore store(db->get(), wide);
  auto w = store.OpenWriter(id);
  ASSERT_TRUE(w.ok());
  EXPECT_EQ((*w)->rows_committed(), 60);
  for (int c = 0; c < 20; ++c) {  // through the fold and past it
    ASSERT_TRUE(AppendRows(w->get(), 4).ok());
    ASSERT_TRUE((*w)->Commit().ok());
  }
  EXPECT_EQ(store.ReadRows(id, 0, 0)->num_rows, 140);
  auto st = store.GetLatentStats(id, 3);
  ASSERT_TRUE(st.ok()) << st.status();
  EXPECT_EQ(st->firing_count, 5);  // rows 3, 35, 67, 99, 131
  EXPECT_EQ(st->sum, 7.5);
  auto top = store.TopActivations(id, 3, 0, 0, 0);
  ASSERT_TRUE(top.ok()) << top.status();
  ASSERT_EQ(top->size(), 5u);  // equal values: ordered by row
  EXPECT_EQ((*top)[0].row, 3);
  EXPECT_EQ((*top)[4].row, 131);
}

}  // namespace
}  // namespace latentd::storage
