#include "engine/hook_name.h"

#include "gtest/gtest.h"

namespace latentd::engine {
namespace {

TEST(HookNameTest, ParsesTransformerLensAndHiddenStateNames) {
  auto h = ParseHookName("blocks.2.hook_resid_post");
  ASSERT_TRUE(h.ok());
  EXPECT_EQ(h->point, HookPoint::kResidPost);
  EXPECT_EQ(h->layer, 2);
  EXPECT_EQ(*HiddenStateIndex(*h), 3);
  EXPECT_EQ(ParseHookName("blocks.11.mlp.hook_post")->point, HookPoint::kMlpPost);
  EXPECT_EQ(ParseHookName("blocks.0.hook_attn_out")->point, HookPoint::kAttnOut);
  EXPECT_EQ(ParseHookName("blocks.5.attn.hook_z")->point, HookPoint::kAttnZ);
  EXPECT_FALSE(HiddenStateIndex(*ParseHookName("blocks.5.attn.hook_z")).ok());
  EXPECT_EQ(*HiddenStateIndex(*ParseHookName("blocks.4.hook_resid_pre")), 4);
  EXPECT_EQ(*HiddenStateIndex(*ParseHookName("hidden_states.7")), 7);
  EXPECT_FALSE(HiddenStateIndex(*ParseHookName("blocks.1.hook_mlp_out")).ok());
}

// sparsify names an SAE by the module whose output it reads.
TEST(HookNameTest, ParsesHuggingFaceModulePaths) {
  auto is = [](const char* name, HookPoint point, int layer) {
    auto h = ParseHookName(name);
    EXPECT_TRUE(h.ok()) << name << " " << h.status();
    if (h.ok()) {
      EXPECT_EQ(h->point, point) << name;
      EXPECT_EQ(h->layer, layer) << name;
    }
  };
  is("layers.6", HookPoint::kResidPost, 6);
  is("h.0", HookPoint::kResidPost, 0);
  is("model.layers.12", HookPoint::kResidPost, 12);
  is("gpt_neox.layers.3", HookPoint::kResidPost, 3);
  is("transformer.h.11.mlp", HookPoint::kMlpOut, 11);
  is("layers.2.mlp", HookPoint::kMlpOut, 2);
  is("h.4.attn", HookPoint::kAttnOut, 4);
  is("model.layers.5.self_attn", HookPoint::kAttnOut, 5);
  is("layers.1.attention", HookPoint::kAttnOut, 1);
  EXPECT_TRUE(
      SameActivation(*ParseHookName("layers.6"), *ParseHookName("blocks.7.hook_resid_pre")));
  EXPECT_TRUE(SameActivation(*ParseHookName("h.6"), *ParseHookName("hidden_states.7")));
}

TEST(HookNameTest, SameActivationKnowsTheResidualStreamsOtherNames) {
  auto same = [](const char* a, const char* b) {
    return SameActivation(*ParseHookName(a), *ParseHookName(b));
  };
  EXPECT_TRUE(same("blocks.3.hook_resid_post", "blocks.3.hook_resid_post"));
  EXPECT_TRUE(same("blocks.3.hook_resid_post", "blocks.4.hook_resid_pre"));
  EXPECT_TRUE(same("blocks.3.hook_resid_post", "hidden_states.4"));
  EXPECT_TRUE(same("hidden_states.0", "blocks.0.hook_resid_pre"));
  EXPECT_TRUE(same("blocks.2.mlp.hook_post", "blocks.2.mlp.hook_post"));
  EXPECT_FALSE(same("blocks.3.hook_resid_post", "blocks.3.hook_resid_pre"));
  EXPECT_FALSE(same("blocks.3.hook_resid_post", "hidden_states.3"));
  EXPECT_FALSE(same("blocks.3.hook_mlp_out", "blocks.3.hook_attn_out"));
  EXPECT_FALSE(same("blocks.3.hook_resid_mid", "blocks.4.hook_resid_mid"));
}

// A transcoder reads the MLP's normalised input and predicts the MLP's output.
TEST(HookNameTest, OrdersHooksAsTheForwardComputesThem) {
  auto before = [](const char* a, const char* b) {
    return ComputedBefore(*ParseHookName(a), *ParseHookName(b));
  };
  EXPECT_EQ(ParseHookName("blocks.6.ln2.hook_normalized")->point, HookPoint::kMlpIn);
  EXPECT_EQ(ParseHookName("blocks.6.mlp.hook_in")->point, HookPoint::kMlpInput);
  EXPECT_TRUE(before("blocks.6.ln2.hook_normalized", "blocks.6.mlp.hook_in"));
  EXPECT_TRUE(before("blocks.6.mlp.hook_in", "blocks.6.hook_mlp_out"));
  // circuit-tracer's name for what the MLP returns, before a post-MLP norm (Gemma 2).
  EXPECT_EQ(ParseHookName("blocks.6.mlp.hook_out")->point, HookPoint::kMlpOutput);
  EXPECT_TRUE(before("blocks.6.mlp.hook_in", "blocks.6.mlp.hook_out"));
  EXPECT_TRUE(before("blocks.6.mlp.hook_out", "blocks.6.hook_mlp_out"));
  EXPECT_FALSE(before("blocks.6.mlp.hook_out", "blocks.6.mlp.hook_post"));
  EXPECT_FALSE(HiddenStateIndex(*ParseHookName("blocks.6.ln2.hook_normalized")).ok());
  EXPECT_TRUE(before("blocks.6.ln2.hook_normalized", "blocks.6.hook_mlp_out"));
  EXPECT_TRUE(before("blocks.6.ln2.hook_normalized", "blocks.6.mlp.hook_post"));
  EXPECT_TRUE(before("blocks.6.hook_resid_mid", "blocks.6.ln2.hook_normalized"));
  EXPECT_TRUE(before("blocks.6.hook_mlp_out", "blocks.6.hook_resid_post"));
  EXPECT_TRUE(before("blocks.6.hook_resid_post", "blocks.7.hook_attn_out"));
  EXPECT_TRUE(before("blocks.7.hook_resid_pre", "blocks.7.attn.hook_z"));
  EXPECT_TRUE(before("blocks.7.attn.hook_z", "blocks.7.hook_attn_out"));
  EXPECT_FALSE(before("blocks.7.hook_attn_out", "blocks.7.attn.hook_z"));
  EXPECT_FALSE(before("blocks.6.hook_mlp_out", "blocks.6.ln2.hook_normalized"));
  EXPECT_FALSE(before("blocks.6.hook_mlp_out", "blocks.6.hook_mlp_out"));
  EXPECT_FALSE(before("blocks.6.hook_resid_post", "blocks.7.hook_resid_pre"));  // the same
  EXPECT_FALSE(before("blocks.7.hook_resid_pre", "blocks.6.hook_mlp_out"));
  EXPECT_TRUE(before("hidden_states.3", "blocks.3.hook_resid_post"));
}

TEST(HookNameTest, HookNameStringIsWhatParseHookNameReads) {
  for (const char* name :
       {"blocks.0.hook_resid_pre", "blocks.1.hook_resid_mid", "blocks.2.hook_resid_post",
        "blocks.3.attn.hook_z", "blocks.4.hook_attn_out", "blocks.5.ln2.hook_normalized",
        "blocks.6.mlp.hook_in", "blocks.7.mlp.hook_post", "blocks.8.mlp.hook_out",
        "blocks.9.hook_mlp_out", "hidden_states.10"}) {
    auto h = ParseHookName(name);
    ASSERT_TRUE(h.ok()) << name;
    EXPECT_EQ(HookNameString(*h), name);
  }
}

TEST(HookNameTest, RejectsMalformedNames) {
  for (const char* bad :
       {"", "blocks", "blocks.x.hook_resid_post", "blocks.-1.hook_resid_post",
        "blocks.1.hook_resid", "blocks.1", "hidden_states.", "hidden_states.-2",
        "layers.1.hook_resid_post", "blocks.+1.hook_resid_post", "layers.x", "layers.-1",
        "layers.+1", "h.1.mlp.c_fc", "layers", "model.layers.", "layers.1.mlp.act"}) {
    auto h = ParseHookName(bad);
    EXPECT_EQ(h.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    if (!h.ok()) {
      EXPECT_NE(std::string(h.status().message()).find("extract.hook_name"), std::string::npos);
    }
  }
}

}  // namespace
}  // namespace latentd::engine
