#include "engine/steering.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "engine/intervention_testing.h"
#include "engine/reference_model.h"
#include "engine/sae.h"
#include "gtest/gtest.h"

namespace latentd::engine {
namespace {

at::Tensor Row(const std::vector<int64_t>& ids) {
  return at::tensor(ids, at::TensorOptions().dtype(at::kLong)).view({1, -1});
}

// The model's own run of `ids` with `splice` (none when its function is empty): what a steered
// run must equal, done by hand.
NextTokenPredictions ByHand(Gpt2Model& m, const std::vector<int64_t>& ids,
                            const HookSplices& splices) {
  at::NoGradGuard no_grad;
  return m.PredictNextTokens(Row(ids), splices, /*losses=*/true);
}

NextTokenPredictions ByHand(Gpt2Model& m, const std::vector<int64_t>& ids,
                            const HookSplice* splice) {
  return ByHand(m, ids, splice != nullptr ? HookSplices{*splice} : HookSplices{});
}

std::vector<float> Losses(const NextTokenPredictions& p) {
  const at::Tensor l = p.losses[0].contiguous();
  return {l.data_ptr<float>(), l.data_ptr<float>() + l.numel()};
}

void ExpectNear(const std::vector<float>& got, const std::vector<float>& want, float tol,
                const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], want[i], tol) << what << " " << i;
}

// The hook activation [n, width] of the prompt's single run.
at::Tensor Activation(const std::string& hook, const std::vector<int64_t>& ids) {
  at::NoGradGuard no_grad;
  return InterventionModel(hook)->Forward(Row(ids))[0];
}

struct Fixture {
  std::unique_ptr<Gpt2Model> model = InterventionModel("blocks.1.hook_resid_post");
  Sae sae = InterventionSae(false);
  SteeringModel steering() {
    return {model.get(), &sae, *ParseHookName("blocks.1.hook_resid_post"), std::nullopt};
  }
  absl::StatusOr<SteeringResult> Steer(const SteeringQuery& q) {
    return SteerPrompt(steering(), kInterventionPrompt, /*bos_prepended=*/false, q, nullptr);
  }
};

SteeringQuery Query(std::vector<LatentIntervention> interventions, int new_tokens = 0) {
  SteeringQuery q;
  q.interventions = std::move(interventions);
  q.new_tokens = new_tokens;
  return q;
}

// An intervention that changes nothing (scaling by 1) leaves the steered run the clean one,
// and the clean run is the model's own.
TEST(SteeringTest, AnInterventionThatChangesNothingLeavesTheCleanRun) {
  Fixture f;
  auto r = f.Steer(Query({{5, InterventionMode::kScale, 1.0f, {}}}, 4));
  ASSERT_TRUE(r.ok()) << r.status();
  const std::vector<float> own = Losses(ByHand(*f.model, kInterventionPrompt, nullptr));
  ExpectNear(r->clean.token_losses, own, 1e-5, "clean");
  ExpectNear(r->steered.token_losses, own, 1e-5, "steered");
  EXPECT_EQ(r->clean.generated, r->steered.generated);
  EXPECT_EQ(r->clean.generated.size(), 4u);
  EXPECT_NEAR(r->kl_divergence, 0, 1e-6);
  ASSERT_EQ(r->clean.next.size(), 10u);
  for (size_t i = 1; i < r->clean.next.size(); ++i) {
    EXPECT_GE(r->clean.next[i - 1].probability, r->clean.next[i].probability);
  }
  double mean = 0;
  for (float l : own) mean += l / own.size();
  EXPECT_NEAR(r->clean.mean_loss, mean, 1e-5);
  EXPECT_EQ(r->prompt, kInterventionPrompt);
}

