#include "engine/torchscript_model.h"

#include <fstream>

#include "gtest/gtest.h"

namespace latentd::engine {
namespace {

std::string Runfile(const std::string& name) {
  return std::string(getenv("TEST_SRCDIR")) + "/latentd/engine/testdata/" + name;
}

TEST(TorchScriptModelTest, PicksTheHiddenStateTheHookNames) {
  TorchScriptModelOptions o;
  o.path = Runfile("hidden.pt");
  o.vocab_size = 20;
  auto last = LoadTorchScriptModel(o, *ParseHookName("hidden_states.2"), at::kCPU);
  ASSERT_TRUE(last.ok()) << last.status();
  EXPECT_EQ((*last)->hook_width(), 8);
  EXPECT_EQ((*last)->vocab_size(), 20);
  EXPECT_EQ((*last)->weight_hash().rfind("fnv1a64:", 0), 0u);
  auto post0 = LoadTorchScriptModel(o, *ParseHookName("blocks.0.hook_resid_post"), at::kCPU);
  auto pre1 = LoadTorchScriptModel(o, *ParseHookName("blocks.1.hook_resid_pre"), at::kCPU);
  auto emb = LoadTorchScriptModel(o, *ParseHookName("hidden_states.0"), at::kCPU);
  ASSERT_TRUE(post0.ok() && pre1.ok() && emb.ok());
  at::Tensor t = at::randint(0, 20, {3, 5}, at::kLong);
  at::Tensor a = (*post0)->Forward(t), b = (*pre1)->Forward(t);
  EXPECT_EQ(a.sizes(), (std::vector<int64_t>{3, 5, 8}));
  EXPECT_TRUE(at::equal(a, b));  // hidden_states[1] both ways
  EXPECT_FALSE(at::allclose(a, (*emb)->Forward(t)));
  EXPECT_FALSE(at::allclose(a, (*last)->Forward(t)));
}

TEST(TorchScriptModelTest, ReadsSeveralHiddenStatesFromOneForward) {
  TorchScriptModelOptions o;
  o.path = Runfile("hidden.pt");
  std::vector<HookName> hooks = {*ParseHookName("hidden_states.2"),
                                 *ParseHookName("blocks.0.hook_resid_post"),
                                 *ParseHookName("hidden_states.0")};
  auto both = LoadTorchScriptModel(o, hooks, at::kCPU);
  ASSERT_TRUE(both.ok()) << both.status();
  EXPECT_EQ((*both)->hook_widths(), (std::vector<int64_t>{8, 8, 8}));
  at::Tensor t = at::randint(0, 20, {3, 5}, at::kLong);
  const std::vector<at::Tensor> got = (*both)->ForwardHooks(t);
  ASSERT_EQ(got.size(), 3u);
  for (size_t i = 0; i < hooks.size(); ++i) {
    auto one = LoadTorchScriptModel(o, hooks[i], at::kCPU);
    ASSERT_TRUE(one.ok());
    EXPECT_TRUE(at::equal(got[i], (*one)->Forward(t))) << i;
  }
  hooks.push_back(*ParseHookName("hidden_states.3"));
  auto bad = LoadTorchScriptModel(o, hooks, at::kCPU);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("hidden state 3 out of range"), std::string::npos)
      << bad.status();
}

TEST(TorchScriptModelTest, RejectsBadModulesAndHooks) {
  TorchScriptModelOptions o;
  o.path = Runfile("hidden.pt");
  EXPECT_EQ(LoadTorchScriptModel(o, *ParseHookName("hidden_states.3"), at::kCPU).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(
      LoadTorchScriptModel(o, *ParseHookName("blocks.0.hook_mlp_out"), at::kCPU).status().code(),
      absl::StatusCode::kInvalidArgument);
  o.path = Runfile("tensor.pt");
  EXPECT_EQ(LoadTorchScriptModel(o, *ParseHookName("hidden_states.0"), at::kCPU).status().code(),
            absl::StatusCode::kInvalidArgument);  // a 2-D tensor, not [batch, seq, d]
  const std::string junk = std::string(getenv("TEST_TMPDIR")) + "/junk.pt";
  std::ofstream(junk) << "not a zip archive";
  o.path = junk;
  EXPECT_EQ(LoadTorchScriptModel(o, *ParseHookName("hidden_states.0"), at::kCPU).status().code(),
            absl::StatusCode::kInvalidArgument);
  o.path = junk + ".missing";
  EXPECT_EQ(LoadTorchScriptModel(o, *ParseHookName("hidden_states.0"), at::kCPU).status().code(),
            absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace latentd::engine
