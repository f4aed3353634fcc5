// Exports stream in blocks: the block size changes nothing in what is written, progress is
// reported block by block, and an export stopped through it leaves nothing behind.
// (The files' contents are checked against the store by tests/python/test_export.py with scipy,
// h5py and numpy, and by export_parquet_test / delphi_export_test.)
#include "storage/export.h"

#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "common/test_dir.h"
#include "gtest/gtest.h"
#include "storage/chunk_store.h"
#include "storage/sparse_rows_testing.h"

namespace latentd::storage {
namespace {

namespace fs = std::filesystem;

std::string FileBytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

class ExportTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = FreshTestDir("export_test");
    auto db = Db::Open(dir_ + "/db");
    ASSERT_TRUE(db.ok()) << db.status();
    db_ = std::move(*db);
    ChunkStoreOptions options;
    options.chunk_rows = 64;
    store_ = std::make_unique<ChunkStore>(db_.get(), options);

    DatasetMeta meta;
    meta.name = "sparse";
    meta.hook_name = "blocks.1.hook_resid_post";
    meta.encoder = "topk";
    meta.k = 12;
    meta.width = 300;
    meta.context_length = 50;
    auto sparse = store_->CreateDataset(meta);
    ASSERT_TRUE(sparse.ok());
    sparse_ = *sparse;
    auto writer = store_->OpenWriter(sparse_);
    ASSERT_TRUE(writer.ok());
    std::mt19937 rng(5);
    const SparseRowsForTest rows = RandomSparseRows(rng, 500, 300, 12);  // 0 to 12 latents
    ASSERT_TRUE(AppendAndCommit(**writer, rows).ok());

    meta.name = "dense";
    meta.kind = DatasetKind::kDense;
    meta.value_dtype = ValueDtype::kFloat32;
    meta.encoder = "";
    meta.width = 6;
    auto dense = store_->CreateDataset(meta);
    ASSERT_TRUE(dense.ok());
    dense_ = *dense;
    auto dense_writer = store_->OpenWriter(dense_);
    ASSERT_TRUE(dense_writer.ok());
    std::vector<float> values(200 * 6);
    std::vector<int32_t> tokens(200);
    for (size_t i = 0; i < values.size(); ++i) values[i] = static_cast<float>(i) * 0.25f - 9;
    for (int i = 0; i < 200; ++i) tokens[i] = 7 * i;
    ASSERT_TRUE((*dense_writer)->AppendDense(200, values.data(), tokens.data()).ok());
    ASSERT_TRUE((*dense_writer)->Commit().ok());
  }

  // Names in the export directory besides the store's.
  std::vector<std::string> Files() const {
    std::vector<std::string> names;
    for (const auto& e : fs::directory_iterator(dir_)) {
      if (e.path().filename() != "db") names.push_back(e.path().filename().string());
    }
    return names;
  }

  std::string dir_;
  std::unique_ptr<Db> db_;
  std::unique_ptr<ChunkStore> store_;
  uint64_t sparse_ = 0, dense_ = 0;
};

TEST_F(ExportTest, AnNpzWrittenInSmallBlocksIsTheSameFile) {
  for (uint64_t id : {sparse_, dense_}) {
    ExportOptions one_block;
    auto whole =
        ExportDataset(*store_, id, 30, 0, ExportFormat::kNpz, dir_ + "/whole.npz", one_block);
    ASSERT_TRUE(whole.ok()) << whole.status();
    ExportOptions small;
    small.block_values = 40;  // a few rows a block, blocks ending inside chunks
    int blocks = 0;
    small.progress = [&](int64_t, int64_t) { return ++blocks > 0; };
    auto blocked =
        ExportDataset(*store_, id, 30, 0, ExportFormat::kNpz, dir_ + "/blocked.npz", small);
    ASSERT_TRUE(blocked.ok()) << blocked.status();
    EXPECT_GT(blocks, 20);
    EXPECT_EQ(blocked->rows, whole->rows);
    EXPECT_EQ(blocked->nnz, whole->nnz);
    EXPECT_EQ(FileBytes(dir_ + "/blocked.npz"), FileBytes(dir_ + "/whole.npz")) << id;
  }
}

