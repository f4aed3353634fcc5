#include "engine/stored_activations_model.h"

#include <gtest/gtest.h>

#include <memory>
#include <vector>

namespace latentd::engine {
namespace {

// `rows` rows of `width` values, value = base + row * width + column; token ids 100 + row.
std::shared_ptr<const StoredDenseRows> Rows(uint64_t id, int64_t rows, int64_t width, float base,
                                            std::string model_id) {
  StoredDenseInfo info;
  info.id = id;
  info.width = width;
  info.model_id = std::move(model_id);
  info.model_weight_hash = "hash-" + info.model_id;
  std::vector<float> values(rows * width);
  for (int64_t i = 0; i < rows * width; ++i) values[i] = base + static_cast<float>(i);
  std::vector<int32_t> tokens(rows);
  for (int64_t r = 0; r < rows; ++r) tokens[r] = static_cast<int32_t>(100 + r);
  return InMemoryStoredDenseRows(info, std::move(values), std::move(tokens));
}

TEST(StoredActivationsModel, ReadsTheShardsRowsWithEverySourceSideBySide) {
  auto a = Rows(1, 12, 3, 0, "base");
  auto b = Rows(2, 12, 2, 1000, "chat");
  // The shard starts at row 4; the batch is its rows 2..5 (two sequences of 2).
  StoredActivationsModel model({a, b}, 4, at::Device(at::kCPU));
  EXPECT_EQ(model.hook_width(), 5);
  EXPECT_EQ(model.model_id(), "base + chat");
  EXPECT_EQ(model.weight_hash(), "hash-base + hash-chat");
  auto hooks = model.HooksOfRows(2, at::zeros({2, 2}, at::kLong));
  ASSERT_TRUE(hooks.ok()) << hooks.status();
  ASSERT_EQ(hooks->size(), 1u);
  const at::Tensor x = (*hooks)[0];
  ASSERT_EQ(x.sizes(), at::IntArrayRef({2, 2, 5}));
  const at::Tensor flat = x.reshape({4, 5});
  for (int64_t i = 0; i < 4; ++i) {
    const int64_t row = 6 + i;
    for (int64_t c = 0; c < 3; ++c) EXPECT_EQ(flat[i][c].item<float>(), row * 3 + c);
    for (int64_t c = 0; c < 2; ++c) EXPECT_EQ(flat[i][3 + c].item<float>(), 1000 + row * 2 + c);
  }
}

TEST(StoredActivationsModel, EachOutputGetsTheSameActivation) {
  StoredActivationsModel model({Rows(1, 8, 3, 0, "m")}, 0, at::Device(at::kCPU), 3);
  EXPECT_EQ(model.hook_widths(), (std::vector<int64_t>{3, 3, 3}));
  auto hooks = model.HooksOfRows(4, at::zeros({1, 4}, at::kLong));
  ASSERT_TRUE(hooks.ok()) << hooks.status();
  ASSERT_EQ(hooks->size(), 3u);
  for (const at::Tensor& h : *hooks) EXPECT_TRUE(h.equal((*hooks)[0]));
  EXPECT_EQ((*hooks)[2][0][0][0].item<float>(), 12);  // row 4, column 0
}

TEST(StoredActivationsModel, OneModelsSourcesNameItOnce) {
  StoredActivationsModel model({Rows(1, 4, 2, 0, "gpt2"), Rows(2, 4, 2, 0, "gpt2")}, 0,
                               at::Device(at::kCPU));
  EXPECT_EQ(model.model_id(), "gpt2");
}

TEST(StoredActivationsModel, RowsPastTheDatasetAreOutOfRangeNotGarbage) {
  StoredActivationsModel model({Rows(1, 4, 2, 0, "m")}, 2, at::Device(at::kCPU));
  auto hooks = model.HooksOfRows(0, at::zeros({1, 4}, at::kLong));
  EXPECT_EQ(hooks.status().code(), absl::StatusCode::kOutOfRange) << hooks.status();
}

TEST(StoredActivationsModel, ForwardWithoutRowsThrows) {
  StoredActivationsModel model({Rows(1, 4, 2, 0, "m")}, 0, at::Device(at::kCPU));
  EXPECT_THROW(model.Forward(at::zeros({1, 4}, at::kLong)), c10::Error);
}

TEST(ReadStoredSequences, GivesTheFirstSourcesIdsOfTheShardsSequences) {
  auto a = Rows(1, 12, 1, 0, "m");
  auto b = Rows(2, 12, 1, 0, "m");
  std::vector<int64_t> ids(6);
  // Shard from row 2, sequences of 3: sequences 1 and 2 are rows 5..10.
  ASSERT_TRUE(ReadStoredSequences({a, b}, 2, 3, "f", 1, 2, ids.data()).ok());
  EXPECT_EQ(ids, (std::vector<int64_t>{105, 106, 107, 108, 109, 110}));
}

TEST(ReadStoredSequences, SourcesOfOtherTokensAreRefusedNamingTheRowAndBothIds) {
  auto a = Rows(1, 8, 1, 0, "m");
  StoredDenseInfo info;
  info.id = 7;
  info.width = 1;
  std::vector<int32_t> tokens = {100, 101, 102, 103, 104, 999, 106, 107};
  auto b = InMemoryStoredDenseRows(info, std::vector<float>(8), tokens);
  std::vector<int64_t> ids(4);
  ASSERT_TRUE(
      ReadStoredSequences({a, b}, 0, 4, "extract.model.stored.dataset_ids", 0, 1, ids.data()).ok());
  const absl::Status s =
      ReadStoredSequences({a, b}, 0, 4, "extract.model.stored.dataset_ids", 1, 1, ids.data());
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("extract.model.stored.dataset_ids[1]: dataset 7 holds token 999 at "
                             "row 5, dataset 1 token 105"),
            std::string::npos)
      << s;
}

}  // namespace
}  // namespace latentd::engine
