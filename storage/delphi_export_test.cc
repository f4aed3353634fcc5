// delphi latent caches read back with common/safetensors: what ExportDelphi refuses, the wide
// location and activation types, and an export that replaces an earlier one of the same hook.
// (tests/python/test_export.py compares a whole cache with the store's rows as delphi loads it.)
#include <algorithm>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "common/safetensors.h"
#include "common/test_dir.h"
#include "gtest/gtest.h"
#include "storage/chunk_store.h"
#include "storage/export.h"
#include "storage/value_codec.h"

namespace latentd::storage {
namespace {

namespace fs = std::filesystem;

// ExportDelphi with `splits` files per hook (0: delphi's default), gathering within
// `gather_bytes`, reporting to `progress`.
absl::StatusOr<ExportResult> Delphi(const ChunkStore& store, uint64_t id, int64_t start,
                                    int64_t count, int splits, const std::string& dir,
                                    int64_t gather_bytes = kDelphiGatherBytes,
                                    ExportProgress progress = ExportProgress()) {
  ExportOptions options;
  options.delphi_splits = splits;
  options.delphi_gather_bytes = gather_bytes;
  options.progress = std::move(progress);
  return ExportDelphi(store, id, start, count, dir, options);
}

class DelphiExportTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = FreshTestDir("delphi_export");
    auto db = Db::Open(dir_ + "/db");
    ASSERT_TRUE(db.ok()) << db.status();
    db_ = *std::move(db);
    store_ = std::make_unique<ChunkStore>(db_.get());
  }
  // A SPARSE dataset of `sequences` sequences of 4 rows; row r fires latent Latent(r, width)
  // with value r + 1, but row 7's is 100000 (past fp16's range).
  static int32_t Latent(int64_t r, int32_t width) {
    return static_cast<int32_t>((r * 17389) % width);
  }
  static float Value(int64_t r) { return r == 7 ? 100000.0f : static_cast<float>(r + 1); }
  uint64_t MakeDataset(const std::string& name, int32_t width, int sequences) {
    DatasetMeta meta;
    meta.name = name;
    meta.hook_name = "blocks.0.hook_resid_post";
    meta.encoder = "relu";
    meta.width = width;
    meta.context_length = 4;
    meta.value_dtype = ValueDtype::kFloat32;
    const uint64_t id = *store_->CreateDataset(meta);
    auto writer = store_->OpenWriter(id);
    EXPECT_TRUE(writer.ok()) << writer.status();
    const int rows = 4 * sequences;
    std::vector<int64_t> indptr{0};
    std::vector<int32_t> indices, tokens;
    std::vector<float> values;
    for (int r = 0; r < rows; ++r) {
      indices.push_back(Latent(r, width));
      values.push_back(Value(r));
      indptr.push_back(r + 1);
      tokens.push_back(1000 + r);
    }
    EXPECT_TRUE(
        (*writer)
            ->AppendSparse(rows, indptr.data(), indices.data(), values.data(), tokens.data())
            .ok());
    EXPECT_TRUE((*writer)->Commit().ok());
    return id;
  }
  std::string Module() const { return dir_ + "/latents/blocks.0.hook_resid_post"; }

  std::string dir_;
  std::unique_ptr<Db> db_;
  std::unique_ptr<ChunkStore> store_;
};

