// Parquet export, read back by common/parquet_column against the store's own rows: a SPARSE fp16
// dataset whole and in part, a DENSE one, and the metadata in the footer.
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "common/parquet_column.h"
#include "common/test_dir.h"
#include "gtest/gtest.h"
#include "storage/chunk_store.h"
#include "storage/export.h"
#include "storage/sparse_rows_testing.h"

namespace latentd::storage {
namespace {

std::vector<int64_t> Ints(const std::string& path, const std::string& column) {
  auto reader = ParquetColumn::Open(path, column);
  EXPECT_TRUE(reader.ok()) << reader.status();
  std::vector<int64_t> out((*reader)->num_values());
  EXPECT_TRUE((*reader)->Read(0, out.size(), out.data()).ok());
  return out;
}

std::vector<float> Floats(const std::string& path, const std::string& column) {
  auto reader = ParquetColumn::Open(path, column, ParquetColumn::Kind::kFloats);
  EXPECT_TRUE(reader.ok()) << reader.status();
  std::vector<float> out((*reader)->num_values());
  EXPECT_TRUE((*reader)->ReadFloats(0, out.size(), out.data()).ok());
  return out;
}

TEST(ExportParquetTest, RowsReadBackAsTheStoreHoldsThem) {
  const std::string dir = FreshTestDir("export_parquet");
  auto db = Db::Open(dir + "/db");
  ASSERT_TRUE(db.ok()) << db.status();
  ChunkStoreOptions options;
  options.chunk_rows = 64;
  ChunkStore store(db->get(), options);
  DatasetMeta meta;
  meta.name = "sparse";
  meta.hook_name = "blocks.2.hook_resid_post";
  meta.encoder = "topk";
  meta.k = 12;
  meta.width = 300;
  meta.context_length = 50;
  auto sparse = store.CreateDataset(meta);
  ASSERT_TRUE(sparse.ok());
  {
    auto writer = store.OpenWriter(*sparse);
    ASSERT_TRUE(writer.ok());
    std::mt19937 rng(3);
    const SparseRowsForTest rows = RandomSparseRows(rng, 300, 300, 12);  // 0 to 12 latents
    ASSERT_TRUE(AppendAndCommit(**writer, rows).ok());
  }
  for (const auto& [start, count] : std::vector<std::pair<int64_t, int64_t>>{{0, 0}, {70, 150}}) {
    SCOPED_TRACE(start);
    const std::string path = dir + "/sparse_" + std::to_string(start) + ".parquet";
    auto exported = ExportDataset(store, *sparse, start, count, ExportFormat::kParquet, path);
    ASSERT_TRUE(exported.ok()) << exported.status();
    auto rows = store.ReadRows(*sparse, start, count);
    ASSERT_TRUE(rows.ok());
    EXPECT_EQ(exported->rows, rows->num_rows);
    std::vector<int64_t> row_ids(rows->num_rows);
    for (int64_t i = 0; i < rows->num_rows; ++i) row_ids[i] = start + i;
    EXPECT_EQ(Ints(path, "row"), row_ids);
    EXPECT_EQ(Ints(path, "token_id"),
              std::vector<int64_t>(rows->token_ids.begin(), rows->token_ids.end()));
    EXPECT_EQ(Ints(path, "latents"),
              std::vector<int64_t>(rows->indices.begin(), rows->indices.end()));
    EXPECT_EQ(Floats(path, "values"), rows->values);  // fp16 values, widened exactly
    auto reader = ParquetColumn::Open(path, "latents");
    ASSERT_TRUE(reader.ok());
    EXPECT_EQ((*reader)->num_rows(), rows->num_rows);
    ASSERT_EQ((*reader)->metadata().size(), 1u);
    EXPECT_EQ((*reader)->metadata()[0].first, "latentd");
    const nlohmann::json json = nlohmann::json::parse((*reader)->metadata()[0].second);
    EXPECT_EQ(json["format"], "csr");
    EXPECT_EQ(json["width"], 300);
    EXPECT_EQ(json["row_start"], start);
    EXPECT_EQ(json["shape"], nlohmann::json({rows->num_rows, 300}));
    EXPECT_EQ(json["hook_name"], "blocks.2.hook_resid_post");
  }

  DatasetMeta dense_meta = meta;
  dense_meta.name = "dense";
  dense_meta.kind = DatasetKind::kDense;
  dense_meta.value_dtype = ValueDtype::kFloat32;
  dense_meta.width = 8;
  auto dense = store.CreateDataset(dense_meta);
  ASSERT_TRUE(dense.ok());
  {
    auto writer = store.OpenWriter(*dense);
    ASSERT_TRUE(writer.ok());
    std::vector<float> values(40 * 8);
    std::vector<int32_t> tokens(40);
    for (size_t i = 0; i < values.size(); ++i) values[i] = static_cast<float>(i) / 3.0f - 5.0f;
    for (int i = 0; i < 40; ++i) tokens[i] = 100000 + i;
    ASSERT_TRUE((*writer)->AppendDense(40, values.data(), tokens.data()).ok());
    ASSERT_TRUE((*writer)->Commit().ok());
  }
  const std::string path = dir + "/dense.parquet";
  ASSERT_TRUE(ExportDataset(store, *dense, 5, 30, ExportFormat::kParquet, path).ok());
  std::vector<float> values;
  std::vector<int32_t> tokens;
  ASSERT_TRUE(store.ReadDense(*dense, 5, 30, &values, &tokens).ok());
  EXPECT_EQ(Floats(path, "activation"), values);
  EXPECT_EQ(Ints(path, "token_id"), std::vector<int64_t>(tokens.begin(), tokens.end()));
}

}  // namespace
}  // namespace latentd::storage