// ADD moves the activation along the latent's decoder row, at every position.
TEST(SteeringTest, AddingToALatentAddsItsDecoderDirection) {
  Fixture f;
  const int64_t j = 17;
  const float value = 6;
  auto r = f.Steer(Query({{j, InterventionMode::kAdd, value, {}}}));
  ASSERT_TRUE(r.ok()) << r.status();
  const at::Tensor direction = f.sae.weights().W_dec[j] * value;
  const HookSplice add{*ParseHookName("blocks.1.hook_resid_post"),
                       [&](const at::Tensor& x) { return x + direction; }};
  const NextTokenPredictions want = ByHand(*f.model, kInterventionPrompt, &add);
  ExpectNear(r->steered.token_losses, Losses(want), 1e-4, "steered");
  const at::Tensor probs = at::softmax(want.last_logits[0], -1);
  ASSERT_EQ(r->steered.next.size(), 10u);
  EXPECT_EQ(r->steered.next[0].token_id, probs.argmax().item<int64_t>());
  EXPECT_NEAR(r->steered.next[0].probability, probs.max().item<float>(), 1e-5);
  // KL(clean || steered) by hand.
  const at::Tensor clean_lp = at::log_softmax(
      ByHand(*f.model, kInterventionPrompt, nullptr).last_logits[0].to(at::kDouble), -1);
  const at::Tensor steered_lp = at::log_softmax(want.last_logits[0].to(at::kDouble), -1);
  const double kl = (clean_lp.exp() * (clean_lp - steered_lp)).sum().item<double>();
  EXPECT_GT(kl, 1e-3);
  EXPECT_NEAR(r->kl_divergence, kl, 1e-4 * kl + 1e-7);
  // The listed changes are the largest probability changes, each with both probabilities.
  ASSERT_FALSE(r->most_increased.empty());
  ASSERT_FALSE(r->most_decreased.empty());
  const at::Tensor change = steered_lp.exp() - clean_lp.exp();
  EXPECT_EQ(r->most_increased[0].token_id, change.argmax().item<int64_t>());
  EXPECT_EQ(r->most_decreased[0].token_id, change.argmin().item<int64_t>());
  const int64_t up = r->most_increased[0].token_id;
  EXPECT_NEAR(r->most_increased[0].steered_probability - r->most_increased[0].clean_probability,
              change[up].item<double>(), 1e-5);
}

// SET 0 at one position removes exactly that latent's part of the SAE's reconstruction there:
// the positions before it do not change (causal), and the latent's values are reported.
TEST(SteeringTest, SettingALatentToZeroAtAPositionAblatesItThere) {
  Fixture f;
  const at::Tensor x = Activation("blocks.1.hook_resid_post", kInterventionPrompt);
  const at::Tensor z = f.sae.EncodeDense(x);
  const int64_t p = 4;
  const int64_t j = z[p].argmax().item<int64_t>();
  ASSERT_GT(z[p][j].item<float>(), 0);
  auto r = f.Steer(Query({{j, InterventionMode::kSet, 0.0f, {p}}}));
  ASSERT_TRUE(r.ok()) << r.status();
  const at::Tensor removed = f.sae.weights().W_dec[j] * z[p][j];
  const HookSplice ablate{*ParseHookName("blocks.1.hook_resid_post"), [&](const at::Tensor& a) {
                            at::Tensor out = a.clone();
                            out[0][p].sub_(removed);
                            return out;
                          }};
  ExpectNear(r->steered.token_losses, Losses(ByHand(*f.model, kInterventionPrompt, &ablate)), 1e-4,
             "ablated");
  for (int64_t s = 0; s < p; ++s) {
    EXPECT_NEAR(r->steered.token_losses[s], r->clean.token_losses[s], 1e-5) << s;
  }
  double moved = 0;
  for (size_t s = p; s < r->steered.token_losses.size(); ++s) {
    moved += std::abs(r->steered.token_losses[s] - r->clean.token_losses[s]);
  }
  EXPECT_GT(moved, 1e-4);
  ASSERT_EQ(r->latent_values.size(), 1u);
  EXPECT_EQ(r->latent_values[0].first, j);
  ASSERT_EQ(r->latent_values[0].second.size(), kInterventionPrompt.size());
  for (size_t s = 0; s < kInterventionPrompt.size(); ++s) {
    EXPECT_NEAR(r->latent_values[0].second[s], z[s][j].item<float>(), 1e-5) << s;
  }
}

// Interventions on one latent apply in order; SCALE multiplies the latent's own value.
TEST(SteeringTest, InterventionsComposeInOrder) {
  Fixture f;
  const at::Tensor x = Activation("blocks.1.hook_resid_post", kInterventionPrompt);
  const at::Tensor z = f.sae.EncodeDense(x);
  const int64_t j = z[2].argmax().item<int64_t>();
  // (z + 1) * 3 everywhere equals adding (2 z + 3) W_dec[j].
  auto r = f.Steer(
      Query({{j, InterventionMode::kAdd, 1.0f, {}}, {j, InterventionMode::kScale, 3.0f, {}}}));
  ASSERT_TRUE(r.ok()) << r.status();
  const at::Tensor added = (2 * z.select(1, j) + 3).unsqueeze(1) * f.sae.weights().W_dec[j];
  const HookSplice by_hand{*ParseHookName("blocks.1.hook_resid_post"),
                           [&](const at::Tensor& a) { return a + added.unsqueeze(0); }};
  ExpectNear(r->steered.token_losses, Losses(ByHand(*f.model, kInterventionPrompt, &by_hand)), 1e-4,
             "composed");
}

