#include "engine/train_model_source.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/types.h>

#include <cstdlib>
#include <fstream>

#include "engine/activation_model.h"
#include "engine/token_source.h"

namespace latentd::engine {
namespace {

constexpr int kContext = 8;
constexpr int kSequences = 10;

// A spec over a uint16 token file of 10 sequences of 8 tokens, the reference model's layer 1.
latentd::v1::ExtractSpec Spec(const std::string& dir) {
  const std::string path = dir + "/tokens.bin";
  std::ofstream out(path, std::ios::binary);
  for (int i = 0; i < kSequences * kContext; ++i) {
    const uint16_t id = static_cast<uint16_t>((i * 37 + 11) % 200);
    out.write(reinterpret_cast<const char*>(&id), 2);
  }
  out.close();
  latentd::v1::ExtractSpec spec;
  auto* reference = spec.mutable_model()->mutable_reference();
  reference->set_d_model(16);
  reference->set_n_layers(2);
  reference->set_n_heads(2);
  reference->set_vocab_size(200);
  reference->set_context_length(kContext);
  reference->set_seed(3);
  spec.set_hook_name("blocks.1.hook_resid_post");
  spec.mutable_tokens()->set_path(path);
  spec.mutable_tokens()->set_context_length(kContext);
  spec.set_batch_sequences(3);
  return spec;
}

ExtractEnv Env(const std::string& dir) {
  ExtractEnv env;
  env.data_roots = {dir};
  return env;
}

TEST(ModelRowSourceTest, RowsAreTheModelsHiddenStatesInTokenOrder) {
  const std::string dir = std::getenv("TEST_TMPDIR");
  const latentd::v1::ExtractSpec spec = Spec(dir);
  // 12-row chunks: boundaries fall inside sequences (8 tokens each).
  auto source = ModelRowSource::Open(spec, Env(dir), DeviceRef{}, 12);
  ASSERT_TRUE(source.ok()) << source.status();
  EXPECT_EQ((*source)->num_rows(), kSequences * kContext);
  EXPECT_EQ((*source)->width(), 16);
  EXPECT_EQ((*source)->chunk_starts(), (std::vector<int64_t>{0, 12, 24, 36, 48, 60, 72}));

  // The whole shard in one forward pass, as an EXTRACT job's model computes it.
  auto inputs = OpenExtractInputs(spec, Env(dir), DeviceRef{});
  ASSERT_TRUE(inputs.ok()) << inputs.status();
  std::vector<int64_t> ids(kSequences * kContext);
  ASSERT_TRUE(inputs->tokens->Read(0, kSequences, ids.data()).ok());
  torch::NoGradGuard no_grad;
  const at::Tensor expected =
      inputs->model->Forward(torch::from_blob(ids.data(), {kSequences, kContext}, torch::kInt64))
          .reshape({kSequences * kContext, 16});

  for (auto [start, count] :
       std::vector<std::pair<int64_t, int64_t>>{{0, 80}, {12, 12}, {5, 30}, {79, 1}, {17, 0}}) {
    std::vector<float> rows(count * 16);
    ASSERT_TRUE((*source)->Read(start, count, rows.data()).ok()) << start;
    const at::Tensor got = torch::from_blob(rows.data(), {count, 16}, torch::kFloat32);
    EXPECT_TRUE(torch::allclose(got, expected.narrow(0, start, count), 1e-5, 1e-6))
        << "rows " << start << "+" << count;
  }
  std::vector<float> rows(16);
  EXPECT_TRUE(absl::IsOutOfRange((*source)->Read(80, 1, rows.data())));
}

TEST(ModelRowSourceTest, BadSpecsNameTheField) {
  const std::string dir = std::getenv("TEST_TMPDIR");
  latentd::v1::ExtractSpec spec = Spec(dir);
  spec.set_hook_name("blocks.7.hook_resid_post");
  auto source = ModelRowSource::Open(spec, Env(dir), DeviceRef{}, 12);
  EXPECT_TRUE(absl::IsInvalidArgument(source.status())) << source.status();
  EXPECT_NE(source.status().message().find("extract.hook_name"), std::string::npos)
      << source.status();
  spec = Spec(dir);
  spec.mutable_model()->mutable_reference()->set_vocab_size(100);  // ids reach 199
  source = ModelRowSource::Open(spec, Env(dir), DeviceRef{}, 12);
  ASSERT_TRUE(source.ok()) << source.status();
  std::vector<float> rows(80 * 16);
  const absl::Status read = (*source)->Read(0, 80, rows.data());
  EXPECT_TRUE(absl::IsInvalidArgument(read)) << read;
  EXPECT_NE(read.message().find(">= vocab_size 100"), std::string::npos) << read;
}

}  // namespace
}  // namespace latentd::engine
