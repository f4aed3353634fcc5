#include "engine/reference_model.h"

#include <cmath>
#include <functional>

#include "gtest/gtest.h"

namespace latentd::engine {
namespace {

latentd::v1::ReferenceModelSpec Small(uint64_t seed) {
  latentd::v1::ReferenceModelSpec s;
  s.set_d_model(32);
  s.set_n_layers(3);
  s.set_n_heads(4);
  s.set_vocab_size(100);
  s.set_context_length(16);
  s.set_seed(seed);
  return s;
}

std::unique_ptr<Gpt2Model> Make(uint64_t seed, const std::string& hook) {
  auto m = CreateReferenceModel(Small(seed), *ParseHookName(hook), at::kCPU);
  EXPECT_TRUE(m.ok()) << m.status();
  return std::move(*m);
}

at::Tensor Tokens() { return at::randint(0, 100, {2, 16}, at::kLong); }

TEST(ReferenceModelTest, WeightsAreAFunctionOfTheSeed) {
  at::Tensor t = Tokens();
  auto a = Make(7, "blocks.1.hook_resid_post"), b = Make(7, "blocks.1.hook_resid_post");
  auto c = Make(8, "blocks.1.hook_resid_post");
  EXPECT_EQ(a->weight_hash(), b->weight_hash());
  EXPECT_NE(a->weight_hash(), c->weight_hash());
  EXPECT_TRUE(at::equal(a->Forward(t), b->Forward(t)));
  EXPECT_FALSE(at::allclose(a->Forward(t), c->Forward(t)));
}

// Datasets record their model's weight hash and prompt/weights queries rebuild the model and
// compare: a release that drew or hashed the weights differently would orphan every dataset made
// before it. These values come from the release before the GPT-2 forward was split out.
TEST(ReferenceModelTest, WeightHashIsStableAcrossReleases) {
  auto m = Make(7, "blocks.0.hook_resid_post");
  EXPECT_EQ(m->weight_hash(), "fnv1a64:004230146fed8803");
  EXPECT_EQ(m->model_id(), "reference:d32-l3-h4-f128-v100-c16-seed7");
  auto d = CreateReferenceModel(latentd::v1::ReferenceModelSpec(),
                                *ParseHookName("blocks.0.hook_resid_post"), at::kCPU);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ((*d)->weight_hash(), "fnv1a64:97abfe1d8b673a64");
}

TEST(ReferenceModelTest, StoppingAtTheHookedBlockGivesTheFullRunsActivations) {
  at::Tensor t = Tokens();
  auto full = Make(1, "blocks.2.hook_resid_post")->AllResidPost(t);
  ASSERT_EQ(full.size(), 3u);
  for (int l = 0; l < 3; ++l) {
    auto m = Make(1, "blocks." + std::to_string(l) + ".hook_resid_post");
    EXPECT_TRUE(at::allclose(m->Forward(t), full[l], 1e-5, 1e-6)) << l;
    if (l > 0) {
      EXPECT_TRUE(
          at::allclose(Make(1, "blocks." + std::to_string(l) + ".hook_resid_pre")->Forward(t),
                       full[l - 1], 1e-5, 1e-6));
    }
  }
}

TEST(ReferenceModelTest, HooksComposeLikeTheResidualStream) {
  at::Tensor t = Tokens();
  at::Tensor pre = Make(2, "blocks.1.hook_resid_pre")->Forward(t);
  at::Tensor attn = Make(2, "blocks.1.hook_attn_out")->Forward(t);
  at::Tensor mid = Make(2, "blocks.1.hook_resid_mid")->Forward(t);
  at::Tensor mlp = Make(2, "blocks.1.hook_mlp_out")->Forward(t);
  at::Tensor post = Make(2, "blocks.1.hook_resid_post")->Forward(t);
  EXPECT_TRUE(at::allclose(pre + attn, mid, 1e-5, 1e-6));
  EXPECT_TRUE(at::allclose(mid + mlp, post, 1e-5, 1e-6));
  auto hidden = Make(2, "blocks.1.mlp.hook_post");
  EXPECT_EQ(hidden->hook_width(), 128);
  EXPECT_EQ(hidden->Forward(t).size(2), 128);
  // Activations are not degenerate: unit-scale LayerNorm inputs give a residual of spread ~0.02+.
  EXPECT_GT(post.std().item<float>(), 0.01);
}

// Several hooks from one pass: each equal to the one-hook model's, in the order asked, the same
// hook twice included; widths follow the hooks.
TEST(ReferenceModelTest, SeveralHooksInOnePassEqualOneHookModels) {
  at::Tensor t = Tokens();
  const std::vector<std::string> names = {"blocks.2.hook_resid_pre", "blocks.0.hook_attn_out",
                                          "blocks.1.mlp.hook_post", "blocks.0.hook_attn_out",
                                          "blocks.1.hook_resid_post"};
  std::vector<HookName> hooks;
  for (const auto& name : names) hooks.push_back(*ParseHookName(name));
  auto m = CreateReferenceModel(Small(4), hooks, at::kCPU);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ((*m)->hook_widths(), (std::vector<int64_t>{32, 32, 128, 32, 32}));
  EXPECT_EQ((*m)->hook_width(), 32);
  const std::vector<at::Tensor> got = (*m)->ForwardHooks(t);
  ASSERT_EQ(got.size(), names.size());
  for (size_t i = 0; i < names.size(); ++i) {
    EXPECT_TRUE(at::equal(got[i], Make(4, names[i])->Forward(t))) << names[i];
  }
  EXPECT_TRUE(at::equal((*m)->Forward(t), got[0]));
  hooks.push_back(*ParseHookName("blocks.3.hook_resid_post"));  // 3 layers
  EXPECT_EQ(CreateReferenceModel(Small(4), hooks, at::kCPU).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CreateReferenceModel(Small(4), std::vector<HookName>{}, at::kCPU).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// The downstream loss runs the whole model to its logits (a final LayerNorm, the tied
// unembedding) with one hook's activation replaced on the way.
TEST(ReferenceModelTest, NextTokenLossRunsToTheLogitsWithTheHookReplaced) {
  at::manual_seed(3);
  const at::Tensor t = Tokens();
  auto m = Make(2, "blocks.0.hook_resid_post");
  ASSERT_EQ(m->next_token_loss_unsupported(), "");
  const double clean = m->NextTokenLossSum(t, {});
  // By hand: the last resid_post, LayerNorm without gain or bias, logits against W_E, the
  // summed cross-entropy of the 2 x 15 next tokens.
  const at::Tensor x = m->AllResidPost(t).back();
  at::Tensor W_E;
  for (const auto& [name, w] : m->NamedWeights()) {
    if (name == "embed.W_E") W_E = w;
  }
  const at::Tensor logits = at::matmul(at::layer_norm(x, {32}), W_E.t());
  const double want =
      at::cross_entropy_loss(logits.narrow(1, 0, 15).reshape({30, 100}),
                             t.narrow(1, 1, 15).reshape({30}), {}, at::Reduction::Sum)
          .item<double>();
  EXPECT_NEAR(clean, want, 1e-4 * want);
  // Per position, and the last position's logits (what a steered prompt continues from).
  const NextTokenPredictions p = m->PredictNextTokens(t, {}, /*losses=*/true);
  EXPECT_TRUE(
      at::allclose(p.losses,
                   at::cross_entropy_loss(logits.narrow(1, 0, 15).reshape({30, 100}),
                                          t.narrow(1, 1, 15).reshape({30}), {}, at::Reduction::None)
                       .view({2, 15}),
                   1e-4, 1e-5));
  EXPECT_TRUE(at::allclose(p.last_logits, logits.select(1, 15), 1e-4, 1e-5));
  const NextTokenPredictions last_only = m->PredictNextTokens(t, {}, /*losses=*/false);
  EXPECT_FALSE(last_only.losses.defined());
  EXPECT_TRUE(at::equal(last_only.last_logits, p.last_logits));
  EXPECT_GT(clean / 30, 0.5 * std::log(100.0));  // a random model is near chance

  auto splice = [](const std::string& hook, std::function<at::Tensor(const at::Tensor&)> f) {
    return HookSplice{*ParseHookName(hook), std::move(f)};
  };
  auto same = [](const at::Tensor& a) { return a; };
  auto halve = [](const at::Tensor& a) { return a * 0.5; };
  for (const char* hook :
       {"blocks.1.hook_resid_post", "blocks.1.hook_mlp_out", "blocks.1.mlp.hook_post",
        "blocks.0.hook_attn_out", "blocks.1.ln2.hook_normalized", "blocks.1.mlp.hook_in",
        "blocks.1.mlp.hook_out"}) {
    const HookSplice identity = splice(hook, same);
    EXPECT_EQ(m->NextTokenLossSum(t, {identity}), clean) << hook;
    // A replacement that is not the activation itself goes on through the rest of the block
    // (at ln2.hook_normalized: through the norm's gain and bias).
    const HookSplice copy = splice(hook, [](const at::Tensor& a) { return a.clone(); });
    EXPECT_NEAR(m->NextTokenLossSum(t, {copy}), clean, 1e-5 * clean) << hook;
    const HookSplice zero = splice(hook, [](const at::Tensor& a) { return at::zeros_like(a); });
    EXPECT_GT(std::abs(m->NextTokenLossSum(t, {zero}) - clean), 1e-3) << hook;
  }
  // The same activation by either name: the same loss.
  const HookSplice post = splice("blocks.0.hook_resid_post", halve);
  const HookSplice pre = splice("blocks.1.hook_resid_pre", halve);
  EXPECT_NEAR(m->NextTokenLossSum(t, {post}), m->NextTokenLossSum(t, {pre}), 1e-4 * clean);
  EXPECT_GT(std::abs(m->NextTokenLossSum(t, {post}) - clean), 1e-3);
  // Several splices in one pass, in order: halving twice is quartering; a splice that only
  // looks sees the activation the earlier splices left.
  const HookSplice quarter =
      splice("blocks.0.hook_resid_post", [](const at::Tensor& a) { return a * 0.25; });
  at::Tensor seen;
  const HookSplice look = splice("blocks.1.hook_resid_pre", [&seen](const at::Tensor& a) {
    seen = a.clone();
    return a;
  });
  EXPECT_NEAR(m->NextTokenLossSum(t, {post, post}), m->NextTokenLossSum(t, {quarter}),
              1e-4 * clean);
  EXPECT_GT(std::abs(m->NextTokenLossSum(t, {post, post}) - m->NextTokenLossSum(t, {post})), 1e-4);
  const double unseen = m->NextTokenLossSum(t, {quarter});
  EXPECT_EQ(m->NextTokenLossSum(t, {quarter, look}), unseen);
  const at::Tensor quartered = seen;
  m->NextTokenLossSum(t, {look});
  EXPECT_TRUE(at::allclose(quartered, seen * 0.25, 1e-5, 1e-6));
}

TEST(ReferenceModelTest, AttentionIsCausal) {
  auto m = Make(3, "blocks.2.hook_resid_post");
  at::Tensor t = Tokens();
  at::Tensor u = t.clone();
  u.select(1, 15).fill_(5);
  u.select(1, 14).fill_(6);
  at::Tensor a = m->Forward(t), b = m->Forward(u);
  EXPECT_TRUE(at::allclose(a.slice(1, 0, 14), b.slice(1, 0, 14)));
  EXPECT_FALSE(at::allclose(a.slice(1, 14), b.slice(1, 14)));
}

TEST(ReferenceModelTest, RejectsBadSpecsAndHooks) {
  auto hook = *ParseHookName("blocks.3.hook_resid_post");
  EXPECT_EQ(CreateReferenceModel(Small(0), hook, at::kCPU).status().code(),
            absl::StatusCode::kInvalidArgument);  // 3 layers: 0..2
  auto spec = Small(0);
  spec.set_n_heads(5);
  EXPECT_EQ(CreateReferenceModel(spec, *ParseHookName("blocks.0.hook_resid_post"), at::kCPU)
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
  auto resolved = ResolveReferenceSpec(latentd::v1::ReferenceModelSpec());
  ASSERT_TRUE(resolved.ok());
  EXPECT_EQ(resolved->d_model(), 256);
  EXPECT_EQ(resolved->d_mlp(), 1024);
  EXPECT_EQ(resolved->vocab_size(), 4096);
}

}  // namespace
}  // namespace latentd::engine