// Greedy continuation: each run takes its most likely next token, the steered one with the
// intervention at the generated positions too.
TEST(SteeringTest, GreedyGenerationContinuesEachRun) {
  Fixture f;
  const int64_t j = 30;
  const float value = 25;
  auto r = f.Steer(Query({{j, InterventionMode::kAdd, value, {}}}, 5));
  ASSERT_TRUE(r.ok()) << r.status();
  const at::Tensor direction = f.sae.weights().W_dec[j] * value;
  const HookSplice add{*ParseHookName("blocks.1.hook_resid_post"),
                       [&](const at::Tensor& x) { return x + direction; }};
  for (const bool steered : {false, true}) {
    std::vector<int64_t> ids = kInterventionPrompt;
    for (int t = 0; t < 5; ++t) {
      ids.push_back(
          ByHand(*f.model, ids, steered ? &add : nullptr).last_logits[0].argmax().item<int64_t>());
    }
    const std::vector<int64_t> want(ids.begin() + kInterventionPrompt.size(), ids.end());
    EXPECT_EQ(steered ? r->steered.generated : r->clean.generated, want) << steered;
  }
  EXPECT_NE(r->clean.generated, r->steered.generated);  // a strong push changes the text
}

// Sampling is a function of the seed, and both runs share its draws: an intervention that
// changes nothing samples the same continuation.
TEST(SteeringTest, SamplingSharesTheDrawsBetweenTheRuns) {
  Fixture f;
  std::set<std::vector<int64_t>> seen;
  for (uint64_t seed = 0; seed < 6; ++seed) {
    SteeringQuery q = Query({{9, InterventionMode::kScale, 1.0f, {}}}, 6);
    q.temperature = 2;
    q.seed = seed;
    auto a = f.Steer(q), b = f.Steer(q);
    ASSERT_TRUE(a.ok() && b.ok());
    EXPECT_EQ(a->clean.generated, b->clean.generated);
    EXPECT_EQ(a->clean.generated, a->steered.generated);
    seen.insert(a->clean.generated);
  }
  EXPECT_GT(seen.size(), 1u);  // other seeds, other samples
}

// A transcoder's latents are read at its input hook and written at its output hook.
TEST(SteeringTest, ATranscoderReadsItsInputAndWritesItsOutput) {
  const std::string in = "blocks.1.mlp.hook_in", out = "blocks.1.hook_mlp_out";
  auto model = InterventionModel(in);
  const Sae transcoder = InterventionSae(true);
  const SteeringModel steering{model.get(), &transcoder, *ParseHookName(in), *ParseHookName(out)};
  const at::Tensor z = transcoder.EncodeDense(Activation(in, kInterventionPrompt));
  const int64_t p = 3, j = z[p].argmax().item<int64_t>();
  ASSERT_GT(z[p][j].item<float>(), 0);
  auto r = SteerPrompt(
      steering, kInterventionPrompt, false,
      Query({{j, InterventionMode::kSet, 0.0f, {p}}, {j, InterventionMode::kAdd, 2.0f, {p + 2}}}),
      nullptr);
  ASSERT_TRUE(r.ok()) << r.status();
  const at::Tensor W = transcoder.weights().W_dec[j];
  const HookSplice by_hand{*ParseHookName(out), [&](const at::Tensor& a) {
                             at::Tensor o = a.clone();
                             o[0][p].sub_(W * z[p][j]);
                             o[0][p + 2].add_(W * 2.0f);
                             return o;
                           }};
  ExpectNear(r->steered.token_losses, Losses(ByHand(*model, kInterventionPrompt, &by_hand)), 1e-4,
             "transcoder");
  ASSERT_EQ(r->latent_values.size(), 1u);
  EXPECT_NEAR(r->latent_values[0].second[p], z[p][j].item<float>(), 1e-5);
}

