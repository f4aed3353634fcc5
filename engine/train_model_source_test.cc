#include "engine/train_model_source.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/types.h>

#include <cstdlib>
#include <fstream>
#include <thread>

#include "engine/activation_model.h"
#include "engine/data_parallel.h"
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

// A spec with more_outputs gives each row's hooks side by side, hook_name's first: a
// transcoder's input (the MLP's normed input, 16 wide) and target (mlp.hook_post, 64 wide).
TEST(ModelRowSourceTest, SeveralHooksComeSideBySideInARow) {
  const std::string dir = std::getenv("TEST_TMPDIR");
  latentd::v1::ExtractSpec spec = Spec(dir);
  spec.set_hook_name("blocks.1.ln2.hook_normalized");
  spec.add_more_outputs()->set_hook_name("blocks.1.mlp.hook_post");
  auto both = ModelRowSource::Open(spec, Env(dir), DeviceRef{}, 12);
  ASSERT_TRUE(both.ok()) << both.status();
  EXPECT_EQ((*both)->width(), 16 + 64);
  std::vector<float> rows(30 * 80);
  ASSERT_TRUE((*both)->Read(5, 30, rows.data()).ok());
  const at::Tensor got = torch::from_blob(rows.data(), {30, 80}, torch::kFloat32);
  int64_t column = 0;
  for (const char* hook : {"blocks.1.ln2.hook_normalized", "blocks.1.mlp.hook_post"}) {
    latentd::v1::ExtractSpec one = Spec(dir);
    one.set_hook_name(hook);
    auto alone = ModelRowSource::Open(one, Env(dir), DeviceRef{}, 12);
    ASSERT_TRUE(alone.ok()) << alone.status();
    const int64_t w = (*alone)->width();
    std::vector<float> want(30 * w);
    ASSERT_TRUE((*alone)->Read(5, 30, want.data()).ok());
    EXPECT_TRUE(torch::allclose(got.narrow(1, column, w),
                                torch::from_blob(want.data(), {30, w}, torch::kFloat32), 1e-5,
                                1e-6))
        << hook;
    column += w;
  }
  EXPECT_EQ(column, 80);
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

// Runs `body(rank, sync)` on `world` threads joined in one Gloo group.
void OnRanks(int world, const std::function<void(int, GradientSync*)>& body) {
  auto store = NewInProcessStore();
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      auto sync = JoinProcessGroup(store, {.rank = r, .world_size = world});
      ASSERT_TRUE(sync.ok()) << sync.status();
      body(r, sync->get());
    });
  }
  for (auto& t : threads) t.join();
}

// Ranks sharing their sources read what one source alone reads, and between them run each
// sequence through the model once.
TEST(ModelRowSourceTest, RanksShareTheForwardPasses) {
  const std::string dir = std::getenv("TEST_TMPDIR");
  const latentd::v1::ExtractSpec spec = Spec(dir);
  const std::vector<std::pair<int64_t, int64_t>> reads = {{0, 80}, {12, 12}, {5, 30}, {79, 1}};
  auto solo = ModelRowSource::Open(spec, Env(dir), DeviceRef{}, 12);
  ASSERT_TRUE(solo.ok()) << solo.status();
  std::vector<std::vector<float>> expected;
  for (auto [start, count] : reads) {
    expected.emplace_back(count * 16);
    ASSERT_TRUE((*solo)->Read(start, count, expected.back().data()).ok());
  }
  for (const int world : {2, 3}) {
    std::vector<int64_t> computed(world);
    OnRanks(world, [&](int rank, GradientSync* sync) {
      auto source = ModelRowSource::Open(spec, Env(dir), DeviceRef{}, 12);
      ASSERT_TRUE(source.ok()) << source.status();
      (*source)->ShareWork(sync);
      for (size_t i = 0; i < reads.size(); ++i) {
        const auto [start, count] = reads[i];
        std::vector<float> rows(count * 16);
        ASSERT_TRUE((*source)->Read(start, count, rows.data()).ok()) << rank << " " << start;
        const at::Tensor got = torch::from_blob(rows.data(), {count, 16}, torch::kFloat32);
        const at::Tensor want = torch::from_blob(expected[i].data(), {count, 16}, torch::kFloat32);
        EXPECT_TRUE(torch::allclose(got, want, 1e-5, 1e-6))
            << "world " << world << " rank " << rank << " rows " << start << "+" << count;
      }
      computed[rank] = (*source)->sequences_computed();
    });
    int64_t total = 0;
    for (int64_t c : computed) total += c;
    EXPECT_EQ(total, (*solo)->sequences_computed()) << "world " << world;
    for (int64_t c : computed) EXPECT_LT(c, (*solo)->sequences_computed()) << "world " << world;
  }
}

