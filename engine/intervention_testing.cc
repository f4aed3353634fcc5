#include "engine/intervention_testing.h"

#include <cstdlib>

#include "engine/clt_model.h"
#include "engine/reference_model.h"
#include "gtest/gtest.h"

namespace latentd::engine {

std::unique_ptr<Gpt2Model> InterventionModel(const std::string& hook, uint64_t seed,
                                             int64_t vocab) {
  latentd::v1::ReferenceModelSpec s;
  s.set_d_model(kInterventionWidth);
  s.set_n_layers(3);
  s.set_n_heads(4);
  s.set_vocab_size(vocab);
  s.set_context_length(16);
  s.set_seed(seed);
  auto m = CreateReferenceModel(s, *ParseHookName(hook), at::kCPU);
  EXPECT_TRUE(m.ok()) << m.status();
  return m.ok() ? std::move(*m) : nullptr;
}

namespace {

// A TopK SAE (k = 4, kInterventionLatents latents) of `cfg`'s other fields, its weights drawn
// with `seed` (the decoder's output as wide as its input).
Sae RandomTopKSae(SaeConfig cfg, uint64_t seed) {
  const int64_t d = cfg.d_in, n = kInterventionLatents;
  at::manual_seed(seed);
  cfg.d_sae = n;
  cfg.architecture = SaeArchitecture::kTopK;
  cfg.k = 4;
  auto sae = Sae::Create(cfg, {at::randn({d, n}) * 0.5, at::randn({n}) * 0.1 + 0.5,
                               at::randn({n, d}), at::randn({d}) * 0.1});
  EXPECT_TRUE(sae.ok()) << sae.status();
  return *std::move(sae);
}

}  // namespace

Sae InterventionSae(bool transcoder) {
  SaeConfig cfg;
  cfg.d_in = kInterventionWidth;
  cfg.transcoder = transcoder;
  cfg.d_out = transcoder ? kInterventionWidth : 0;
  cfg.apply_b_dec_to_input = !transcoder;
  return RandomTopKSae(cfg, 11);
}

Sae InterventionCrosscoder() {
  SaeConfig cfg;
  cfg.d_in = 2 * kInterventionWidth;
  cfg.apply_b_dec_to_input = false;
  cfg.crosscoder_sources = 2;
  cfg.crosscoder_hooks = kInterventionCrosscoder;
  return RandomTopKSae(cfg, 17);
}

void WriteInterventionClt(const std::string& dir) {
  CltModelOptions options;
  options.architecture = latentd::v1::RELU;
  options.layers = 3;
  options.d_in = options.d_out = kInterventionWidth;
  options.d_sae = kInterventionLatents;
  options.seed = 13;
  CltModel clt(options);
  torch::NoGradGuard no_grad;
  at::manual_seed(13);
  for (torch::Tensor& b : clt->b_enc) b.copy_(at::randn_like(b) * 0.1);  // not all at the origin
  const absl::Status saved = clt->Save(dir, {"hook_resid_mid", "hook_mlp_out", "reference"});
  ASSERT_TRUE(saved.ok()) << saved;
}

InterventionCltLayer1 LoadInterventionCltLayer1() {
  InterventionCltLayer1 out;
  out.dir = std::string(std::getenv("TEST_TMPDIR")) + "/clt";
  WriteInterventionClt(out.dir);
  out.model = InterventionModel(kInterventionCltInput);
  auto layer1 = Sae::Load(out.dir, *ParseHookName(kInterventionCltInput));
  EXPECT_TRUE(layer1.ok()) << layer1.status();
  if (layer1.ok()) out.sae = *std::move(layer1);
  return out;
}

}  // namespace latentd::engine