// Layer 1 of a cross-layer transcoder: its latents are read at layer 1's input hook and written
// at the MLP output of layers 1 and 2, each through the decoder into that layer.
TEST(SteeringTest, ACrossLayerTranscodersLatentWritesEveryLaterLayer) {
  const InterventionCltLayer1 clt = LoadInterventionCltLayer1();
  ASSERT_TRUE(clt.sae.has_value());
  const std::string& dir = clt.dir;
  Gpt2Model* model = clt.model.get();
  SteeringModel steering = clt.steering();
  const at::Tensor z = clt.sae->EncodeDense(Activation(kInterventionCltInput, kInterventionPrompt));
  const int64_t p = 3, j = z[p].argmax().item<int64_t>();
  ASSERT_GT(z[p][j].item<float>(), 0);
  const SteeringQuery q =
      Query({{j, InterventionMode::kSet, 0.0f, {p}}, {j, InterventionMode::kAdd, 2.0f, {p + 2}}});
  auto r = SteerPrompt(steering, kInterventionPrompt, false, q, nullptr);
  ASSERT_TRUE(r.ok()) << r.status();
  HookSplices by_hand;
  for (int to = 1; to <= 2; ++to) {
    auto decoder = LoadCrossLayerDecoder(dir, 1, to);
    ASSERT_TRUE(decoder.ok()) << decoder.status();
    const at::Tensor W = (*decoder)[j];
    by_hand.push_back({*ParseHookName("blocks." + std::to_string(to) + ".hook_mlp_out"),
                       [W, z, p, j](const at::Tensor& a) {
                         at::Tensor o = a.clone();
                         o[0][p].sub_(W * z[p][j]);
                         o[0][p + 2].add_(W * 2.0f);
                         return o;
                       }});
  }
  const std::vector<float> want = Losses(ByHand(*model, kInterventionPrompt, by_hand));
  ExpectNear(r->steered.token_losses, want, 1e-4, "cross-layer");
  EXPECT_NEAR(r->latent_values[0].second[p], z[p][j].item<float>(), 1e-5);
  // Layer 1's own decoder alone (the release's later decoders left out) steers otherwise.
  steering.cross_layer_dir.clear();
  auto own_layer = SteerPrompt(steering, kInterventionPrompt, false, q, nullptr);
  ASSERT_TRUE(own_layer.ok()) << own_layer.status();
  float largest = 0;
  for (size_t s = 0; s < want.size(); ++s) {
    largest = std::max(largest, std::abs(own_layer->steered.token_losses[s] - want[s]));
  }
  EXPECT_GT(largest, 1e-3);
}

// A crosscoder over blocks 1 and 0 (in that order of its blocks): its latents are encoded from
// both hooks' clean activations, and each block of the decoder writes its own hook. SET and ADD
// at prompt positions equal the hand-made edit at both hooks, through the generated tokens too;
// ADD everywhere reaches the generated tokens; SCALE by 1 everywhere, which reads each
// generated token's latents in a pass before the steered one, leaves the clean run.
TEST(SteeringTest, ACrosscodersLatentIsReadFromEverySourceAndWritesEachOfThem) {
  const std::unique_ptr<Gpt2Model> model = InterventionModel("blocks.1.hook_resid_post");
  const Sae crosscoder = InterventionCrosscoder();
  SteeringModel steering{model.get(), &crosscoder, *ParseHookName(kInterventionCrosscoder[0])};
  for (const std::string& hook : kInterventionCrosscoder) {
    steering.crosscoder_sources.push_back(*ParseHookName(hook));
  }
  at::Tensor z;
  {
    at::NoGradGuard no_grad;
    const std::vector<at::Tensor> read =
        model->ForwardSpliced(Row(kInterventionPrompt), steering.crosscoder_sources, {});
    z = crosscoder.EncodeDense(at::cat({read[0][0], read[1][0]}, 1));
  }
  const int64_t p = 2, j = z[p].argmax().item<int64_t>();
  ASSERT_GT(z[p][j].item<float>(), 0);
  const at::Tensor row = crosscoder.weights().W_dec[j];  // [2 x width]: block 0, block 1
  auto edits = [&](float at_p, float at_p2) {
    HookSplices splices;
    for (int64_t block = 0; block < 2; ++block) {
      const at::Tensor w = row.narrow(0, block * kInterventionWidth, kInterventionWidth);
      splices.push_back({steering.crosscoder_sources[block], [=](const at::Tensor& a) {
                           at::Tensor o = a.clone();
                           o[0][p].add_(w * at_p);
                           o[0][p + 2].add_(w * at_p2);
                           return o;
                         }});
    }
    return splices;
  };
  const SteeringQuery q = Query(
      {{j, InterventionMode::kSet, 0.0f, {p}}, {j, InterventionMode::kAdd, 3.0f, {p + 2}}}, 4);
  auto r = SteerPrompt(steering, kInterventionPrompt, false, q, nullptr);
  ASSERT_TRUE(r.ok()) << r.status();
  const HookSplices by_hand = edits(-z[p][j].item<float>(), 3.0f);
  ExpectNear(r->steered.token_losses, Losses(ByHand(*model, kInterventionPrompt, by_hand)), 1e-4,
             "crosscoder");
  ASSERT_EQ(r->latent_values.size(), 1u);
  for (size_t s = 0; s < kInterventionPrompt.size(); ++s) {
    EXPECT_NEAR(r->latent_values[0].second[s], z[s][j].item<float>(), 1e-5) << s;
  }
  std::vector<int64_t> ids = kInterventionPrompt;
  for (int t = 0; t < 4; ++t) {
    ids.push_back(ByHand(*model, ids, by_hand).last_logits[0].argmax().item<int64_t>());
  }
  EXPECT_EQ(r->steered.generated, std::vector<int64_t>(ids.end() - 4, ids.end()));
  // Written at the first source alone (block 0's hook) the run is another.
  const HookSplices first_only = {by_hand[0]};
  float largest = 0;
  const std::vector<float> other = Losses(ByHand(*model, kInterventionPrompt, first_only));
  for (size_t s = 0; s < other.size(); ++s) {
    largest = std::max(largest, std::abs(r->steered.token_losses[s] - other[s]));
  }
  EXPECT_GT(largest, 1e-3);

  // ADD at every position, generated ones included.
  auto added = SteerPrompt(steering, kInterventionPrompt, false,
                           Query({{j, InterventionMode::kAdd, 20.0f, {}}}, 4), nullptr);
  ASSERT_TRUE(added.ok()) << added.status();
  HookSplices everywhere;
  for (int64_t block = 0; block < 2; ++block) {
    const at::Tensor w = row.narrow(0, block * kInterventionWidth, kInterventionWidth) * 20.0f;
    everywhere.push_back(
        {steering.crosscoder_sources[block], [=](const at::Tensor& a) { return a + w; }});
  }
  ids = kInterventionPrompt;
  for (int t = 0; t < 4; ++t) {
    ids.push_back(ByHand(*model, ids, everywhere).last_logits[0].argmax().item<int64_t>());
  }
  EXPECT_EQ(added->steered.generated, std::vector<int64_t>(ids.end() - 4, ids.end()));

  auto unchanged = SteerPrompt(steering, kInterventionPrompt, false,
                               Query({{j, InterventionMode::kScale, 1.0f, {}}}, 4), nullptr);
  ASSERT_TRUE(unchanged.ok()) << unchanged.status();
  ExpectNear(unchanged->steered.token_losses, unchanged->clean.token_losses, 1e-5, "scale 1");
  EXPECT_EQ(unchanged->steered.generated, unchanged->clean.generated);
  EXPECT_NEAR(unchanged->kl_divergence, 0, 1e-9);
}