// A window's chunks shorter than a sequence (contexts of 1024 tokens and more): each sequence
// runs once for all the chunks it feeds, and two ranks split the window's two sequences.
TEST(ModelRowSourceTest, AWindowsChunksShareTheirSequences) {
  const std::string dir = std::getenv("TEST_TMPDIR");
  const latentd::v1::ExtractSpec spec = Spec(dir);
  const std::vector<RowRange> window = {{8, 4}, {0, 4}, {12, 4}, {4, 4}};  // sequences 1, 0, 1, 0
  auto solo = ModelRowSource::Open(spec, Env(dir), DeviceRef{}, 4);
  ASSERT_TRUE(solo.ok()) << solo.status();
  std::vector<float> expected(16 * 16);
  ASSERT_TRUE((*solo)->ReadRanges(window, expected.data()).ok());
  EXPECT_EQ((*solo)->sequences_computed(), 2);
  std::vector<float> one_by_one(16 * 16);
  for (size_t i = 0; i < window.size(); ++i) {
    ASSERT_TRUE(
        (*solo)->Read(window[i].start, window[i].count, one_by_one.data() + i * 4 * 16).ok());
  }
  EXPECT_TRUE(torch::allclose(torch::from_blob(expected.data(), {16, 16}),
                              torch::from_blob(one_by_one.data(), {16, 16}), 1e-5, 1e-6));
  std::vector<int64_t> computed(2);
  OnRanks(2, [&](int rank, GradientSync* sync) {
    auto source = ModelRowSource::Open(spec, Env(dir), DeviceRef{}, 4);
    ASSERT_TRUE(source.ok()) << source.status();
    (*source)->ShareWork(sync);
    std::vector<float> rows(16 * 16);
    ASSERT_TRUE((*source)->ReadRanges(window, rows.data()).ok());
    EXPECT_TRUE(torch::allclose(torch::from_blob(rows.data(), {16, 16}),
                                torch::from_blob(expected.data(), {16, 16}), 1e-5, 1e-6))
        << "rank " << rank;
    computed[rank] = (*source)->sequences_computed();
  });
  EXPECT_EQ(computed, (std::vector<int64_t>{1, 1}));
}

// A rank that fails still joins the gather: the others stop too, naming it, instead of waiting.
TEST(ModelRowSourceTest, ARankThatFailsStopsTheOthers) {
  const std::string dir = std::getenv("TEST_TMPDIR");
  latentd::v1::ExtractSpec spec = Spec(dir);
  const std::string path = dir + "/one_bad_sequence.bin";
  {
    std::ofstream out(path, std::ios::binary);
    for (int i = 0; i < kSequences * kContext; ++i) {
      // Sequence 9, which rank 1 runs, holds an id outside the vocabulary.
      const uint16_t id = i == 9 * kContext + 3 ? 150 : static_cast<uint16_t>((i * 37 + 11) % 100);
      out.write(reinterpret_cast<const char*>(&id), 2);
    }
  }
  spec.mutable_tokens()->set_path(path);
  spec.mutable_model()->mutable_reference()->set_vocab_size(120);
  absl::Status read[2];
  OnRanks(2, [&](int rank, GradientSync* sync) {
    auto source = ModelRowSource::Open(spec, Env(dir), DeviceRef{}, 12);
    ASSERT_TRUE(source.ok()) << source.status();
    (*source)->ShareWork(sync);
    std::vector<float> rows(80 * 16);
    read[rank] = (*source)->Read(0, 80, rows.data());
  });
  EXPECT_TRUE(absl::IsInvalidArgument(read[1])) << read[1];
  EXPECT_NE(read[1].message().find("token id 150 in sequence 9"), std::string::npos) << read[1];
  EXPECT_TRUE(absl::IsAborted(read[0])) << read[0];
  EXPECT_NE(read[0].message().find("rank 1 failed"), std::string::npos) << read[0];
}

}  // namespace
}  // namespace latentd::engine
