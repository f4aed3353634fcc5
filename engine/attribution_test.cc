#include "engine/attribution.h"

#include <cmath>
#include <cstdlib>
#include <map>
#include <memory>
#include <numeric>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "engine/activation_model.h"
#include "engine/intervention_testing.h"
#include "engine/reference_model.h"
#include "engine/sae.h"
#include "gtest/gtest.h"

namespace latentd::engine {
namespace {

// Additions at hooks: (hook, [n, width] added there).
using HookAdds = std::vector<std::pair<std::string, at::Tensor>>;

// The metric of the prompt's run with `adds`.
double Metric(Gpt2Model& m, const HookAdds& adds, int64_t target, std::optional<int64_t> contrast) {
  at::NoGradGuard no_grad;
  HookSplices splices;
  for (const auto& [hook, add] : adds) {
    splices.push_back({*ParseHookName(hook), [add = add](const at::Tensor& x) { return x + add; }});
  }
  const at::Tensor logits =
      m.PredictNextTokens(
           at::tensor(kInterventionPrompt, at::TensorOptions().dtype(at::kLong)).view({1, -1}),
           splices, false)
          .last_logits[0]
          .to(at::kDouble);
  return contrast ? (logits[target] - logits[*contrast]).item<double>()
                  : at::log_softmax(logits, -1)[target].item<double>();
}

// The same with `add` [n, width] added at `hook` (undefined: nothing).
double Metric(Gpt2Model& m, const std::string& hook, const at::Tensor& add, int64_t target,
              std::optional<int64_t> contrast) {
  return Metric(m, add.defined() ? HookAdds{{hook, add}} : HookAdds{}, target, contrast);
}

// The derivative of the metric along `direction` (at each of its hooks at once), by central
// differences. (eps 1e-4: the random weights make the metric curve within 1e-2 of the
// activation.)
double Derivative(Gpt2Model& m, const HookAdds& direction, int64_t target,
                  std::optional<int64_t> contrast) {
  const double eps = 1e-4;
  HookAdds plus, minus;
  for (const auto& [hook, d] : direction) {
    plus.emplace_back(hook, d * eps);
    minus.emplace_back(hook, d * -eps);
  }
  return (Metric(m, plus, target, contrast) - Metric(m, minus, target, contrast)) / (2 * eps);
}

double Derivative(Gpt2Model& m, const std::string& hook, const at::Tensor& direction,
                  int64_t target, std::optional<int64_t> contrast) {
  return Derivative(m, HookAdds{{hook, direction}}, target, contrast);
}

void ExpectDerivative(double got, double want, const std::string& what) {
  EXPECT_NEAR(got, want, 2e-2 * std::abs(want) + 2e-4) << what;
}

// An entry's removal, linearized: along z_j[p] W_dec[j] at position p.
at::Tensor EntryDirection(const Sae& sae, const LatentAttribution& e) {
  at::Tensor d = at::zeros({static_cast<int64_t>(kInterventionPrompt.size()), kInterventionWidth});
  d[e.position] = sae.weights().W_dec[e.latent] * e.activation;
  return d;
}

// The same for a crosscoder over two models credited in its source 1: along z_j[p] times the
// latent's block 1 of the decoder.
at::Tensor DiffedEntryDirection(const Sae& crosscoder, const LatentAttribution& e) {
  at::Tensor d = at::zeros({static_cast<int64_t>(kInterventionPrompt.size()), kInterventionWidth});
  d[e.position] =
      crosscoder.weights().W_dec.narrow(1, kInterventionWidth, kInterventionWidth)[e.latent] *
      e.activation;
  return d;
}

// A TopK SAE of random weights (seed 21) whose latents fire at block 2 of the intervention model
// (positive encoder biases): a later latent to drive.
Sae LaterTargetSae() {
  const SaeConfig cfg = InterventionSae(false).config();
  at::manual_seed(21);
  auto target = Sae::Create(cfg, {at::randn({kInterventionWidth, kInterventionLatents}) * 0.5,
                                  at::randn({kInterventionLatents}) * 0.1 + 0.5,
                                  at::randn({kInterventionLatents, kInterventionWidth}),
                                  at::zeros({kInterventionWidth})});
  EXPECT_TRUE(target.ok()) << target.status();
  return *std::move(target);
}

const std::string kHook = "blocks.1.hook_resid_post";

TEST(AttributionTest, EntriesAndTheErrorTermAreTheMetricsDerivatives) {
  auto model = InterventionModel(kHook);
  const Sae sae = InterventionSae(false);
  AttributionQuery q;
  q.top = 1000;
  auto got = AttributePrompt({model.get(), &sae, *ParseHookName(kHook), std::nullopt},
                             kInterventionPrompt, false, q);
  ASSERT_TRUE(got.ok()) << got.status();
  // The target defaults to the model's own prediction; the metric is its log-probability.
  at::NoGradGuard no_grad;
  const at::Tensor logits =
      model->PredictNextTokens(at::tensor(kInterventionPrompt).view({1, -1}), {}, false)
          .last_logits[0];
  EXPECT_EQ(got->target_token_id, logits.argmax().item<int64_t>());
  EXPECT_NEAR(got->metric, Metric(*model, kHook, {}, got->target_token_id, std::nullopt), 1e-5);

  ASSERT_EQ(got->top_entries.size(),
            kInterventionPrompt.size() * 4);  // k = 4 a position, all listed
  for (int i = 0; i < 3; ++i) {
    const LatentAttribution& e = got->top_entries[i];
    ExpectDerivative(
        Derivative(*model, kHook, EntryDirection(sae, e), got->target_token_id, std::nullopt),
        e.attribution, "entry " + std::to_string(i));
  }
  // The activations are the SAE's codes at the hook.
  const at::Tensor x = model->Forward(at::tensor(kInterventionPrompt).view({1, -1}))[0];
  const at::Tensor z = sae.EncodeDense(x);
  for (const LatentAttribution& e : got->top_entries) {
    EXPECT_NEAR(e.activation, z[e.position][e.latent].item<float>(), 1e-5);
  }
  const at::Tensor error = x - sae.Predict(x, sae.EncodeSparse(x));
  ExpectDerivative(Derivative(*model, kHook, error, got->target_token_id, std::nullopt),
                   got->error_attribution, "error term");

  // Sums: per latent, per position, in all; entries largest first.
  std::map<int64_t, double> per_latent;
  std::vector<double> per_position(kInterventionPrompt.size(), 0);
  double total = 0;
  for (size_t i = 0; i < got->top_entries.size(); ++i) {
    const LatentAttribution& e = got->top_entries[i];
    per_latent[e.latent] += e.attribution;
    per_position[e.position] += e.attribution;
    total += e.attribution;
    if (i > 0) EXPECT_GE(std::abs(got->top_entries[i - 1].attribution), std::abs(e.attribution));
  }
  EXPECT_NEAR(got->latent_attribution, total, 1e-9);
  ASSERT_EQ(got->top_latents.size(), per_latent.size());
  for (const LatentAttribution& l : got->top_latents) {
    EXPECT_NEAR(l.attribution, per_latent[l.latent], 1e-9) << l.latent;
  }
  for (size_t p = 0; p < kInterventionPrompt.size(); ++p) {
    EXPECT_NEAR(got->latent_attribution_by_position[p], per_position[p], 1e-9);
  }
  EXPECT_NEAR(std::accumulate(got->error_attribution_by_position.begin(),
                              got->error_attribution_by_position.end(), 0.0),
              got->error_attribution, 1e-9);

  // The ablation check: each of the top 3 entries taken out of a run of its own moves the
  // metric as the model run by hand with its direction subtracted does. (To first order that is
  // minus its credit; on these random weights, which curve within 1e-2 of the activation, the
  // whole removal lands far from it: what the check is for.)
  q.ablate = 3;
  auto checked = AttributePrompt({model.get(), &sae, *ParseHookName(kHook), std::nullopt},
                                 kInterventionPrompt, false, q);
  ASSERT_TRUE(checked.ok()) << checked.status();
  ASSERT_EQ(checked->ablated_changes.size(), 3u);
  // (All three past position 0: the runs share the prompt's prefix, run once.)
  EXPECT_GT(std::min({checked->top_entries[0].position, checked->top_entries[1].position,
                      checked->top_entries[2].position}),
            0);
  const double clean = Metric(*model, kHook, {}, got->target_token_id, std::nullopt);
  for (int i = 0; i < 3; ++i) {
    const LatentAttribution& e = checked->top_entries[i];
    const double by_hand =
        Metric(*model, kHook, -EntryDirection(sae, e), got->target_token_id, std::nullopt) - clean;
    EXPECT_NEAR(checked->ablated_changes[i], by_hand, 1e-4) << i;
  }
  q.ablate = kMaxAblatedEntries + 1;
  auto refused = AttributePrompt({model.get(), &sae, *ParseHookName(kHook), std::nullopt},
                                 kInterventionPrompt, false, q);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(refused.status().message().find("ablate: 65"), std::string::npos) << refused.status();
  q.ablate = 0;

  q.top = 5;
  auto fewer = AttributePrompt({model.get(), &sae, *ParseHookName(kHook), std::nullopt},
                               kInterventionPrompt, false, q);
  ASSERT_TRUE(fewer.ok());
  ASSERT_EQ(fewer->top_entries.size(), 5u);
  EXPECT_EQ(fewer->top_entries[0].latent, got->top_entries[0].latent);
  EXPECT_EQ(fewer->top_latents.size(), 5u);
}

TEST(AttributionTest, ALogitDifferenceAgainstAContrastToken) {
  auto model = InterventionModel(kHook);
  const Sae sae = InterventionSae(false);
  AttributionQuery q;
  q.target_token_id = 12;
  q.contrast_token_id = 40;
  auto got = AttributePrompt({model.get(), &sae, *ParseHookName(kHook), std::nullopt},
                             kInterventionPrompt, false, q);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->target_token_id, 12);
  EXPECT_EQ(got->contrast_token_id, 40);
  EXPECT_NEAR(got->metric, Metric(*model, kHook, {}, 12, 40), 1e-5);
  ASSERT_EQ(got->top_entries.size(), 20u);  // the default
  ExpectDerivative(Derivative(*model, kHook, EntryDirection(sae, got->top_entries[0]), 12, 40),
                   got->top_entries[0].attribution, "contrast");
}

// A transcoder's latents come from its input hook; their directions act at its output hook.
TEST(AttributionTest, ATranscodersLatentsActWhereItWrites) {
  const std::string in = "blocks.1.mlp.hook_in", out = "blocks.1.hook_mlp_out";
  auto model = InterventionModel(in);
  const Sae transcoder = InterventionSae(true);
  AttributionQuery q;
  q.target_token_id = 5;
  auto got = AttributePrompt({model.get(), &transcoder, *ParseHookName(in), *ParseHookName(out)},
                             kInterventionPrompt, false, q);
  ASSERT_TRUE(got.ok()) << got.status();
  const at::Tensor z =
      transcoder.EncodeDense(model->Forward(at::tensor(kInterventionPrompt).view({1, -1}))[0]);
  for (int i = 0; i < 2; ++i) {
    const LatentAttribution& e = got->top_entries[i];
    EXPECT_NEAR(e.activation, z[e.position][e.latent].item<float>(), 1e-5);
    ExpectDerivative(Derivative(*model, out, EntryDirection(transcoder, e), 5, std::nullopt),
                     e.attribution, "transcoder entry");
  }
}

// Layer 1 of a cross-layer transcoder: a latent's entry is credited through everything it
// writes, the MLP outputs of layers 1 and 2.
TEST(AttributionTest, ACrossLayerTranscodersLatentsActAtEveryLayerTheyWrite) {
  const InterventionCltLayer1 layer1 = LoadInterventionCltLayer1();
  ASSERT_TRUE(layer1.sae.has_value());
  const std::string& dir = layer1.dir;
  Gpt2Model* model = layer1.model.get();
  AttributionQuery q;
  q.target_token_id = 5;
  q.top = 1000;
  const SteeringModel clt = layer1.steering();
  auto got = AttributePrompt(clt, kInterventionPrompt, false, q);
  ASSERT_TRUE(got.ok()) << got.status();
  const at::Tensor z =
      layer1.sae->EncodeDense(model->Forward(at::tensor(kInterventionPrompt).view({1, -1}))[0]);
  ASSERT_EQ(static_cast<int64_t>(got->top_entries.size()), z.ne(0).sum().item<int64_t>());
  const int64_t n = static_cast<int64_t>(kInterventionPrompt.size());
  std::vector<at::Tensor> decoders;
  for (int to = 1; to <= 2; ++to) decoders.push_back(*LoadCrossLayerDecoder(dir, 1, to));
  for (int i = 0; i < 3; ++i) {
    const LatentAttribution& e = got->top_entries[i];
    EXPECT_NEAR(e.activation, z[e.position][e.latent].item<float>(), 1e-5);
    HookAdds direction;
    for (int to = 1; to <= 2; ++to) {
      at::Tensor d = at::zeros({n, kInterventionWidth});
      d[e.position] = decoders[to - 1][e.latent] * e.activation;
      direction.emplace_back("blocks." + std::to_string(to) + ".hook_mlp_out", d);
    }
    ExpectDerivative(Derivative(*model, direction, 5, std::nullopt), e.attribution,
                     "cross-layer entry " + std::to_string(i));
  }
  // Crediting layer 1's output alone (the release's later decoders left out) gives other
  // figures: the later layers' share is not negligible here.
  SteeringModel own_layer = clt;
  own_layer.cross_layer_dir.clear();
  auto alone = AttributePrompt(own_layer, kInterventionPrompt, false, q);
  ASSERT_TRUE(alone.ok()) << alone.status();
  EXPECT_GT(std::abs(alone->latent_attribution - got->latent_attribution),
            0.05 * std::abs(got->latent_attribution));
}

// A crosscoder's latent as the target: an SAE before both its sources drives it through each
// (its value read from both, side by side); one that writes after them cannot.
TEST(AttributionTest, ACrosscodersLatentIsDrivenThroughEverySource) {
  const std::string upstream_hook = "blocks.0.hook_resid_mid";
  const std::unique_ptr<Gpt2Model> model = InterventionModel(upstream_hook);
  const Sae sae = InterventionSae(false);
  const Sae crosscoder = InterventionCrosscoder();
  TargetSae reads{&crosscoder, *ParseHookName(kInterventionCrosscoder[0])};
  for (const std::string& hook : kInterventionCrosscoder) {
    reads.crosscoder_sources.push_back(*ParseHookName(hook));
  }
  // The crosscoder's value of latent j at `position` with `add` at the upstream hook.
  auto value = [&](const at::Tensor& add, int64_t j, int64_t position) {
    at::NoGradGuard no_grad;
    const HookSplices splices = {
        {*ParseHookName(upstream_hook), [&](const at::Tensor& x) { return x + add; }}};
    const std::vector<at::Tensor> read = model->ForwardSpliced(
        at::tensor(kInterventionPrompt).view({1, -1}), reads.crosscoder_sources, splices);
    return crosscoder.EncodeDense(at::cat({read[0][0], read[1][0]}, 1))[position][j].item<double>();
  };
  const int64_t n = static_cast<int64_t>(kInterventionPrompt.size()), position = 6;
  const at::Tensor none = at::zeros({n, kInterventionWidth});
  int64_t j = 0;
  for (int64_t l = 0; l < kInterventionLatents; ++l) {
    if (value(none, l, position) > value(none, j, position)) j = l;
  }
  ASSERT_GT(value(none, j, position), 0);
  AttributionQuery q;
  q.top = 1000;
  q.target_latent = TargetLatent{j, position};
  const SteeringModel upstream{model.get(), &sae, *ParseHookName(upstream_hook), std::nullopt};
  auto got = AttributePrompt(upstream, kInterventionPrompt, false, q, &reads);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_NEAR(got->metric, value(none, j, position), 1e-4);
  const double eps = 1e-3;
  for (int i = 0; i < 3; ++i) {
    const LatentAttribution& e = got->top_entries[i];
    const at::Tensor d = EntryDirection(sae, e);
    ExpectDerivative((value(d * eps, j, position) - value(d * -eps, j, position)) / (2 * eps),
                     e.attribution, "crosscoder target entry " + std::to_string(i));
  }
  // An SAE that writes after both sources cannot drive it.
  const SteeringModel later{model.get(), &sae, *ParseHookName("blocks.2.hook_resid_post"),
                            std::nullopt};
  auto refused = AttributePrompt(later, kInterventionPrompt, false, q, &reads);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(refused.status().message().find(
                "its crosscoder reads nothing later than blocks.1.hook_resid_post"),
            std::string::npos)
      << refused.status();
}

// A crosscoder over two models (model diffing) credited in the second, the first run beside it:
// each entry's activation is the crosscoder's value from both models' activations, its credit
// the metric's derivative along z_j[p] times the latent's block 1 at that position of the
// second model, the error term its block's; the ablation check's changes are the second model
// run with the entry's part taken out. Alone (no model beside it) it is refused, as is a target
// latent.
TEST(AttributionTest, ACrosscoderOverModelsIsCreditedInTheRunningModel) {
  const std::string hook = kInterventionCrosscoder[0];
  const std::unique_ptr<Gpt2Model> model = InterventionModel(hook);
  const std::unique_ptr<Gpt2Model> other = InterventionModel(hook, 6);
  const Sae crosscoder = InterventionCrosscoder();
  SteeringModel steering{model.get(), &crosscoder, *ParseHookName(hook)};
  steering.diffed_source = 1;
  steering.diffed_models = {{other.get(), *ParseHookName(hook)},
                            {model.get(), *ParseHookName(hook)}};
  AttributionQuery q;
  q.top = 1000;
  q.ablate = 2;
  auto got = AttributePrompt(steering, kInterventionPrompt, false, q);
  ASSERT_TRUE(got.ok()) << got.status();
  at::Tensor x, x_other;
  {
    at::NoGradGuard no_grad;
    const at::Tensor ids = at::tensor(kInterventionPrompt).view({1, -1});
    x = model->Forward(ids)[0];
    x_other = other->Forward(ids)[0];
  }
  const at::Tensor both = at::cat({x_other, x}, 1);
  const at::Tensor z = crosscoder.EncodeDense(both);
  ASSERT_EQ(got->top_entries.size(), kInterventionPrompt.size() * 4);  // k = 4
  for (const LatentAttribution& e : got->top_entries) {
    EXPECT_NEAR(e.activation, z[e.position][e.latent].item<float>(), 1e-5);
  }
  for (int i = 0; i < 3; ++i) {
    const LatentAttribution& e = got->top_entries[i];
    ExpectDerivative(Derivative(*model, hook, DiffedEntryDirection(crosscoder, e),
                                got->target_token_id, std::nullopt),
                     e.attribution, "entry " + std::to_string(i));
  }
  const at::Tensor predicted = crosscoder.Predict(both, crosscoder.EncodeSparse(both));
  const at::Tensor error = x - predicted.narrow(1, kInterventionWidth, kInterventionWidth);
  ExpectDerivative(Derivative(*model, hook, error, got->target_token_id, std::nullopt),
                   got->error_attribution, "error term");
  ASSERT_EQ(got->ablated_changes.size(), 2u);
  for (int i = 0; i < 2; ++i) {
    const LatentAttribution& e = got->top_entries[i];
    EXPECT_NEAR(got->ablated_changes[i],
                Metric(*model, hook, -DiffedEntryDirection(crosscoder, e), got->target_token_id,
                       std::nullopt) -
                    got->metric,
                1e-4)
        << i;
  }

  SteeringModel alone = steering;
  alone.diffed_models.clear();
  alone.diffed_alone = "because the test says so";
  auto refused = AttributePrompt(alone, kInterventionPrompt, false, q);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(refused.status().message().find("cannot run beside the credited one: because the "
                                            "test says so"),
            std::string::npos)
      << refused.status();
}

// Latents of two SAEs taken out of one run together: the SAE at block 1 encodes what the
// removal at block 0 left, as the model run by hand with both removals does.
TEST(AttributionTest, LatentsOfSeveralSaesAreTakenOutTogether) {
  const std::unique_ptr<Gpt2Model> model = InterventionModel(kHook);
  const Sae sae = InterventionSae(false);  // the same SAE at both hooks
  const std::string early = "blocks.0.hook_resid_post";
  const std::vector<SteeringModel> saes = {
      {model.get(), &sae, *ParseHookName(early), std::nullopt},
      {model.get(), &sae, *ParseHookName(kHook), std::nullopt}};
  const at::Tensor ids = at::tensor(kInterventionPrompt).view({1, -1});
  at::Tensor z0, z1;
  {
    at::NoGradGuard no_grad;
    const std::vector<at::Tensor> read =
        model->ForwardSpliced(ids, {*ParseHookName(early), *ParseHookName(kHook)}, {});
    z0 = sae.EncodeDense(read[0][0]);
    z1 = sae.EncodeDense(read[1][0]);
  }
  const int64_t p0 = 2, j0 = z0[p0].argmax().item<int64_t>();
  const int64_t p1 = 5, j1 = z1[p1].argmax().item<int64_t>();
  AttributionQuery q;
  q.token_ids = kInterventionPrompt;
  q.target_token_id = 5;
  auto got = AblateTogether(saes, {{{j0, p0}}, {{j1, p1}}}, kInterventionPrompt, q, 5, nullptr);
  ASSERT_TRUE(got.ok()) << got.status();
  // By hand: block 0's latent out at p0; block 1's encoded from what that left, out at p1.
  HookAdds none;
  const double clean = Metric(*model, none, 5, std::nullopt);
  double by_hand = 0;
  {
    at::NoGradGuard no_grad;
    const at::Tensor row0 = sae.weights().W_dec[j0] * z0[p0][j0];
    HookSplices splices = {{*ParseHookName(early),
                            [&](const at::Tensor& x) {
                              at::Tensor o = x.clone();
                              o[0][p0] -= row0;
                              return o;
                            }},
                           {*ParseHookName(kHook), [&](const at::Tensor& x) {
                              at::Tensor o = x.clone();
                              o[0][p1] -= sae.weights().W_dec[j1] * sae.EncodeDense(x[0])[p1][j1];
                              return o;
                            }}};
    const at::Tensor logits =
        model->PredictNextTokens(ids, splices, false).last_logits[0].to(at::kDouble);
    by_hand = at::log_softmax(logits, -1)[5].item<double>() - clean;
  }
  EXPECT_NEAR(*got, by_hand, 1e-4);
  EXPECT_GT(std::abs(*got), 1e-4);
  auto refused = AblateTogether(saes, {{{j0, p0}}, {{kInterventionLatents, 0}}},
                                kInterventionPrompt, q, 5, nullptr);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(refused.status().message().find("removed[1]"), std::string::npos);
}

// The value of latent `latent` of `target` (reading `target_hook`) at `position` in the
// prompt's run with `adds`.
double TargetValue(Gpt2Model& m, const HookAdds& adds, const Sae& target,
                   const std::string& target_hook, int64_t latent, int64_t position) {
  at::NoGradGuard no_grad;
  at::Tensor read;
  HookSplices splices;
  for (const auto& [hook, add] : adds) {
    splices.push_back({*ParseHookName(hook), [add = add](const at::Tensor& x) { return x + add; }});
  }
  splices.push_back({*ParseHookName(target_hook), [&](const at::Tensor& x) {
                       read = x;
                       return x;
                     }});
  m.PredictNextTokens(
      at::tensor(kInterventionPrompt, at::TensorOptions().dtype(at::kLong)).view({1, -1}), splices,
      false);
  return target.EncodeDense(read[0].to(at::kFloat))[position][latent].item<double>();
}

// The same with `add` [n, width] added at `hook`.
double TargetValue(Gpt2Model& m, const std::string& hook, const at::Tensor& add, const Sae& target,
                   const std::string& target_hook, int64_t latent, int64_t position) {
  return TargetValue(m, HookAdds{{hook, add}}, target, target_hook, latent, position);
}

// That value's derivative along `direction` [n, width] added at `hook`, by central differences.
double TargetDerivative(Gpt2Model& m, const std::string& hook, const at::Tensor& direction,
                        const Sae& target, const std::string& target_hook, int64_t latent,
                        int64_t position) {
  const double eps = 1e-3;
  return (TargetValue(m, hook, direction * eps, target, target_hook, latent, position) -
          TargetValue(m, hook, direction * -eps, target, target_hook, latent, position)) /
         (2 * eps);
}

// A crosscoder over blocks 1 and 0 (in that order of its blocks): each entry is credited its
// effect through both hooks it writes, each with its own block of the decoder, and the error
// term is both sources' error together.
TEST(AttributionTest, ACrosscodersLatentsActAtEverySourceTheyWrite) {
  const std::unique_ptr<Gpt2Model> model = InterventionModel(kHook);
  const Sae crosscoder = InterventionCrosscoder();
  SteeringModel steering{model.get(), &crosscoder, *ParseHookName(kInterventionCrosscoder[0])};
  for (const std::string& hook : kInterventionCrosscoder) {
    steering.crosscoder_sources.push_back(*ParseHookName(hook));
  }
  AttributionQuery q;
  q.target_token_id = 5;
  q.top = 1000;
  auto got = AttributePrompt(steering, kInterventionPrompt, false, q);
  ASSERT_TRUE(got.ok()) << got.status();
  at::Tensor x;
  {
    at::NoGradGuard no_grad;
    const std::vector<at::Tensor> read = model->ForwardSpliced(
        at::tensor(kInterventionPrompt).view({1, -1}), steering.crosscoder_sources, {});
    x = at::cat({read[0][0], read[1][0]}, 1);
  }
  const at::Tensor z = crosscoder.EncodeDense(x);
  ASSERT_EQ(static_cast<int64_t>(got->top_entries.size()), z.ne(0).sum().item<int64_t>());
  const int64_t n = static_cast<int64_t>(kInterventionPrompt.size()), d = kInterventionWidth;
  // A [n, 2d] change split into its blocks, each added at its hook.
  auto at_sources = [&](const at::Tensor& both) {
    return HookAdds{{kInterventionCrosscoder[0], both.narrow(1, 0, d)},
                    {kInterventionCrosscoder[1], both.narrow(1, d, d)}};
  };
  for (int i = 0; i < 3; ++i) {
    const LatentAttribution& e = got->top_entries[i];
    EXPECT_NEAR(e.activation, z[e.position][e.latent].item<float>(), 1e-5);
    at::Tensor both = at::zeros({n, 2 * d});
    both[e.position] = crosscoder.weights().W_dec[e.latent] * e.activation;
    ExpectDerivative(Derivative(*model, at_sources(both), 5, std::nullopt), e.attribution,
                     "crosscoder entry " + std::to_string(i));
  }
  const at::Tensor error = x - crosscoder.Predict(x, crosscoder.EncodeSparse(x));
  ExpectDerivative(Derivative(*model, at_sources(error), 5, std::nullopt), got->error_attribution,
                   "crosscoder error term");
  // The source the forward reaches first (block 1's hook) alone is not the whole effect.
  const double first_alone = Derivative(
      *model, HookAdds{{kInterventionCrosscoder[1], error.narrow(1, d, d)}}, 5, std::nullopt);
  EXPECT_GT(std::abs(first_alone - got->error_attribution),
            0.05 * std::abs(got->error_attribution));
  // Its ablation check takes each entry out of both sources.
  q.ablate = 2;
  auto checked = AttributePrompt(steering, kInterventionPrompt, false, q);
  ASSERT_TRUE(checked.ok()) << checked.status();
  ASSERT_EQ(checked->ablated_changes.size(), 2u);
  const double clean = Metric(*model, HookAdds{}, 5, std::nullopt);
  for (int i = 0; i < 2; ++i) {
    const LatentAttribution& e = checked->top_entries[i];
    at::Tensor both = at::zeros({n, 2 * d});
    both[e.position] = crosscoder.weights().W_dec[e.latent] * -e.activation;
    EXPECT_NEAR(checked->ablated_changes[i],
                Metric(*model, at_sources(both), 5, std::nullopt) - clean, 1e-4)
        << i;
  }

  // Its latents drive a later SAE's latent (block 2's) through both sources.
  const std::string target_hook = "blocks.2.hook_resid_post";
  const Sae target = InterventionSae(false);
  const TargetSae reads{&target, *ParseHookName(target_hook)};
  const int64_t position = 5;
  const at::Tensor z_target = target.EncodeDense(
      InterventionModel(target_hook)->Forward(at::tensor(kInterventionPrompt).view({1, -1}))[0]);
  AttributionQuery to_latent;
  to_latent.top = 1000;
  to_latent.target_latent = TargetLatent{z_target[position].argmax().item<int64_t>(), position};
  auto driven = AttributePrompt(steering, kInterventionPrompt, false, to_latent, &reads);
  ASSERT_TRUE(driven.ok()) << driven.status();
  const double eps = 1e-3;
  for (int i = 0; i < 3; ++i) {
    const LatentAttribution& e = driven->top_entries[i];
    at::Tensor both = at::zeros({n, 2 * d});
    both[e.position] = crosscoder.weights().W_dec[e.latent] * e.activation;
    const double derivative = (TargetValue(*model, at_sources(both * eps), target, target_hook,
                                           to_latent.target_latent->latent, position) -
                               TargetValue(*model, at_sources(both * -eps), target, target_hook,
                                           to_latent.target_latent->latent, position)) /
                              (2 * eps);
    ExpectDerivative(derivative, e.attribution, "crosscoder to latent " + std::to_string(i));
  }
  // With a latent as the metric, the ablation check measures that latent.
  to_latent.ablate = 1;
  auto checked_latent = AttributePrompt(steering, kInterventionPrompt, false, to_latent, &reads);
  ASSERT_TRUE(checked_latent.ok()) << checked_latent.status();
  ASSERT_EQ(checked_latent->ablated_changes.size(), 1u);
  const LatentAttribution& top = checked_latent->top_entries[0];
  at::Tensor removed = at::zeros({n, 2 * d});
  removed[top.position] = crosscoder.weights().W_dec[top.latent] * -top.activation;
  const int64_t j = to_latent.target_latent->latent;
  EXPECT_NEAR(checked_latent->ablated_changes[0],
              TargetValue(*model, at_sources(removed), target, target_hook, j, position) -
                  TargetValue(*model, HookAdds{}, target, target_hook, j, position),
              1e-4);
}

// Latent to latent: the metric is a later SAE's latent at one position; each upstream entry is
// credited its first-order effect on it, and positions after the target get nothing.
TEST(AttributionTest, ALaterSaesLatentIsDrivenByTheEarlierLatents) {
  const std::string target_hook = "blocks.2.hook_resid_post";
  auto model = InterventionModel(kHook);
  const Sae sae = InterventionSae(false);
  const Sae target = LaterTargetSae();
  const int64_t position = 5;
  const at::Tensor z_target = target.EncodeDense(
      InterventionModel(target_hook)->Forward(at::tensor(kInterventionPrompt).view({1, -1}))[0]);
  const int64_t j = z_target[position].argmax().item<int64_t>();
  const double value = z_target[position][j].item<double>();
  ASSERT_GT(value, 0);
  const SteeringModel upstream{model.get(), &sae, *ParseHookName(kHook), std::nullopt};
  const TargetSae reads{&target, *ParseHookName(target_hook)};
  AttributionQuery q;
  q.top = 1000;
  q.target_latent = TargetLatent{j, position};
  auto got = AttributePrompt(upstream, kInterventionPrompt, false, q, &reads);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_NEAR(got->metric, value, 1e-4);
  ASSERT_TRUE(got->target_latent.has_value());
  EXPECT_EQ(got->target_latent->latent, j);
  for (int i = 0; i < 3; ++i) {
    const LatentAttribution& e = got->top_entries[i];
    EXPECT_LE(e.position, position);
    ExpectDerivative(
        TargetDerivative(*model, kHook, EntryDirection(sae, e), target, target_hook, j, position),
        e.attribution, "latent target entry " + std::to_string(i));
  }
  for (size_t p = position + 1; p < kInterventionPrompt.size(); ++p) {
    EXPECT_EQ(got->latent_attribution_by_position[p], 0) << p;
    EXPECT_EQ(got->error_attribution_by_position[p], 0) << p;
  }

  // Several targets at once (one forward, a backward each) answer as each alone; a silent one
  // and one out of range are refused in their places.
  const int64_t silent_latent = z_target[position].argmin().item<int64_t>();
  const std::vector<TargetLatent> targets = {{j, position},
                                             {silent_latent, position},
                                             {z_target[3].argmax().item<int64_t>(), 3},
                                             {kInterventionLatents, 0}};
  auto batch = AttributeToLatents(upstream, kInterventionPrompt, false, q, reads, targets);
  ASSERT_TRUE(batch.ok()) << batch.status();
  ASSERT_EQ(batch->size(), 4u);
  EXPECT_EQ((*batch)[1].status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ((*batch)[3].status().code(), absl::StatusCode::kInvalidArgument);
  for (size_t i : {size_t{0}, size_t{2}}) {
    AttributionQuery alone_query = q;
    alone_query.target_latent = targets[i];
    auto alone = AttributePrompt(upstream, kInterventionPrompt, false, alone_query, &reads);
    ASSERT_TRUE(alone.ok() && (*batch)[i].ok()) << alone.status() << (*batch)[i].status();
    const AttributionResult& together = *(*batch)[i];
    EXPECT_NEAR(together.metric, alone->metric, 1e-6) << i;
    EXPECT_NEAR(together.latent_attribution, alone->latent_attribution, 1e-6) << i;
    EXPECT_NEAR(together.error_attribution, alone->error_attribution, 1e-6) << i;
    ASSERT_EQ(together.top_entries.size(), alone->top_entries.size()) << i;
    for (size_t e = 0; e < alone->top_entries.size(); ++e) {
      EXPECT_EQ(together.top_entries[e].latent, alone->top_entries[e].latent) << i << " " << e;
      EXPECT_NEAR(together.top_entries[e].attribution, alone->top_entries[e].attribution, 1e-6);
    }
  }
  EXPECT_NE((*batch)[0]->latent_attribution, (*batch)[2]->latent_attribution);

  // Refused: a target the forward computes before the SAE writes; a token target beside it; a
  // latent that is 0 there; a latent or position outside their ranges.
  auto refused = [&](const SteeringModel& s, const TargetSae& t, AttributionQuery query,
                     absl::StatusCode code, const std::string& says) {
    auto r = AttributePrompt(s, kInterventionPrompt, false, query, &t);
    EXPECT_EQ(r.status().code(), code) << says << " " << r.status();
    EXPECT_NE(r.status().message().find(says), std::string::npos) << r.status();
  };
  const TargetSae earlier{&target, *ParseHookName("blocks.0.hook_mlp_out")};
  refused(upstream, earlier, q, absl::StatusCode::kInvalidArgument,
          "target_latent.dataset_id: its SAE reads blocks.0.hook_mlp_out, which the forward "
          "computes before blocks.1.hook_resid_post");
  AttributionQuery with_token = q;
  with_token.target_token_id = 3;
  refused(upstream, reads, with_token, absl::StatusCode::kInvalidArgument,
          "target_token_id: not with target_latent");
  AttributionQuery silent = q;
  silent.target_latent->latent = z_target[position].argmin().item<int64_t>();
  ASSERT_EQ(z_target[position][silent.target_latent->latent].item<float>(), 0);
  refused(upstream, reads, silent, absl::StatusCode::kFailedPrecondition, "is 0 at position 5");
  AttributionQuery outside = q;
  outside.target_latent->latent = kInterventionLatents;
  refused(upstream, reads, outside, absl::StatusCode::kInvalidArgument, "target_latent.latent");
  outside = q;
  outside.target_latent->position = static_cast<int64_t>(kInterventionPrompt.size());
  refused(upstream, reads, outside, absl::StatusCode::kInvalidArgument, "target_latent.position");
}

// A latent of a crosscoder over two models (model diffing) as the target, read in the model the
// upstream SAE hooks (its source 1) and beside it the other model (source 0), which nothing
// upstream moves: the metric is the crosscoder's latent over both models' activations, each
// entry its derivative through the running model alone, the ablation check and AblateTogether
// that latent with the entry taken out.
TEST(AttributionTest, ALatentOfACrosscoderOverModelsIsDrivenInTheRunningModel) {
  const std::string target_hook = "blocks.2.hook_resid_post";
  const HookName read_at = *ParseHookName(target_hook);
  auto model = InterventionModel(kHook);
  auto other = InterventionModel(target_hook, 6);
  const Sae sae = InterventionSae(false);
  const Sae crosscoder = InterventionCrosscoder();
  const at::Tensor ids = at::tensor(kInterventionPrompt).view({1, -1});
  at::Tensor x_other;
  {
    at::NoGradGuard no_grad;
    x_other = other->ForwardSpliced(ids, {read_at}, {})[0][0].to(at::kFloat);
  }
  // The latent's value with `adds` made to the running model, the other model as it is.
  auto value = [&](const HookAdds& adds, int64_t latent, int64_t position) {
    at::NoGradGuard no_grad;
    at::Tensor read;
    HookSplices splices;
    for (const auto& [hook, add] : adds) {
      splices.push_back(
          {*ParseHookName(hook), [add = add](const at::Tensor& x) { return x + add; }});
    }
    splices.push_back({read_at, [&](const at::Tensor& x) {
                         read = x;
                         return x;
                       }});
    model->PredictNextTokens(ids, splices, false);
    return crosscoder.EncodeDense(at::cat({x_other, read[0].to(at::kFloat)}, 1))[position][latent]
        .item<double>();
  };
  const int64_t position = 5;
  at::Tensor z;
  {
    at::NoGradGuard no_grad;
    const at::Tensor x = model->ForwardSpliced(ids, {read_at}, {})[0][0].to(at::kFloat);
    z = crosscoder.EncodeDense(at::cat({x_other, x}, 1));
  }
  const int64_t j = z[position].argmax().item<int64_t>();
  ASSERT_GT(z[position][j].item<float>(), 0);
  const SteeringModel upstream{model.get(), &sae, *ParseHookName(kHook), std::nullopt};
  TargetSae reads{&crosscoder, read_at};
  reads.diffed_source = 1;
  reads.diffed_models = {{other.get(), read_at}, {model.get(), read_at}};
  AttributionQuery q;
  q.top = 1000;
  q.ablate = 2;
  q.target_latent = TargetLatent{j, position};
  auto got = AttributePrompt(upstream, kInterventionPrompt, false, q, &reads);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_NEAR(got->metric, z[position][j].item<double>(), 1e-5);
  EXPECT_NEAR(got->metric, value({}, j, position), 1e-5);
  const double eps = 1e-3;
  for (int i = 0; i < 3; ++i) {
    const LatentAttribution& e = got->top_entries[i];
    const at::Tensor d = EntryDirection(sae, e);
    const double derivative =
        (value({{kHook, d * eps}}, j, position) - value({{kHook, d * -eps}}, j, position)) /
        (2 * eps);
    ExpectDerivative(derivative, e.attribution, "entry " + std::to_string(i));
  }
  ASSERT_EQ(got->ablated_changes.size(), 2u);
  for (int i = 0; i < 2; ++i) {
    const LatentAttribution& e = got->top_entries[i];
    const double by_hand = value({{kHook, -EntryDirection(sae, e)}}, j, position) - got->metric;
    EXPECT_NEAR(got->ablated_changes[i], by_hand, 1e-4) << i;
    auto together =
        AblateTogether({upstream}, {{{e.latent, e.position}}}, kInterventionPrompt, q, 0, &reads);
    ASSERT_TRUE(together.ok()) << together.status();
    EXPECT_NEAR(*together, by_hand, 1e-4) << i;
  }
}

// A crosscoder over two models (model diffing) credited in its source 1 with a later latent of
// that model as the target: each entry's value from both models' activations, its credit the
// target's derivative along z_j[p] times the latent's block 1 (the other model, beside it, does
// not move); the ablation check against the model run with that part taken out; the graph's
// batched passes answer as one; without the other model FAILED_PRECONDITION as to a token.
TEST(AttributionTest, ACrosscoderOverModelsDrivesALaterLatentOfTheRunningModel) {
  const std::string hook = kInterventionCrosscoder[0];
  const std::string target_hook = "blocks.2.hook_resid_post";
  const std::unique_ptr<Gpt2Model> model = InterventionModel(hook);
  const std::unique_ptr<Gpt2Model> other = InterventionModel(hook, 6);
  const Sae crosscoder = InterventionCrosscoder();
  SteeringModel steering{model.get(), &crosscoder, *ParseHookName(hook)};
  steering.diffed_source = 1;
  steering.diffed_models = {{other.get(), *ParseHookName(hook)},
                            {model.get(), *ParseHookName(hook)}};
  const Sae target = LaterTargetSae();
  const at::Tensor ids = at::tensor(kInterventionPrompt).view({1, -1});
  const int64_t position = 5;
  at::Tensor z, z_target;
  {
    at::NoGradGuard no_grad;
    z = crosscoder.EncodeDense(at::cat({other->Forward(ids)[0], model->Forward(ids)[0]}, 1));
    z_target = target.EncodeDense(
        model->ForwardSpliced(ids, {*ParseHookName(target_hook)}, {})[0][0].to(at::kFloat));
  }
  const int64_t j = z_target[position].argmax().item<int64_t>();
  ASSERT_GT(z_target[position][j].item<float>(), 0);
  const TargetSae reads{&target, *ParseHookName(target_hook)};
  AttributionQuery q;
  q.top = 1000;
  q.ablate = 2;
  q.target_latent = TargetLatent{j, position};
  auto got = AttributePrompt(steering, kInterventionPrompt, false, q, &reads);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_NEAR(got->metric, z_target[position][j].item<double>(), 1e-5);
  ASSERT_GE(got->top_entries.size(), 3u);
  for (const LatentAttribution& e : got->top_entries) {
    EXPECT_NEAR(e.activation, z[e.position][e.latent].item<float>(), 1e-5);
  }
  for (int i = 0; i < 3; ++i) {
    const LatentAttribution& e = got->top_entries[i];
    EXPECT_LE(e.position, position);
    ExpectDerivative(TargetDerivative(*model, hook, DiffedEntryDirection(crosscoder, e), target,
                                      target_hook, j, position),
                     e.attribution, "entry " + std::to_string(i));
  }
  ASSERT_EQ(got->ablated_changes.size(), 2u);
  for (int i = 0; i < 2; ++i) {
    const LatentAttribution& e = got->top_entries[i];
    const double by_hand = TargetValue(*model, hook, -DiffedEntryDirection(crosscoder, e), target,
                                       target_hook, j, position) -
                           got->metric;
    EXPECT_NEAR(got->ablated_changes[i], by_hand, 1e-4) << i;
    // As an attribution graph's circuit takes it out.
    auto together =
        AblateTogether({steering}, {{{e.latent, e.position}}}, kInterventionPrompt, q, 0, &reads);
    ASSERT_TRUE(together.ok()) << together.status();
    EXPECT_NEAR(*together, by_hand, 1e-4) << i;
  }
  auto batch = AttributeToLatents(steering, kInterventionPrompt, false, q, reads, {{j, position}});
  ASSERT_TRUE(batch.ok() && batch->front().ok()) << batch.status();
  EXPECT_NEAR(batch->front()->latent_attribution, got->latent_attribution, 1e-6);
  EXPECT_NEAR(batch->front()->error_attribution, got->error_attribution, 1e-6);

  SteeringModel alone = steering;
  alone.diffed_models.clear();
  alone.diffed_alone = "because the test says so";
  auto refused = AttributePrompt(alone, kInterventionPrompt, false, q, &reads);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(refused.status().message().find("because the test says so"), std::string::npos)
      << refused.status();
  auto not_taken_out = AblateTogether({alone}, {{{0, 0}}}, kInterventionPrompt, q, 0, &reads);
  EXPECT_EQ(not_taken_out.status().code(), absl::StatusCode::kFailedPrecondition);
}

TEST(AttributionTest, BadQueriesNameTheirField) {
  auto model = InterventionModel(kHook);
  const Sae sae = InterventionSae(false);
  auto refused = [&](AttributionQuery q, const std::string& field) {
    auto r = AttributePrompt({model.get(), &sae, *ParseHookName(kHook), std::nullopt},
                             kInterventionPrompt, false, q);
    ASSERT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << field << r.status();
    EXPECT_NE(r.status().message().find(field), std::string::npos) << r.status();
  };
  AttributionQuery q;
  q.target_token_id = 100;
  refused(q, "target_token_id: 100 outside the vocabulary [0, 100)");
  q.target_token_id = 3;
  q.contrast_token_id = -1;
  refused(q, "contrast_token_id");
  q.contrast_token_id = 3;
  refused(q, "contrast_token_id: 3 is the target");
  q = AttributionQuery();
  q.contrast_token_id = 4;
  refused(q, "contrast_token_id: needs a target_token_id");
  q = AttributionQuery();
  q.top = 1001;
  refused(q, "top");
}

}  // namespace
}  // namespace latentd::engine