// A crosscoder over two models (model diffing) steers the one that runs, source 1 here, alone
// (the other model not given to run beside it): ADD writes the value times block 1 of the
// latent's decoder row at that model's hook, at every position or the named ones, through the
// generated tokens; nothing is written for the other source, no clean values are given, and
// SET / SCALE are refused.
TEST(SteeringTest, ACrosscoderOverModelsSteersTheRunningModelByItsBlockOfTheDecoder) {
  const std::unique_ptr<Gpt2Model> model = InterventionModel("blocks.1.hook_resid_post");
  const Sae crosscoder = InterventionCrosscoder();
  const HookName hook = *ParseHookName(kInterventionCrosscoder[1]);
  SteeringModel steering{model.get(), &crosscoder, hook};
  steering.diffed_source = 1;
  const int64_t j = 3;
  const at::Tensor block =
      crosscoder.weights().W_dec[j].narrow(0, kInterventionWidth, kInterventionWidth);
  auto r = SteerPrompt(steering, kInterventionPrompt, false,
                       Query({{j, InterventionMode::kAdd, 20.0f, {}}}, 4), nullptr);
  ASSERT_TRUE(r.ok()) << r.status();
  const HookSplices everywhere = {{hook, [=](const at::Tensor& a) { return a + block * 20.0f; }}};
  ExpectNear(r->steered.token_losses, Losses(ByHand(*model, kInterventionPrompt, everywhere)), 1e-4,
             "added everywhere");
  std::vector<int64_t> ids = kInterventionPrompt;
  for (int t = 0; t < 4; ++t) {
    ids.push_back(ByHand(*model, ids, everywhere).last_logits[0].argmax().item<int64_t>());
  }
  EXPECT_EQ(r->steered.generated, std::vector<int64_t>(ids.end() - 4, ids.end()));
  ExpectNear(r->clean.token_losses, Losses(ByHand(*model, kInterventionPrompt, nullptr)), 1e-5,
             "clean");
  EXPECT_GT(r->kl_divergence, 0);
  EXPECT_TRUE(r->latent_values.empty());

  const int64_t p = 2;
  auto at_p = SteerPrompt(steering, kInterventionPrompt, false,
                          Query({{j, InterventionMode::kAdd, -7.0f, {p}}}), nullptr);
  ASSERT_TRUE(at_p.ok()) << at_p.status();
  const HookSplices there = {{hook, [=](const at::Tensor& a) {
                                at::Tensor o = a.clone();
                                o[0][p].add_(block * -7.0f);
                                return o;
                              }}};
  ExpectNear(at_p->steered.token_losses, Losses(ByHand(*model, kInterventionPrompt, there)), 1e-4,
             "added at one position");

  for (const InterventionMode mode : {InterventionMode::kSet, InterventionMode::kScale}) {
    auto refused =
        SteerPrompt(steering, kInterventionPrompt, false,
                    Query({{j, InterventionMode::kAdd, 1.0f, {}}, {j, mode, 0.0f, {}}}), nullptr);
    EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(refused.status().message().find("interventions[1].mode: a crosscoder over several "
                                              "models' activations is steered by ADD only"),
              std::string::npos)
        << refused.status();
  }
}

