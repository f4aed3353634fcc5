// What the writer writes, read back by common/parquet_column (the reader the project checks
// against arrow-rs's and hyparquet's files). docs/STORAGE.md records the same files read by
// arrow-rs and hyparquet themselves.
#include "storage/parquet_writer.h"

#include <cstdint>
#include <string>
#include <vector>

#include "common/parquet_column.h"
#include "common/test_dir.h"
#include "gtest/gtest.h"

namespace latentd::storage {
namespace {

TEST(ParquetWriterTest, ColumnsAndListsReadBackAsWritten) {
  const std::string path = FreshTestDir("parquet_writer") + "/out.parquet";
  auto writer = ParquetWriter::Create(path,
                                      {{"row", ParquetField::Type::kInt64, false},
                                       {"token_id", ParquetField::Type::kInt32, false},
                                       {"latents", ParquetField::Type::kInt32, true},
                                       {"values", ParquetField::Type::kFloat, true}},
                                      {{"latentd", "{\"d_sae\": 8}"}});
  ASSERT_TRUE(writer.ok()) << writer.status();
  // Two row groups; rows with 0, 1 and 3 entries (an empty list is a list, not a null).
  std::vector<int64_t> all_rows;
  std::vector<int32_t> all_tokens, all_latents;
  std::vector<float> all_values;
  for (int group = 0; group < 2; ++group) {
    std::vector<int64_t> rows, offsets = {0};
    std::vector<int32_t> tokens, latents;
    std::vector<float> values;
    for (int r = 0; r < 50; ++r) {
      const int64_t row = group * 50 + r;
      rows.push_back(row);
      tokens.push_back(static_cast<int32_t>(1000 + row));
      for (int j = 0; j < row % 4 - (row % 7 == 0 ? 10 : 0); ++j) {
        latents.push_back(static_cast<int32_t>((row * 3 + j) % 8));
        values.push_back(0.5f * j - 0.25f * static_cast<float>(row));
      }
      offsets.push_back(static_cast<int64_t>(latents.size()));
    }
    ASSERT_TRUE((*writer)
                    ->AppendRowGroup(
                        50, {{rows.data(), 50, nullptr},
                             {tokens.data(), 50, nullptr},
                             {latents.data(), static_cast<int64_t>(latents.size()), offsets.data()},
                             {values.data(), static_cast<int64_t>(values.size()), offsets.data()}})
                    .ok());
    all_rows.insert(all_rows.end(), rows.begin(), rows.end());
    all_tokens.insert(all_tokens.end(), tokens.begin(), tokens.end());
    all_latents.insert(all_latents.end(), latents.begin(), latents.end());
    all_values.insert(all_values.end(), values.begin(), values.end());
  }
  ASSERT_TRUE((*writer)->Finish().ok());

  auto ints = [&](const std::string& name) {
    auto column = ParquetColumn::Open(path, name);
    EXPECT_TRUE(column.ok()) << column.status();
    std::vector<int64_t> out((*column)->num_values());
    EXPECT_TRUE((*column)->Read(0, out.size(), out.data()).ok());
    EXPECT_EQ((*column)->num_rows(), 100);
    return out;
  };
  EXPECT_EQ(ints("row"), all_rows);
  EXPECT_EQ(ints("token_id"), std::vector<int64_t>(all_tokens.begin(), all_tokens.end()));
  EXPECT_EQ(ints("latents"), std::vector<int64_t>(all_latents.begin(), all_latents.end()));
  auto values = ParquetColumn::Open(path, "values", ParquetColumn::Kind::kFloats);
  ASSERT_TRUE(values.ok()) << values.status();
  std::vector<float> read((*values)->num_values());
  ASSERT_TRUE((*values)->ReadFloats(0, read.size(), read.data()).ok());
  EXPECT_EQ(read, all_values);
}

TEST(ParquetWriterTest, DataThatDoesNotFitTheFieldsIsRefused) {
  const std::string path = FreshTestDir("parquet_writer_bad") + "/out.parquet";
  auto writer = ParquetWriter::Create(
      path,
      {{"row", ParquetField::Type::kInt64, false}, {"latents", ParquetField::Type::kInt32, true}},
      {});
  ASSERT_TRUE(writer.ok());
  const std::vector<int64_t> rows = {0, 1};
  const std::vector<int32_t> latents = {1, 2, 3};
  const std::vector<int64_t> short_offsets = {0, 1, 2};  // 2 of the 3 values
  EXPECT_TRUE(absl::IsInvalidArgument((*writer)->AppendRowGroup(
      2, {{rows.data(), 2, nullptr}, {latents.data(), 3, short_offsets.data()}})));
  EXPECT_TRUE(absl::IsInvalidArgument((*writer)->AppendRowGroup(
      2, {{rows.data(), 1, nullptr}, {latents.data(), 3, short_offsets.data()}})));
  EXPECT_TRUE(absl::IsInvalidArgument((*writer)->AppendRowGroup(2, {{rows.data(), 2, nullptr}})));
  EXPECT_TRUE(absl::IsPermissionDenied(
      ParquetWriter::Create("/nonexistent/dir/x.parquet", {}, {}).status()));
}

}  // namespace
}  // namespace latentd::storage