// HDF5 stores whole chunks: a small export's file is about its arrays' size, not a chunk of a
// quarter million entries for each array (4.7 MB for an 8192-row dataset of 1.7 MB before).
TEST_F(ExportTest, AnHdf5FileIsAboutTheSizeOfItsArrays) {
  for (uint64_t id : {sparse_, dense_}) {
    const std::string path = dir_ + "/small.h5";
    auto exported = ExportDataset(*store_, id, 0, 0, ExportFormat::kHdf5, path);
    ASSERT_TRUE(exported.ok()) << exported.status();
    // SPARSE: fp16 values, int32 indices, int64 indptr; DENSE: fp32 values; int32 token ids.
    const int64_t arrays =
        id == sparse_ ? exported->nnz * (2 + 4) + (exported->rows + 1) * 8 + exported->rows * 4
                      : exported->nnz * 4 + exported->rows * 4;
    EXPECT_EQ(exported->bytes, static_cast<int64_t>(fs::file_size(path)));
    EXPECT_LT(exported->bytes, arrays + (int64_t{16} << 10)) << "arrays of " << arrays << " B";
    fs::remove(path);
  }
}

TEST_F(ExportTest, ProgressCountsRowsUpToTheRange) {
  for (ExportFormat format : {ExportFormat::kNpz, ExportFormat::kHdf5, ExportFormat::kParquet}) {
    ExportOptions options;
    options.block_values = 120;  // about 20 rows a block
    std::vector<std::pair<int64_t, int64_t>> calls;
    options.progress = [&](int64_t done, int64_t total) {
      calls.emplace_back(done, total);
      return true;
    };
    auto exported =
        ExportDataset(*store_, sparse_, 100, 250, format, dir_ + "/progress.out", options);
    ASSERT_TRUE(exported.ok()) << exported.status();
    ASSERT_GT(calls.size(), 5u);
    EXPECT_EQ(calls.front().first, 0);  // where it starts, before the first block
    for (size_t i = 0; i < calls.size(); ++i) {
      EXPECT_EQ(calls[i].second, 250);
      if (i > 0) {
        EXPECT_GT(calls[i].first, calls[i - 1].first);
      }
    }
    EXPECT_EQ(calls.back().first, 250);
  }
}

TEST_F(ExportTest, AStoppedExportLeavesNothingBehind) {
  for (ExportFormat format :
       {ExportFormat::kNpz, ExportFormat::kHdf5, ExportFormat::kParquet, ExportFormat::kDelphi}) {
    ExportOptions options;
    options.block_values = 120;  // about 20 rows a block
    int calls = 0;
    options.progress = [&](int64_t, int64_t) { return ++calls < 3; };
    const std::string path = dir_ + "/stopped";
    auto exported = ExportDataset(*store_, sparse_, 0, 0, format, path, options);
    EXPECT_EQ(exported.status().code(), absl::StatusCode::kCancelled);
    EXPECT_NE(exported.status().message().find("stopped after"), std::string::npos)
        << exported.status();
    EXPECT_EQ(calls, 3);
    // No file, temporary file, side file or delphi module directory.
    const std::vector<std::string> files = Files();
    for (const std::string& name : files) {
      if (format == ExportFormat::kDelphi && name == "stopped") {
        EXPECT_TRUE(fs::is_empty(path)) << "a cancelled delphi export wrote into " << path;
        continue;
      }
      ADD_FAILURE() << "left behind: " << name;
    }
    fs::remove_all(path);
  }
}

TEST_F(ExportTest, TheRangeIsCheckedBeforeAnythingIsWritten) {
  auto past = ExportDataset(*store_, sparse_, 400, 200, ExportFormat::kNpz, dir_ + "/x.npz");
  EXPECT_EQ(past.status().code(), absl::StatusCode::kOutOfRange);
  EXPECT_NE(past.status().message().find("committed rows"), std::string::npos);
  auto negative = ExportDataset(*store_, dense_, 0, -1, ExportFormat::kHdf5, dir_ + "/x.h5");
  EXPECT_EQ(negative.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ExportDataset(*store_, 999, 0, 0, ExportFormat::kParquet, dir_ + "/x.parquet")
                .status()
                .code(),
            absl::StatusCode::kNotFound);
  EXPECT_TRUE(Files().empty());
}

}  // namespace
}  // namespace latentd::storage