// With the other model beside it (source 0: the reference model of another seed), a crosscoder
// over models steers by any mode: a latent's value is the crosscoder's encoding of both models'
// activations at the token, SET 0 takes it out of the steered model (x - z_j * block 1) and
// SCALE 3 adds it twice more, at every position and through the generated tokens (each run's
// tokens fed to the other model too); latent_values gives z_j. A model beside it that cannot
// read what the steered one generates (a smaller vocabulary) leaves it steered by ADD alone.
TEST(SteeringTest, ACrosscoderOverModelsWithTheOthersBesideSetsItsLatentsValue) {
  const std::string hook_name = kInterventionCrosscoder[0];
  const HookName hook = *ParseHookName(hook_name);
  const std::unique_ptr<Gpt2Model> steered = InterventionModel(hook_name);
  const std::unique_ptr<ActivationModel> other = InterventionModel(hook_name, 6);
  const Sae crosscoder = InterventionCrosscoder();
  SteeringModel steering{steered.get(), &crosscoder, hook};
  steering.diffed_source = 1;
  steering.diffed_models = {{other.get(), hook}, {steered.get(), hook}};
  // Every latent's value at each position of `ids`, from both models' clean activations.
  auto values = [&](const std::vector<int64_t>& ids) {
    at::NoGradGuard no_grad;
    return crosscoder.EncodeDense(
        at::cat({other->Forward(Row(ids))[0], steered->Forward(Row(ids))[0]}, 1));
  };
  // The latent that fires at the most prompt positions.
  const at::Tensor z = values(kInterventionPrompt);
  const int64_t j = (z > 0).sum(0).argmax().item<int64_t>();
  ASSERT_GE((z.select(1, j) > 0).sum().item<int64_t>(), 2);
  const at::Tensor block =
      crosscoder.weights().W_dec[j].narrow(0, kInterventionWidth, kInterventionWidth);
  for (const auto& mode_value :
       {std::pair{InterventionMode::kSet, 0.0f}, std::pair{InterventionMode::kScale, 3.0f}}) {
    const InterventionMode mode = mode_value.first;
    const float value = mode_value.second;
    const std::string what = mode == InterventionMode::kSet ? "set 0" : "scale 3";
    auto r = SteerPrompt(steering, kInterventionPrompt, false, Query({{j, mode, value, {}}}, 4),
                         nullptr);
    ASSERT_TRUE(r.ok()) << r.status();
    // By hand: each position's z_j changed to value (or times it) along block 1.
    auto splices = [&](const std::vector<int64_t>& ids) {
      const at::Tensor zj = values(ids).select(1, j);
      const at::Tensor change = (mode == InterventionMode::kSet ? value - zj : zj * (value - 1));
      const at::Tensor add = change.unsqueeze(1) * block.unsqueeze(0);  // [n, width]
      return HookSplices{{hook, [add](const at::Tensor& a) { return a + add.unsqueeze(0); }}};
    };
    ExpectNear(r->steered.token_losses,
               Losses(ByHand(*steered, kInterventionPrompt, splices(kInterventionPrompt))), 1e-4,
               what);
    std::vector<int64_t> ids = kInterventionPrompt;
    for (int t = 0; t < 4; ++t) {
      ids.push_back(ByHand(*steered, ids, splices(ids)).last_logits[0].argmax().item<int64_t>());
    }
    EXPECT_EQ(r->steered.generated, std::vector<int64_t>(ids.end() - 4, ids.end())) << what;
    EXPECT_GT(r->kl_divergence, 0) << what;
    ASSERT_EQ(r->latent_values.size(), 1u);
    EXPECT_EQ(r->latent_values[0].first, j);
    for (size_t p = 0; p < kInterventionPrompt.size(); ++p) {
      EXPECT_NEAR(r->latent_values[0].second[p], z[p][j].item<float>(), 1e-4) << p;
    }
  }

  const std::unique_ptr<ActivationModel> narrower = InterventionModel(hook_name, 6, 99);
  steering.diffed_models[0].model = narrower.get();
  auto refused = SteerPrompt(steering, kInterventionPrompt, false,
                             Query({{j, InterventionMode::kSet, 0.0f, {}}}, 2), nullptr);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(refused.status().message().find("source 0's model reads token ids below 99, and the "
                                            "steered model may generate any below 100"),
            std::string::npos)
      << refused.status();
  auto added = SteerPrompt(steering, kInterventionPrompt, false,
                           Query({{j, InterventionMode::kAdd, 5.0f, {}}}, 2), nullptr);
  ASSERT_TRUE(added.ok()) << added.status();
  EXPECT_TRUE(added->latent_values.empty());
}