TEST_F(DelphiExportTest, RefusesWhatDelphiCannotRead) {
  const uint64_t id = MakeDataset("s", 16, 3);
  const std::string out = dir_ + "/latents";
  auto code = [&](int64_t start, int64_t count, int splits) {
    return Delphi(*store_, id, start, count, splits, out).status().code();
  };
  EXPECT_EQ(code(2, 0, 0), absl::StatusCode::kInvalidArgument);  // inside a sequence
  EXPECT_EQ(code(0, 6, 0), absl::StatusCode::kInvalidArgument);  // a sequence and a half
  EXPECT_EQ(code(0, 16, 0), absl::StatusCode::kOutOfRange);      // past the 12 rows
  EXPECT_EQ(code(16, 0, 0), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(code(12, 0, 0), absl::StatusCode::kInvalidArgument);  // no sequence left
  EXPECT_EQ(code(0, 0, 17), absl::StatusCode::kInvalidArgument);  // more splits than latents
  EXPECT_EQ(code(0, 0, -1), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Delphi(*store_, id, 2, 0, 0, out).status().message(),
            "row_start: 2 is not the start of a sequence (context length 4); DELPHI exports "
            "whole sequences");
  EXPECT_EQ(Delphi(*store_, 999, 0, 0, 0, out).status().code(), absl::StatusCode::kNotFound);
  DatasetMeta dense;
  dense.name = "d";
  dense.kind = DatasetKind::kDense;
  dense.width = 8;
  const uint64_t dense_id = *store_->CreateDataset(dense);
  EXPECT_EQ(Delphi(*store_, dense_id, 0, 0, 0, out).status().message(),
            "format: DELPHI exports the latents of a SPARSE dataset; dataset " +
                std::to_string(dense_id) + " is DENSE");
  // Without sequence boundaries the range is one sequence; an empty one is refused too.
  DatasetMeta flat;
  flat.name = "flat";
  flat.width = 8;
  flat.context_length = 0;
  const uint64_t flat_id = *store_->CreateDataset(flat);
  EXPECT_EQ(Delphi(*store_, flat_id, 0, 0, 0, out).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_FALSE(fs::exists(Module()));  // nothing written by a refused export
}

// Latent offsets past 65535 need uint32 locations, activations past fp16's range float32; each
// file decides for itself, as delphi's writer does.
TEST_F(DelphiExportTest, WidensLocationsAndActivationsThatDoNotFit) {
  const uint64_t id = MakeDataset("wide", 70000, 2);  // row 4 fires latent 69556
  struct Want {
    const char* file;
    int64_t first;
    StDtype locations, activations;
  };
  for (int splits : {1, 2}) {
    auto exported = Delphi(*store_, id, 0, 0, splits, dir_ + "/latents");
    ASSERT_TRUE(exported.ok()) << exported.status();
    EXPECT_EQ(exported->path, Module());
    EXPECT_EQ(exported->rows, 8);
    EXPECT_EQ(exported->nnz, 8);
    // Rows 0, 1, 2, 5, 6 fire latents below 35000; rows 3, 4, 7 (100000) above.
    const std::vector<Want> want =
        splits == 1 ? std::vector<Want>{{"0_69999", 0, StDtype::kU32, StDtype::kF32}}
                    : std::vector<Want>{{"0_34999", 0, StDtype::kU16, StDtype::kF16},
                                        {"35000_69999", 35000, StDtype::kU16, StDtype::kF32}};
    int64_t seen = 0;
    for (const Want& w : want) {
      auto file = SafetensorsFile::Read(Module() + "/" + w.file + ".safetensors");
      ASSERT_TRUE(file.ok()) << file.status();
      const StTensorInfo* locations = file->header().Find("locations");
      const StTensorInfo* activations = file->header().Find("activations");
      ASSERT_NE(locations, nullptr);
      ASSERT_NE(activations, nullptr);
      EXPECT_EQ(locations->dtype, w.locations) << w.file;
      EXPECT_EQ(activations->dtype, w.activations) << w.file;
      const int64_t n = activations->numel();
      seen += n;
      std::vector<uint32_t> loc(3 * n);
      std::vector<float> values(n);
      if (locations->dtype == StDtype::kU32) {
        std::memcpy(loc.data(), file->data(*locations), loc.size() * 4);
      } else {
        const auto* narrow = reinterpret_cast<const uint16_t*>(file->data(*locations));
        loc.assign(narrow, narrow + 3 * n);
      }
      if (activations->dtype == StDtype::kF32) {
        std::memcpy(values.data(), file->data(*activations), n * 4);
      } else {
        const auto* halves = reinterpret_cast<const uint16_t*>(file->data(*activations));
        for (int64_t i = 0; i < n; ++i) values[i] = HalfToFloat(halves[i]);
      }
      for (int64_t i = 0; i < n; ++i) {
        const int64_t row = loc[3 * i] * 4 + loc[3 * i + 1];
        EXPECT_EQ(w.first + loc[3 * i + 2], Latent(row, 70000)) << w.file << " row " << row;
        EXPECT_EQ(values[i], Value(row)) << w.file << " row " << row;
      }
    }
    EXPECT_EQ(seen, 8);
  }
}

// Gathered in groups of splits (a read pass each) when the firings would not fit the memory
// allowed: the same files as one pass gives.
TEST_F(DelphiExportTest, SplitsGatheredInGroupsWriteTheSameFiles) {
  const uint64_t id = MakeDataset("s", 16, 25);  // 100 firings, 1200 B to gather
  // The rows read in all: the range's 100 once per pass.
  int64_t one_pass = 0, grouped_passes = 0;
  ASSERT_TRUE(
      Delphi(*store_, id, 0, 0, 5, dir_ + "/one", kDelphiGatherBytes, [&](int64_t, int64_t total) {
        return (one_pass = total) > 0;
      }).ok());
  ASSERT_TRUE(Delphi(*store_, id, 0, 0, 5, dir_ + "/groups", /*gather_bytes=*/500,
                     [&](int64_t, int64_t total) { return (grouped_passes = total) > 0; })
                  .ok());
  EXPECT_EQ(one_pass, 100);
  EXPECT_EQ(grouped_passes, 100 * 3);  // 240 B a split: two splits a pass
  const std::string module = "/blocks.0.hook_resid_post/";
  int files = 0;
  for (const auto& entry : fs::directory_iterator(dir_ + "/one" + module)) {
    const std::string name = entry.path().filename().string();
    if (name == "config.json") continue;
    auto one = SafetensorsFile::Read(entry.path().string());
    auto grouped = SafetensorsFile::Read(dir_ + "/groups" + module + name);
    ASSERT_TRUE(one.ok() && grouped.ok()) << name;
    EXPECT_EQ(one->bytes(), grouped->bytes()) << name;
    EXPECT_GT(one->header().Find("activations")->numel(), 0) << name;
    ++files;
  }
  EXPECT_EQ(files, 5);
}

TEST_F(DelphiExportTest, AnExportReplacesTheHooksEarlierOneWhole) {
  const uint64_t id = MakeDataset("s", 16, 3);
  ASSERT_TRUE(Delphi(*store_, id, 0, 0, 4, dir_ + "/latents").ok());
  EXPECT_TRUE(fs::exists(Module() + "/12_15.safetensors"));
  auto again = Delphi(*store_, id, 4, 4, 2, dir_ + "/latents");
  ASSERT_TRUE(again.ok()) << again.status();
  std::vector<std::string> names;
  for (const auto& entry : fs::directory_iterator(Module())) {
    names.push_back(entry.path().filename().string());
  }
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names,
            (std::vector<std::string>{"0_7.safetensors", "8_15.safetensors", "config.json"}));
  auto file = SafetensorsFile::Read(Module() + "/0_7.safetensors");
  ASSERT_TRUE(file.ok()) << file.status();
  const StTensorInfo* tokens = file->header().Find("tokens");
  ASSERT_NE(tokens, nullptr);
  EXPECT_EQ(tokens->shape, (std::vector<int64_t>{1, 4}));
  const auto* ids = reinterpret_cast<const int32_t*>(file->data(*tokens));
  EXPECT_EQ(std::vector<int32_t>(ids, ids + 4), (std::vector<int32_t>{1004, 1005, 1006, 1007}));
  // Only the module is in the latents directory: the build directory was renamed into place.
  EXPECT_EQ(std::distance(fs::directory_iterator(dir_ + "/latents"), fs::directory_iterator()), 1);
}

}  // namespace
}  // namespace latentd::storage
