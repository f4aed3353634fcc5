#include "engine/transformer_shape.h"

#include "gtest/gtest.h"

namespace latentd::engine {
namespace {

int64_t Width(const TransformerShape& shape, const char* hook) {
  return TransformerHookWidth(shape, *ParseHookName(hook));
}

// attn.hook_z holds every query head's output side by side: n_heads x d_head, which is not
// d_model where the heads are wider or narrower (Gemma 2 2B: 8 heads of 256 in a 2304-wide
// stream, so Gemma Scope's attention SAEs read 2048).
TEST(TransformerShapeTest, HookWidthsFollowTheirActivations) {
  TransformerShape gemma;
  gemma.d_model = 2304;
  gemma.n_layers = 26;
  gemma.n_heads = 8;
  gemma.d_head = 256;
  gemma.d_mlp = 9216;
  EXPECT_EQ(Width(gemma, "blocks.3.attn.hook_z"), 2048);
  EXPECT_EQ(Width(gemma, "blocks.3.hook_attn_out"), 2304);
  EXPECT_EQ(Width(gemma, "blocks.3.mlp.hook_post"), 9216);
  EXPECT_EQ(Width(gemma, "blocks.3.hook_resid_post"), 2304);
  TransformerShape gpt2 = gemma;  // no head width given: d_model / n_heads
  gpt2.d_model = 768;
  gpt2.n_heads = 12;
  gpt2.d_head = 0;
  EXPECT_EQ(Width(gpt2, "blocks.3.attn.hook_z"), 768);
  EXPECT_FALSE(CheckTransformerHook(gpt2, *ParseHookName("blocks.26.attn.hook_z")).ok());
}

}  // namespace
}  // namespace latentd::engine