// Latents of a second SAE (block 0's) change in the same steered runs: both ADDs are the hand-
// made additions at both hooks, through the generated tokens; a bad one is named.
TEST(SteeringTest, AnotherSaesInterventionsJoinTheSteeredRuns) {
  Fixture f;
  const std::string early = "blocks.0.hook_resid_post";
  const std::vector<MoreInterventions> more = {
      {{f.model.get(), &f.sae, *ParseHookName(early), std::nullopt},
       {{9, InterventionMode::kAdd, 4.0f, {}}}}};
  const SteeringQuery q = Query({{17, InterventionMode::kAdd, 6.0f, {}}}, 3);
  auto r = SteerPrompt(f.steering(), kInterventionPrompt, false, q, nullptr, more);
  ASSERT_TRUE(r.ok()) << r.status();
  const at::Tensor late = f.sae.weights().W_dec[17] * 6.0f;
  const at::Tensor first = f.sae.weights().W_dec[9] * 4.0f;
  const HookSplices both = {
      {*ParseHookName(early), [&](const at::Tensor& x) { return x + first; }},
      {*ParseHookName("blocks.1.hook_resid_post"), [&](const at::Tensor& x) { return x + late; }}};
  ExpectNear(r->steered.token_losses, Losses(ByHand(*f.model, kInterventionPrompt, both)), 1e-4,
             "both hooks");
  std::vector<int64_t> ids = kInterventionPrompt;
  for (int t = 0; t < 3; ++t) {
    ids.push_back(ByHand(*f.model, ids, both).last_logits[0].argmax().item<int64_t>());
  }
  EXPECT_EQ(r->steered.generated, std::vector<int64_t>(ids.end() - 3, ids.end()));
  // Without the second SAE's change the run is another.
  auto alone = f.Steer(q);
  ASSERT_TRUE(alone.ok()) << alone.status();
  EXPECT_NE(alone->steered.token_losses, r->steered.token_losses);
  std::vector<MoreInterventions> bad = more;
  bad[0].interventions[0].latent = kInterventionLatents;
  auto refused = SteerPrompt(f.steering(), kInterventionPrompt, false, q, nullptr, bad);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(refused.status().message().find("more_interventions[0].interventions[0].latent"),
            std::string::npos)
      << refused.status();
}

// A sweep adds a steered run per value of interventions[0] to the batch (the other
// interventions as given): each run is the one a query of that value alone gives.
TEST(SteeringTest, ASweepRunsEachValueOfTheFirstIntervention) {
  Fixture f;
  const LatentIntervention ablate{11, InterventionMode::kSet, 0.0f, {2}};
  SteeringQuery q = Query({{30, InterventionMode::kAdd, 6.0f, {}}, ablate}, 4);
  q.sweep = {0.0f, 6.0f, 20.0f};
  auto swept = f.Steer(q);
  ASSERT_TRUE(swept.ok()) << swept.status();
  ASSERT_EQ(swept->sweep.size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    SteeringQuery alone = Query({{30, InterventionMode::kAdd, q.sweep[i], {}}, ablate}, 4);
    auto want = f.Steer(alone);
    ASSERT_TRUE(want.ok());
    const SweptRun& run = swept->sweep[i];
    EXPECT_EQ(run.value, q.sweep[i]);
    ExpectNear(run.run.token_losses, want->steered.token_losses, 1e-4, "sweep value");
    EXPECT_EQ(run.run.generated, want->steered.generated) << q.sweep[i];
    EXPECT_NEAR(run.kl_divergence, want->kl_divergence, 1e-4 * want->kl_divergence + 1e-7);
    EXPECT_EQ(run.run.next[0].token_id, want->steered.next[0].token_id);
  }
  // The value the query gives is the steered run itself.
  ExpectNear(swept->sweep[1].run.token_losses, swept->steered.token_losses, 1e-5, "given");
  EXPECT_EQ(swept->sweep[1].run.generated, swept->steered.generated);
  EXPECT_GT(swept->sweep[2].kl_divergence, swept->sweep[0].kl_divergence);
  ExpectNear(swept->clean.token_losses, Losses(ByHand(*f.model, kInterventionPrompt, nullptr)),
             1e-5, "clean");
}

TEST(SteeringTest, BadQueriesNameTheirField) {
  Fixture f;
  auto refused = [&](SteeringQuery q, const std::string& field) {
    auto r = f.Steer(q);
    ASSERT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << field << r.status();
    EXPECT_NE(r.status().message().find(field), std::string::npos) << r.status();
  };
  refused(Query({}), "interventions");
  refused(Query(std::vector<LatentIntervention>(65, {1, InterventionMode::kSet, 0, {}})),
          "interventions");
  refused(Query({{kInterventionLatents, InterventionMode::kSet, 0, {}}}),
          "interventions[0].latent");
  refused(Query({{1, InterventionMode::kSet, 0, {}}, {-1, InterventionMode::kSet, 0, {}}}),
          "interventions[1].latent");
  refused(Query({{1, InterventionMode::kAdd, std::numeric_limits<float>::infinity(), {}}}),
          "interventions[0].value");
  refused(Query({{1, InterventionMode::kAdd, std::nanf(""), {}}}), "interventions[0].value");
  refused(Query({{1, InterventionMode::kSet, 0, {0, 8}}}), "interventions[0].positions[1]");
  refused(Query({{1, InterventionMode::kSet, 0, {}}}, -1), "new_tokens");
  // 8 prompt tokens + 9 pass the reference model's context of 16.
  refused(Query({{1, InterventionMode::kSet, 0, {}}}, 9), "new_tokens");
  EXPECT_TRUE(f.Steer(Query({{1, InterventionMode::kSet, 0, {}}}, 8)).ok());
  SteeringQuery q = Query({{1, InterventionMode::kSet, 0, {}}});
  q.temperature = -1;
  refused(q, "temperature");
  q.temperature = std::numeric_limits<float>::infinity();
  refused(q, "temperature");
  q = Query({{1, InterventionMode::kSet, 0, {}}});
  q.sweep.assign(17, 1.0f);
  refused(q, "sweep");
  q.sweep = {1.0f, std::nanf("")};
  refused(q, "sweep[1]");
  q = Query({{1, InterventionMode::kSet, 0, {}}});
  q.top_tokens = 1001;
  refused(q, "top_tokens");
  q.top_tokens = 3;
  auto r = f.Steer(q);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->clean.next.size(), 3u);
  EXPECT_LE(r->most_increased.size(), 3u);
}

TEST(SteeringTest, CancelledBetweenTokens) {
  Fixture f;
  int asked = 0;
  auto r =
      SteerPrompt(f.steering(), kInterventionPrompt, false,
                  Query({{1, InterventionMode::kAdd, 1, {}}}, 6), [&asked] { return ++asked > 2; });
  EXPECT_EQ(r.status().code(), absl::StatusCode::kCancelled);
  EXPECT_NE(r.status().message().find("after 2 of 6"), std::string::npos) << r.status();
}

// A model that gives hidden states only (TorchScript) cannot be steered to logits.
class HiddenStatesOnly : public ActivationModel {
 public:
  at::Tensor Forward(const at::Tensor& tokens) override {
    return at::zeros({tokens.size(0), tokens.size(1), kInterventionWidth});
  }
  int64_t hook_width() const override { return kInterventionWidth; }
  int64_t vocab_size() const override { return 100; }
  int64_t max_context() const override { return 0; }
  int64_t parameter_bytes() const override { return 0; }
  int64_t activation_bytes_per_token(int64_t) const override { return 0; }
  const std::string& model_id() const override { return id_; }
  const std::string& weight_hash() const override { return id_; }

 private:
  std::string id_ = "hidden";
};

TEST(SteeringTest, AModelWithoutLogitsIsAFailedPrecondition) {
  HiddenStatesOnly model;
  const Sae sae = InterventionSae(false);
  auto r =
      SteerPrompt({&model, &sae, *ParseHookName("hidden_states.1"), std::nullopt},
                  kInterventionPrompt, false, Query({{1, InterventionMode::kSet, 0, {}}}), nullptr);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(r.status().message().find("hidden states"), std::string::npos) << r.status();
}

}  // namespace
}  // namespace latentd::engine
