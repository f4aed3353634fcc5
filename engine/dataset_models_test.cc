#include "engine/dataset_models.h"

#include <sys/stat.h>
#include <torch/script.h>

#include <fstream>
#include <map>
#include <set>

#include "common/safetensors.h"
#include "common/test_dir.h"
#include "engine/crosscoder_model.h"
#include "engine/hf_gpt2.h"
#include "engine/hf_model.h"
#include "engine/hf_testing.h"
#include "engine/reference_model.h"
#include "engine/sae.h"
#include "engine/torchscript_model.h"
#include "gtest/gtest.h"

namespace latentd::engine {
namespace {

constexpr int64_t kDSae = 12;

// A reference model small enough to draw in milliseconds.
latentd::v1::ReferenceModelSpec SmallModel() {
  latentd::v1::ReferenceModelSpec m;
  m.set_d_model(16);
  m.set_n_layers(2);
  m.set_n_heads(2);
  m.set_d_mlp(32);
  m.set_vocab_size(64);
  m.set_context_length(8);
  m.set_seed(3);
  return m;
}

// Steering `latent` of `source` by adding 2 at every position of the prompt {4, 8, 15, 16}
// gives the losses of SmallModel's own run with `adds` spliced in by hand, and moves the next
// token's distribution.
void ExpectAddingTwoSteers(DatasetModels& models, const DatasetSource& source, int64_t latent,
                           const HookSplices& adds, const std::string& what) {
  SteeringQuery steer;
  steer.token_ids = {4, 8, 15, 16};
  steer.interventions = {{latent, InterventionMode::kAdd, 2.0f, {}}};
  auto steered = models.SteerPrompt(source, steer, nullptr);
  ASSERT_TRUE(steered.ok()) << what << ": " << steered.status();
  auto model = CreateReferenceModel(SmallModel(), *ParseHookName("blocks.1.hook_resid_post"),
                                    at::Device(at::kCPU));
  ASSERT_TRUE(model.ok());
  at::NoGradGuard no_grad;
  const at::Tensor want =
      (*model)
          ->PredictNextTokens(
              at::tensor(steer.token_ids, at::TensorOptions().dtype(at::kLong)).view({1, -1}), adds,
              true)
          .losses[0];
  ASSERT_EQ(steered->steered.token_losses.size(), 3u) << what;
  for (int64_t p = 0; p < 3; ++p) {
    EXPECT_NEAR(steered->steered.token_losses[p], want[p].item<float>(), 1e-4) << what << " " << p;
  }
  EXPECT_GT(steered->kl_divergence, 0) << what;
}

// Random weights, with latent 1's decoder direction close to latent 0's and latent 2's opposite
// to it, so the nearest neighbour of 0 is known.
SaeWeights MakeWeights(int64_t d_in, uint64_t seed) {
  at::manual_seed(seed);
  SaeWeights w;
  w.W_enc = at::randn({d_in, kDSae});
  w.b_enc = at::zeros({kDSae});
  w.W_dec = at::randn({kDSae, d_in});
  w.W_dec[1] = w.W_dec[0] * 3 + 0.05 * at::randn({d_in});
  w.W_dec[2] = -w.W_dec[0];
  w.b_dec = at::zeros({d_in});
  return w;
}

std::string WriteSae(const std::string& dir, const SaeWeights& w) {
  SaeConfig cfg;
  cfg.d_in = w.W_dec.size(1);
  cfg.d_sae = kDSae;
  cfg.architecture = SaeArchitecture::kTopK;
  cfg.k = 4;
  EXPECT_TRUE(SaveSae(dir, w, cfg).ok());
  auto sae = Sae::Load(dir);
  EXPECT_TRUE(sae.ok()) << sae.status();
  return sae.ok() ? sae->weight_hash() : "";
}

double Cosine(const at::Tensor& a, const at::Tensor& b) {
  at::Tensor x = a.to(at::kDouble), y = b.to(at::kDouble);
  return (x.dot(y) / (x.norm() * y.norm())).item<double>();
}

class DatasetModelsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = FreshTestDir("dataset_models");
    env_.data_roots = {root_};
    env_.find_job = [this](uint64_t id) -> absl::StatusOr<latentd::v1::Job> {
      auto it = jobs_.find(id);
      if (it == jobs_.end()) return absl::NotFoundError("no such job");
      return it->second;
    };
  }

  // Records an EXTRACT job of the reference model with the SAE in `sae_dir`.
  void AddReferenceJob(uint64_t id, const std::string& hook, const std::string& sae_dir) {
    latentd::v1::Job job;
    job.set_id(id);
    latentd::v1::ExtractSpec* spec = job.mutable_spec()->mutable_extract();
    *spec->mutable_model()->mutable_reference() = SmallModel();
    spec->set_hook_name(hook);
    spec->mutable_sae()->set_path(sae_dir);
    jobs_[id] = job;
  }

  // Records an EXTRACT job of the Hugging Face GPT-2 checkpoint in `model_dir`.
  void AddHuggingFaceJob(uint64_t id, const std::string& model_dir, const std::string& hook,
                         const std::string& sae_dir) {
    latentd::v1::Job job;
    job.set_id(id);
    latentd::v1::ExtractSpec* spec = job.mutable_spec()->mutable_extract();
    spec->mutable_model()->mutable_huggingface()->set_path(model_dir);
    spec->set_hook_name(hook);
    spec->mutable_sae()->set_path(sae_dir);
    jobs_[id] = job;
  }

  // Records an EXTRACT job of a Hugging Face Llama checkpoint run in `dtype`.
  void AddLlamaJob(uint64_t id, const std::string& model_dir, const std::string& hook,
                   const std::string& sae_dir, latentd::v1::ValueDtype dtype) {
    AddHuggingFaceJob(id, model_dir, hook, sae_dir);
    jobs_[id].mutable_spec()->mutable_extract()->mutable_model()->mutable_huggingface()->set_dtype(
        dtype);
  }

  void AddTorchScriptJob(uint64_t id, const std::string& model_path, const std::string& sae_dir) {
    latentd::v1::Job job;
    job.set_id(id);
    latentd::v1::ExtractSpec* spec = job.mutable_spec()->mutable_extract();
    spec->mutable_model()->mutable_torchscript()->set_path(model_path);
    spec->set_hook_name("hidden_states.2");
    spec->mutable_sae()->set_path(sae_dir);
    jobs_[id] = job;
  }

  std::string ReferenceHash(const std::string& hook) {
    auto model = CreateReferenceModel(SmallModel(), *ParseHookName(hook), at::Device(at::kCPU));
    EXPECT_TRUE(model.ok());
    return (*model)->weight_hash();
  }

  at::Tensor ReferenceWeight(const std::string& name) {
    auto model = CreateReferenceModel(SmallModel(), *ParseHookName("blocks.1.hook_resid_post"),
                                      at::Device(at::kCPU));
    for (const auto& [n, t] : (*model)->NamedWeights()) {
      if (n == name) return t;
    }
    ADD_FAILURE() << "no weight " << name;
    return at::Tensor();
  }

  // An SAE `width` wide at `hook` of the reference model's block 1, whose directions reach the
  // logits through `projection` (then the tied embedding): latent 3's logit table is exactly
  // that.
  void ExpectLogitsThroughProjection(const std::string& hook, int64_t width,
                                     const std::string& projection);

  std::string root_;
  ExtractEnv env_;
  std::map<uint64_t, latentd::v1::Job> jobs_;
};

// The logits the reader returns are the largest / smallest of `expected`, in order, with their
// values.
void ExpectLogitTables(const std::vector<ScoredIndex>& positive,
                       const std::vector<ScoredIndex>& negative, const at::Tensor& expected,
                       int64_t n) {
  ASSERT_EQ(static_cast<int64_t>(positive.size()), n);
  ASSERT_EQ(static_cast<int64_t>(negative.size()), n);
  auto top = at::topk(expected, n);
  auto bottom = at::topk(-expected, n);
  for (int64_t r = 0; r < n; ++r) {
    EXPECT_NEAR(positive[r].score, std::get<0>(top)[r].item<double>(), 1e-4);
    EXPECT_NEAR(positive[r].score, expected[positive[r].index].item<double>(), 1e-4);
    EXPECT_NEAR(negative[r].score, -std::get<0>(bottom)[r].item<double>(), 1e-4);
    EXPECT_NEAR(negative[r].score, expected[negative[r].index].item<double>(), 1e-4);
  }
}

void ExpectLogits(const LatentWeights& got, const at::Tensor& expected, int64_t n) {
  ExpectLogitTables(got.positive_logits, got.negative_logits, expected, n);
}

TEST_F(DatasetModelsTest, NeighboursAndLogitsOfAResidualStreamSae) {
  const std::string dir = root_ + "/sae";
  const SaeWeights w = MakeWeights(16, 1);
  const std::string hash = WriteSae(dir, w);
  AddReferenceJob(7, "blocks.1.hook_resid_post", dir);
  DatasetModels reader(env_);
  DatasetSource source{1, 7, hash, ReferenceHash("blocks.1.hook_resid_post"), kDSae};

  LatentWeightsQuery q;
  q.latent = 0;
  q.top_n = 5;
  auto got = reader.ReadLatentWeights(source, q);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_NEAR(got->decoder_norm, w.W_dec[0].norm().item<double>(), 1e-4);
  EXPECT_NEAR(got->encoder_norm, w.W_enc.select(1, 0).norm().item<double>(), 1e-4);
  EXPECT_NEAR(got->encoder_decoder_cosine, Cosine(w.W_enc.select(1, 0), w.W_dec[0]), 1e-5);
  ASSERT_EQ(got->neighbors.size(), 5u);
  EXPECT_EQ(got->neighbors[0].index, 1);  // the near copy; 2 (opposite) is the farthest
  for (size_t r = 0; r < got->neighbors.size(); ++r) {
    const ScoredIndex& n = got->neighbors[r];
    EXPECT_NE(n.index, 0);
    EXPECT_NE(n.index, 2);
    EXPECT_NEAR(n.score, Cosine(w.W_dec[n.index], w.W_dec[0]), 1e-5);
    if (r > 0) {
      EXPECT_GE(got->neighbors[r - 1].score, n.score);
    }
  }
  // Every latent not listed is no nearer than the last one listed.
  std::set<int64_t> listed;
  for (const ScoredIndex& n : got->neighbors) listed.insert(n.index);
  for (int64_t j = 1; j < kDSae; ++j) {
    if (listed.count(j) == 0) {
      EXPECT_LE(Cosine(w.W_dec[j], w.W_dec[0]), got->neighbors.back().score + 1e-6);
    }
  }
  EXPECT_EQ(got->logits_source, "embed.W_E (tied)");
  EXPECT_EQ(got->logits_unavailable, "");
  const at::Tensor W_E = ReferenceWeight("embed.W_E").to(at::kDouble);
  ExpectLogits(*got, W_E.mv(w.W_dec[0].to(at::kDouble)), 5);
  EXPECT_TRUE(got->decoder.empty());  // only when asked
  // The decoder row itself, when asked: W_dec[j].
  q.latent = 3;
  q.decoder = true;
  got = reader.ReadLatentWeights(source, q);
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_EQ(static_cast<int64_t>(got->decoder.size()), w.W_dec.size(1));
  for (int64_t k = 0; k < w.W_dec.size(1); ++k) {
    EXPECT_NEAR(got->decoder[k], w.W_dec[3][k].item<float>(), 1e-6) << k;
  }
  q.latent = 0;
  q.decoder = false;

  // The default top_n is 10; at most d_sae - 1 neighbours exist.
  q.top_n = 0;
  got = reader.ReadLatentWeights(source, q);
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(got->neighbors.size(), 10u);
  EXPECT_EQ(got->positive_logits.size(), 10u);
  q.top_n = 1000;
  got = reader.ReadLatentWeights(source, q);
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(got->neighbors.size(), static_cast<size_t>(kDSae - 1));
  EXPECT_EQ(got->positive_logits.size(), 64u);  // the whole vocabulary
  EXPECT_EQ(got->neighbors.back().index, 2);    // the opposite direction, cosine -1
  EXPECT_NEAR(got->neighbors.back().score, -1.0, 1e-5);
  EXPECT_GT(reader.cached_bytes(), 0);
}

void DatasetModelsTest::ExpectLogitsThroughProjection(const std::string& hook, int64_t width,
                                                      const std::string& projection) {
  const std::string dir = root_ + "/sae_" + hook;
  const SaeWeights w = MakeWeights(width, 2);
  const std::string hash = WriteSae(dir, w);
  AddReferenceJob(8, hook, dir);
  DatasetModels reader(env_);
  LatentWeightsQuery q;
  q.latent = 3;
  q.top_n = 4;
  auto got = reader.ReadLatentWeights({2, 8, hash, ReferenceHash(hook), kDSae}, q);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->logits_source, projection + " then embed.W_E (tied)");
  const at::Tensor W_E = ReferenceWeight("embed.W_E").to(at::kDouble);
  const at::Tensor W_out = ReferenceWeight(projection).to(at::kDouble);
  ExpectLogits(*got, W_E.mv(W_out.t().mv(w.W_dec[3].to(at::kDouble))), 4);
}

TEST_F(DatasetModelsTest, MlpPostDirectionsGoThroughTheBlocksOutputProjection) {
  ExpectLogitsThroughProjection("blocks.1.mlp.hook_post", 32, "blocks.1.mlp.W_out");  // d_mlp
}

// attn.hook_z is the attention's heads before W_O: a direction there reaches the logits through
// the block's W_O (TransformerLens' hook_z SAEs, Kissane et al.).
TEST_F(DatasetModelsTest, AttentionZDirectionsGoThroughTheBlocksW_O) {
  ExpectLogitsThroughProjection("blocks.1.attn.hook_z", 16, "blocks.1.attn.W_O");  // heads x d_head
}

// A transcoder's decoder writes another hook than its encoder reads: here the MLP's normed input
// (16 wide) predicting mlp.hook_post (32 wide), so its directions reach the logits through W_out
// as an mlp.hook_post SAE's do, and no encoder-decoder angle is reported.
TEST_F(DatasetModelsTest, ATranscodersDirectionsAreUnembeddedFromTheHookItPredicts) {
  const std::string dir = root_ + "/transcoder";
  SaeWeights w = MakeWeights(32, 4);
  w.W_enc = at::randn({16, kDSae});
  SaeConfig cfg;
  cfg.d_in = 16;
  cfg.d_sae = kDSae;
  cfg.architecture = SaeArchitecture::kTopK;
  cfg.k = 4;
  cfg.apply_b_dec_to_input = false;
  cfg.transcoder = true;
  cfg.d_out = 32;
  cfg.hook_name_out = "blocks.1.mlp.hook_post";
  ASSERT_TRUE(SaveSae(dir, w, cfg).ok());
  auto sae = Sae::Load(dir);
  ASSERT_TRUE(sae.ok()) << sae.status();
  AddReferenceJob(10, "blocks.1.ln2.hook_normalized", dir);
  DatasetModels reader(env_);
  DatasetSource source{5, 10, sae->weight_hash(), ReferenceHash("blocks.1.hook_resid_post"), kDSae};
  source.hook_name_out = "blocks.1.mlp.hook_post";
  LatentWeightsQuery q;
  q.latent = 3;
  q.top_n = 4;
  auto got = reader.ReadLatentWeights(source, q);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->logits_source, "blocks.1.mlp.W_out then embed.W_E (tied)");
  const at::Tensor W_E = ReferenceWeight("embed.W_E").to(at::kDouble);
  const at::Tensor W_out = ReferenceWeight("blocks.1.mlp.W_out").to(at::kDouble);
  ExpectLogits(*got, W_E.mv(W_out.t().mv(w.W_dec[3].to(at::kDouble))), 4);
  EXPECT_EQ(got->encoder_decoder_cosine, 0);
  EXPECT_NEAR(got->encoder_norm, w.W_enc.select(1, 3).norm().item<double>(), 1e-4);

  // Steering adds to the hook the transcoder predicts (mlp.hook_post), not to the one it reads.
  const at::Tensor row = w.W_dec[3];
  ExpectAddingTwoSteers(reader, source, 3,
                        {{*ParseHookName("blocks.1.mlp.hook_post"),
                          [row](const at::Tensor& a) { return a + 2.0f * row; }}},
                        "transcoder");
}

// A circuit-tracer cross-layer transcoder's latent of layer 0 writes to layers 0 and 1: both
// decoder norms are reported, and the logits unembed what it writes in all.
TEST_F(DatasetModelsTest, ACrossLayerTranscodersLatentWritesToEveryLaterLayer) {
  const std::string dir = root_ + "/clt";
  mkdir(dir.c_str(), 0755);
  std::ofstream(dir + "/config.yaml") << "model_kind: cross_layer_transcoder\n"
                                         "feature_input_hook: hook_resid_mid\n"
                                         "feature_output_hook: hook_mlp_out\n";
  at::manual_seed(12);
  std::vector<at::Tensor> W_dec;
  for (int l = 0; l < 2; ++l) {
    const std::string i = std::to_string(l);
    const at::Tensor W_enc = at::randn({kDSae, 16}), b_enc = at::zeros({kDSae});
    const at::Tensor b_dec = at::zeros({16});
    W_dec.push_back(at::randn({kDSae, 2 - l, 16}));
    ASSERT_TRUE(WriteSafetensors(dir + "/W_enc_" + i + ".safetensors",
                                 {{"W_enc_" + i, StDtype::kF32, {kDSae, 16}, W_enc.data_ptr()},
                                  {"b_enc_" + i, StDtype::kF32, {kDSae}, b_enc.data_ptr()},
                                  {"b_dec_" + i, StDtype::kF32, {16}, b_dec.data_ptr()}})
                    .ok());
    ASSERT_TRUE(
        WriteSafetensors(dir + "/W_dec_" + i + ".safetensors",
                         {{"W_dec_" + i, StDtype::kF32, {kDSae, 2 - l, 16}, W_dec[l].data_ptr()}})
            .ok());
  }
  const at::Tensor W_E = ReferenceWeight("embed.W_E").to(at::kDouble);
  DatasetModels reader(env_);
  for (int l = 0; l < 2; ++l) {
    const std::string hook = "blocks." + std::to_string(l) + ".hook_resid_mid";
    auto sae = Sae::Load(dir, *ParseHookName(hook));
    ASSERT_TRUE(sae.ok()) << sae.status();
    AddReferenceJob(30 + l, hook, dir);
    DatasetSource source{static_cast<uint64_t>(7 + l), static_cast<uint64_t>(30 + l),
                         sae->weight_hash(), ReferenceHash("blocks.1.hook_resid_post"), kDSae};
    source.hook_name = hook;
    source.hook_name_out = "blocks." + std::to_string(l) + ".hook_mlp_out";
    LatentWeightsQuery q;
    q.latent = 5;
    q.top_n = 4;
    auto got = reader.ReadLatentWeights(source, q);
    ASSERT_TRUE(got.ok()) << got.status();
    const at::Tensor rows = W_dec[l][5];  // [2 - l, 16]
    ASSERT_EQ(got->decoder_norm_by_layer.size(), static_cast<size_t>(2 - l));
    for (int t = 0; t < 2 - l; ++t) {
      EXPECT_EQ(got->decoder_norm_by_layer[t].first, l + t);
      EXPECT_NEAR(got->decoder_norm_by_layer[t].second, rows[t].norm().item<double>(), 1e-4);
    }
    EXPECT_NEAR(got->decoder_norm, rows[0].norm().item<double>(), 1e-4);  // into its own layer
    EXPECT_EQ(got->logits_source, "embed.W_E (tied)");
    ExpectLogits(*got, W_E.mv(rows.sum(0).to(at::kDouble)), 4);

    // Steering it adds its decoder into each layer it writes there; attribution credits it
    // through them all (the layers' figures, not 0).
    HookSplices adds;
    for (int t = 0; t < 2 - l; ++t) {
      adds.push_back({*ParseHookName("blocks." + std::to_string(l + t) + ".hook_mlp_out"),
                      [row = rows[t]](const at::Tensor& a) { return a + 2.0f * row; }});
    }
    ExpectAddingTwoSteers(reader, source, 5, adds, "layer " + std::to_string(l));
    AttributionQuery attribute;
    attribute.token_ids = {4, 8, 15, 16};
    auto attributed = reader.AttributePrompt(source, attribute);
    ASSERT_TRUE(attributed.ok()) << attributed.status();
    EXPECT_FALSE(attributed->top_latents.empty());
  }
}

TEST_F(DatasetModelsTest, BadQueriesAndChangedFilesAreNamed) {
  const std::string dir = root_ + "/sae_bad";
  const std::string hash = WriteSae(dir, MakeWeights(16, 3));
  AddReferenceJob(9, "blocks.0.hook_resid_pre", dir);
  const std::string model_hash = ReferenceHash("blocks.0.hook_resid_pre");
  DatasetSource source{3, 9, hash, model_hash, kDSae};
  LatentWeightsQuery q;

  q.top_n = 1001;
  EXPECT_EQ(DatasetModels(env_).ReadLatentWeights(source, q).status().code(),
            absl::StatusCode::kInvalidArgument);
  q.top_n = -1;
  EXPECT_EQ(DatasetModels(env_).ReadLatentWeights(source, q).status().code(),
            absl::StatusCode::kInvalidArgument);
  q.top_n = 0;
  q.latent = kDSae;
  auto s = DatasetModels(env_).ReadLatentWeights(source, q).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("latent: 12 is outside [0, 12)"), std::string::npos) << s;
  q.latent = -1;
  EXPECT_EQ(DatasetModels(env_).ReadLatentWeights(source, q).status().code(),
            absl::StatusCode::kInvalidArgument);
  q.latent = 0;
  q.unembedding = "lm_head.weight";
  s = DatasetModels(env_).ReadLatentWeights(source, q).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("unembedding"), std::string::npos) << s;
  q.unembedding.clear();

  // The job record is gone.
  DatasetSource orphan = source;
  orphan.job_id = 99;
  s = DatasetModels(env_).ReadLatentWeights(orphan, q).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("job 99"), std::string::npos) << s;

  // A DENSE job has no SAE.
  jobs_[10] = jobs_[9];
  jobs_[10].mutable_spec()->mutable_extract()->clear_sae();
  orphan.job_id = 10;
  EXPECT_EQ(DatasetModels(env_).ReadLatentWeights(orphan, q).status().code(),
            absl::StatusCode::kFailedPrecondition);

  // The SAE outside the data roots.
  env_.data_roots = {root_ + "/elsewhere"};
  EXPECT_EQ(DatasetModels(env_).ReadLatentWeights(source, q).status().code(),
            absl::StatusCode::kPermissionDenied);
  env_.data_roots = {root_};

  // The model's recorded hash differs: neighbours still, no logits, and why.
  DatasetSource other_model = source;
  other_model.model_weight_hash = "fnv1a64:0000000000000000";
  auto got = DatasetModels(env_).ReadLatentWeights(other_model, q);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_FALSE(got->neighbors.empty());
  EXPECT_TRUE(got->positive_logits.empty());
  EXPECT_NE(got->logits_unavailable.find("recorded fnv1a64:0000000000000000"), std::string::npos)
      << got->logits_unavailable;

  // The SAE file changed after the dataset was made.
  WriteSae(dir, MakeWeights(16, 4));
  s = DatasetModels(env_).ReadLatentWeights(source, q).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("changed"), std::string::npos) << s;
}

// A TorchScript module holding only weights (its forward is not needed to read them).
void SaveModule(const std::string& path, const std::string& child, const std::string& param,
                const at::Tensor& value) {
  torch::jit::Module module("Model");
  torch::jit::Module head("Head");
  head.register_parameter(param, value, /*is_buffer=*/false);
  module.register_module(child, head);
  module.save(path);
}

TEST_F(DatasetModelsTest, TorchScriptUnembeddingsAreFoundByNameAndChecked) {
  const std::string dir = root_ + "/sae_ts";
  const SaeWeights w = MakeWeights(16, 5);
  const std::string hash = WriteSae(dir, w);
  LatentWeightsQuery q;
  q.latent = 4;
  q.top_n = 3;

  // An untied head, [vocab, d] as Hugging Face's Linear stores it.
  const std::string head_path = root_ + "/head.pt";
  at::manual_seed(11);
  const at::Tensor lm_head = at::randn({40, 16});
  SaveModule(head_path, "lm_head", "weight", lm_head);
  AddTorchScriptJob(20, head_path, dir);
  auto head_hash = HashFile(head_path);
  ASSERT_TRUE(head_hash.ok());
  DatasetSource source{4, 20, hash, *head_hash, kDSae};
  auto got = DatasetModels(env_).ReadLatentWeights(source, q);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->logits_source, "lm_head.weight");
  ExpectLogits(*got, lm_head.to(at::kDouble).mv(w.W_dec[4].to(at::kDouble)), 3);
  // A module that gives hidden states cannot be run to its logits, so it cannot be steered.
  SteeringQuery steer;
  steer.token_ids = {1, 2};
  steer.interventions = {{4, InterventionMode::kSet, 0, {}}};
  auto steered = DatasetModels(env_).SteerPrompt(source, steer, nullptr);
  EXPECT_EQ(steered.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(steered.status().message().find("hidden states"), std::string::npos)
      << steered.status();
  AttributionQuery attribute;
  attribute.token_ids = {1, 2};
  auto attributed = DatasetModels(env_).AttributePrompt(source, attribute);
  EXPECT_EQ(attributed.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(attributed.status().message().find("which attribution needs"), std::string::npos)
      << attributed.status();

  // Asked for by a name the module lacks.
  q.unembedding = "unembed.W_U";
  auto s = DatasetModels(env_).ReadLatentWeights(source, q).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("unembed.W_U"), std::string::npos) << s;
  q.unembedding.clear();

  // A TransformerLens-style W_U [d, vocab] is read transposed.
  const std::string wu_path = root_ + "/wu.pt";
  SaveModule(wu_path, "unembed", "W_U", lm_head.t().contiguous());
  AddTorchScriptJob(21, wu_path, dir);
  got = DatasetModels(env_).ReadLatentWeights({4, 21, hash, "", kDSae}, q);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->logits_source, "unembed.W_U");
  ExpectLogits(*got, lm_head.to(at::kDouble).mv(w.W_dec[4].to(at::kDouble)), 3);

  // A tied GPT-2 embedding.
  const std::string wte_path = root_ + "/wte.pt";
  SaveModule(wte_path, "transformer", "wte", lm_head);
  AddTorchScriptJob(22, wte_path, dir);
  got = DatasetModels(env_).ReadLatentWeights({4, 22, hash, "", kDSae}, q);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_TRUE(got->positive_logits.empty());  // "transformer.wte", not "transformer.wte.weight"
  EXPECT_NE(got->logits_unavailable.find("name one"), std::string::npos);
  q.unembedding = "transformer.wte";
  got = DatasetModels(env_).ReadLatentWeights({4, 22, hash, "", kDSae}, q);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->logits_source, "transformer.wte");  // named by the caller: not known as tied
  q.unembedding.clear();

  // A parameter of the wrong width.
  const std::string narrow_path = root_ + "/narrow.pt";
  SaveModule(narrow_path, "lm_head", "weight", at::randn({40, 9}));
  AddTorchScriptJob(23, narrow_path, dir);
  got = DatasetModels(env_).ReadLatentWeights({4, 23, hash, "", kDSae}, q);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_TRUE(got->positive_logits.empty());
  EXPECT_NE(got->logits_unavailable.find("[40, 9]"), std::string::npos) << got->logits_unavailable;
  q.unembedding = "lm_head.weight";  // named: the misfit is the caller's
  s = DatasetModels(env_).ReadLatentWeights({4, 23, hash, "", kDSae}, q).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("[40, 9]"), std::string::npos) << s;
  q.unembedding.clear();

  // The module changed after the dataset was made: no logits, and why.
  SaveModule(head_path, "lm_head", "weight", at::randn({40, 16}));
  got = DatasetModels(env_).ReadLatentWeights(source, q);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_TRUE(got->positive_logits.empty());
  EXPECT_NE(got->logits_unavailable.find("changed"), std::string::npos);
  EXPECT_EQ(got->neighbors.size(), 3u);
}

TEST_F(DatasetModelsTest, AnSaeLargerThanTheMemoryLimitIsRefusedWithTheNumbers) {
  const std::string dir = root_ + "/sae_big";
  const std::string hash = WriteSae(dir, MakeWeights(16, 7));
  AddReferenceJob(31, "blocks.1.hook_resid_post", dir);
  DatasetModelsOptions small;
  small.memory_limit_bytes = 4000;  // the file alone is larger
  const auto s =
      DatasetModels(env_, small).ReadLatentWeights({6, 31, hash, "", kDSae}, {}).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  EXPECT_NE(s.message().find("d_sae 12 x d_in 16"), std::string::npos) << s;
  EXPECT_NE(s.message().find("0.00 GB are available"), std::string::npos) << s;
  DatasetModelsOptions enough;
  enough.memory_limit_bytes = 1 << 20;
  EXPECT_TRUE(DatasetModels(env_, enough).ReadLatentWeights({6, 31, hash, "", kDSae}, {}).ok());
}

// A job with more_outputs wrote several datasets: each is answered with its own hook and SAE,
// found by the dataset's name.
TEST_F(DatasetModelsTest, EachOutputOfAJobIsAnsweredWithItsOwnHookAndSae) {
  const std::string resid = root_ + "/sae_out0", mlp = root_ + "/sae_out1";
  const SaeWeights w_resid = MakeWeights(16, 11), w_mlp = MakeWeights(32, 12);
  const std::string resid_hash = WriteSae(resid, w_resid), mlp_hash = WriteSae(mlp, w_mlp);
  AddReferenceJob(60, "blocks.1.hook_resid_post", resid);
  latentd::v1::ExtractOutput* more =
      jobs_[60].mutable_spec()->mutable_extract()->add_more_outputs();
  more->set_hook_name("blocks.0.mlp.hook_post");
  more->mutable_sae()->set_path(mlp);
  AddReferenceJob(61, "blocks.0.mlp.hook_post", mlp);  // the same output as a job of its own
  const std::string model_hash = ReferenceHash("blocks.1.hook_resid_post");
  DatasetModels models(env_);
  LatentWeightsQuery q;
  q.latent = 3;
  q.top_n = 4;

  DatasetSource first{20, 60, resid_hash, model_hash, kDSae, "extract-60"};
  auto got = models.ReadLatentWeights(first, q);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->logits_source, "embed.W_E (tied)");
  EXPECT_NEAR(got->decoder_norm, w_resid.W_dec[3].norm().item<double>(), 1e-4);

  DatasetSource second{21, 60, mlp_hash, model_hash, kDSae, "extract-60.blocks.0.mlp.hook_post"};
  got = models.ReadLatentWeights(second, q);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->logits_source, "blocks.0.mlp.W_out then embed.W_E (tied)");
  EXPECT_NEAR(got->decoder_norm, w_mlp.W_dec[3].norm().item<double>(), 1e-4);

  PromptQuery prompt;
  prompt.token_ids = {4, 8, 15, 16, 23};
  prompt.latents_per_token = 1000;
  auto encoded = models.EncodePrompt(second, prompt);
  auto alone = models.EncodePrompt({22, 61, mlp_hash, model_hash, kDSae}, prompt);
  ASSERT_TRUE(encoded.ok() && alone.ok()) << encoded.status() << alone.status();
  ASSERT_EQ(encoded->tokens.size(), alone->tokens.size());
  for (size_t r = 0; r < alone->tokens.size(); ++r) {
    ASSERT_EQ(encoded->tokens[r].latents.size(), alone->tokens[r].latents.size());
    for (size_t e = 0; e < alone->tokens[r].latents.size(); ++e) {
      EXPECT_EQ(encoded->tokens[r].latents[e].index, alone->tokens[r].latents[e].index);
      EXPECT_EQ(encoded->tokens[r].latents[e].score, alone->tokens[r].latents[e].score);
    }
  }

  // Latent to latent across the job's outputs: the MLP's latents of block 0 driving a latent of
  // block 1's residual stream, whose value there is the metric.
  auto later = models.EncodePrompt(first, prompt);
  ASSERT_TRUE(later.ok()) << later.status();
  const ScoredIndex& fires = later->tokens[3].latents.at(0);
  AttributionQuery attribute;
  attribute.token_ids = prompt.token_ids;
  attribute.target_latent = TargetLatent{fires.index, 3};
  auto driven = models.AttributePrompt(second, attribute, &first);
  ASSERT_TRUE(driven.ok()) << driven.status();
  EXPECT_NEAR(driven->metric, fires.score, 1e-4);
  EXPECT_FALSE(driven->top_latents.empty());
  EXPECT_EQ(driven->latent_attribution_by_position[4], 0);  // after the target's position
  // Not the other way (block 1's latents come after), nor across models.
  auto backwards = models.AttributePrompt(first, attribute, &second);
  EXPECT_EQ(backwards.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(backwards.status().message().find("target_latent.dataset_id: its SAE reads "
                                              "blocks.0.mlp.hook_post, which the forward computes "
                                              "before blocks.1.hook_resid_post"),
            std::string::npos)
      << backwards.status();
  jobs_[62] = jobs_[60];
  jobs_[62].set_id(62);
  jobs_[62].mutable_spec()->mutable_extract()->mutable_model()->mutable_reference()->set_seed(99);
  DatasetSource elsewhere = first;
  elsewhere.dataset_id = 23;
  elsewhere.job_id = 62;
  elsewhere.name = "extract-62";
  elsewhere.model_weight_hash.clear();
  auto across = models.AttributePrompt(second, attribute, &elsewhere);
  EXPECT_EQ(across.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(across.status().message().find("target_latent.dataset_id: dataset 23 was made with "
                                           "another model"),
            std::string::npos)
      << across.status();

  // A name that is none of the job's outputs, or an SAE other than the dataset's.
  DatasetSource stranger = second;
  stranger.name = "renamed";
  auto s = models.ReadLatentWeights(stranger, q).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_NE(s.message().find("none of job 60's outputs"), std::string::npos) << s;
  DatasetSource swapped = second;
  swapped.sae_weight_hash = resid_hash;
  EXPECT_EQ(models.ReadLatentWeights(swapped, q).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

// A prompt on each dataset of an SAE suite (one job with a hook per output, or a job per hook)
// loads the model once: the cache holds one model and the SAEs, not a model per dataset.
TEST_F(DatasetModelsTest, PromptsOnDatasetsOfTheSameWeightsShareOneModel) {
  const std::string first_dir = root_ + "/sae_suite0", second_dir = root_ + "/sae_suite1";
  const std::string first_hash = WriteSae(first_dir, MakeWeights(16, 21));
  const std::string second_hash = WriteSae(second_dir, MakeWeights(16, 22));
  AddReferenceJob(70, "blocks.1.hook_resid_post", first_dir);
  latentd::v1::ExtractOutput* more =
      jobs_[70].mutable_spec()->mutable_extract()->add_more_outputs();
  more->set_hook_name("blocks.0.hook_resid_post");
  more->mutable_sae()->set_path(second_dir);
  const std::string model_hash = ReferenceHash("blocks.1.hook_resid_post");
  const int64_t model_bytes = (*CreateReferenceModel(SmallModel(),
                                                     {*ParseHookName("blocks.1.hook_resid_post"),
                                                      *ParseHookName("blocks.0.hook_resid_post")},
                                                     at::Device(at::kCPU)))
                                  ->parameter_bytes() +
                              kLastPromptActivationBytes;
  const int64_t sae_bytes = Sae::Load(first_dir)->weight_bytes();
  DatasetModels models(env_);
  PromptQuery prompt;
  prompt.token_ids = {4, 8, 15};
  auto first = models.EncodePrompt({30, 70, first_hash, model_hash, kDSae, "extract-70"}, prompt);
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(models.cached_bytes(), model_bytes + sae_bytes);
  auto second = models.EncodePrompt(
      {31, 70, second_hash, model_hash, kDSae, "extract-70.blocks.0.hook_resid_post"}, prompt);
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_EQ(models.cached_bytes(), model_bytes + 2 * sae_bytes);

  // The second dataset's latents are its hook's: what a job of that hook alone gives. That job
  // ran the same weights: its prompts use the same model (and the same SAE).
  AddReferenceJob(71, "blocks.0.hook_resid_post", second_dir);
  auto shared = models.EncodePrompt({32, 71, second_hash, model_hash, kDSae}, prompt);
  ASSERT_TRUE(shared.ok()) << shared.status();
  EXPECT_EQ(models.cached_bytes(), model_bytes + 2 * sae_bytes);
  // The answers to compare with come from a DatasetModels of its own: there job 71's model holds
  // its one hook and has seen no other prompt, so neither the shared model's hook order nor the
  // activations it keeps can make both sides wrong alike.
  DatasetModels reference(env_);
  auto alone = reference.EncodePrompt({32, 71, second_hash, model_hash, kDSae}, prompt);
  ASSERT_TRUE(alone.ok()) << alone.status();
  auto expect_same_top = [](const PromptLatents& got, const PromptLatents& want) {
    ASSERT_EQ(got.top.size(), want.top.size());
    for (size_t i = 0; i < want.top.size(); ++i) {
      EXPECT_EQ(got.top[i].latent, want.top[i].latent);
      EXPECT_FLOAT_EQ(got.top[i].max_value, want.top[i].max_value);
    }
  };
  expect_same_top(*second, *alone);
  expect_same_top(*shared, *alone);
  // The model keeps the last prompt's activations (the second dataset above reused the first's
  // forward); another prompt gets its own.
  prompt.token_ids = {42, 8, 15, 16};
  second = models.EncodePrompt(
      {31, 70, second_hash, model_hash, kDSae, "extract-70.blocks.0.hook_resid_post"}, prompt);
  alone = reference.EncodePrompt({32, 71, second_hash, model_hash, kDSae}, prompt);
  ASSERT_TRUE(second.ok() && alone.ok());
  ASSERT_EQ(second->tokens.size(), 4u);
  expect_same_top(*second, *alone);

  // A job of the same weights at a hook the model lacks: the model is rebuilt with it too and
  // replaces the cached one (the weights are the same, so is their size); the earlier hooks
  // answer as before.
  const std::string mlp_dir = root_ + "/sae_suite_mlp";
  const std::string mlp_hash = WriteSae(mlp_dir, MakeWeights(32, 23));
  AddReferenceJob(72, "blocks.0.mlp.hook_post", mlp_dir);
  auto mlp = models.EncodePrompt({33, 72, mlp_hash, model_hash, kDSae}, prompt);
  ASSERT_TRUE(mlp.ok()) << mlp.status();
  const int64_t mlp_sae_bytes = Sae::Load(mlp_dir)->weight_bytes();
  EXPECT_EQ(models.cached_bytes(), model_bytes + 2 * sae_bytes + mlp_sae_bytes);
  auto again = models.EncodePrompt({32, 71, second_hash, model_hash, kDSae}, prompt);
  ASSERT_TRUE(again.ok());
  expect_same_top(*again, *alone);
}

TEST_F(DatasetModelsTest, APromptGetsTheLatentsTheModelAndSaeGiveIt) {
  const std::string dir = root_ + "/sae_prompt";
  const SaeWeights w = MakeWeights(16, 8);
  const std::string hash = WriteSae(dir, w);
  AddReferenceJob(40, "blocks.1.hook_resid_post", dir);
  const std::string model_hash = ReferenceHash("blocks.1.hook_resid_post");
  DatasetModels models(env_);
  PromptQuery q;
  q.token_ids = {1, 5, 9, 3, 63};
  q.latents_per_token = 1000;  // all of them
  auto got = models.EncodePrompt({7, 40, hash, model_hash, kDSae}, q);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_FALSE(got->bos_prepended);

  // The same model and SAE by hand: every token's non-zero latents, value descending.
  auto model = CreateReferenceModel(SmallModel(), *ParseHookName("blocks.1.hook_resid_post"),
                                    at::Device(at::kCPU));
  auto sae = Sae::Load(dir);
  ASSERT_TRUE(model.ok() && sae.ok());
  const at::Tensor x = (*model)
                           ->Forward(at::tensor(std::vector<int64_t>{1, 5, 9, 3, 63}).view({1, -1}))
                           .view({5, -1});
  const at::Tensor z = sae->EncodeDense(x);
  ASSERT_EQ(got->tokens.size(), 5u);
  std::map<int64_t, float> max_value;
  for (int64_t r = 0; r < 5; ++r) {
    const PromptToken& token = got->tokens[r];
    EXPECT_EQ(token.token_id, q.token_ids[r]);
    const at::Tensor nonzero = z[r].nonzero().view(-1);
    ASSERT_EQ(token.active, nonzero.numel());
    ASSERT_EQ(static_cast<int64_t>(token.latents.size()), token.active);
    EXPECT_GT(token.active, 0);
    for (size_t e = 0; e < token.latents.size(); ++e) {
      EXPECT_NEAR(token.latents[e].score, z[r][token.latents[e].index].item<float>(), 1e-5);
      if (e > 0) {
        EXPECT_GE(token.latents[e - 1].score, token.latents[e].score);
      }
      float& m = max_value[token.latents[e].index];
      m = std::max(m, token.latents[e].score);
    }
  }
  // Over the prompt: each latent at its largest value, the largest first.
  ASSERT_FALSE(got->top.empty());
  for (size_t i = 0; i < got->top.size(); ++i) {
    const PromptLatent& l = got->top[i];
    EXPECT_EQ(l.max_value, max_value[l.latent]);
    EXPECT_NEAR(z[l.position][l.latent].item<float>(), l.max_value, 1e-5);
    EXPECT_EQ(l.positions, (z.select(1, l.latent) > 0).sum().item<int64_t>());
    if (i > 0) {
      EXPECT_GE(got->top[i - 1].max_value, l.max_value);
    }
  }
  // Defaults: 10 latents per token at most (k is 4 here), 20 over the prompt.
  q.latents_per_token = 2;
  q.top_latents = 3;
  got = models.EncodePrompt({7, 40, hash, model_hash, kDSae}, q);
  ASSERT_TRUE(got.ok());
  EXPECT_LE(got->tokens[0].latents.size(), 2u);
  EXPECT_LE(got->top.size(), 3u);

  // A dataset whose spec prepends BOS: the prompt gets it too.
  jobs_[41] = jobs_[40];
  jobs_[41].mutable_spec()->mutable_extract()->mutable_tokens()->set_prepend_bos(true);
  jobs_[41].mutable_spec()->mutable_extract()->mutable_tokens()->set_bos_token_id(50);
  got = models.EncodePrompt({8, 41, hash, model_hash, kDSae}, q);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_TRUE(got->bos_prepended);
  ASSERT_EQ(got->tokens.size(), 6u);
  EXPECT_EQ(got->tokens[0].token_id, 50);
  EXPECT_EQ(got->tokens[5].token_id, 63);

  auto code = [&](std::vector<int64_t> ids, int per_token = 0, uint64_t job = 40,
                  const std::string& recorded_model = "") {
    PromptQuery bad;
    bad.token_ids = std::move(ids);
    bad.latents_per_token = per_token;
    return models.EncodePrompt({7, job, hash, recorded_model, kDSae}, bad).status();
  };
  EXPECT_EQ(code({}).code(), absl::StatusCode::kInvalidArgument);
  auto s = code({1, 64});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("token_ids[1]: id 64 outside the vocabulary [0, 64)"),
            std::string::npos)
      << s;
  s = code({1, 2, 3, 4, 5, 6, 7, 8, 9});  // the model's context is 8
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("at most 8"), std::string::npos) << s;
  s = code({1, 2, 3, 4, 5, 6, 7, 8}, 0, 41);  // 8 tokens and BOS
  EXPECT_NE(s.message().find("9 tokens with BOS"), std::string::npos) << s;
  EXPECT_EQ(code({1}, -1).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code({1}, 1001).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code(std::vector<int64_t>(kMaxPromptTokens + 1, 1)).code(),
            absl::StatusCode::kInvalidArgument);
  s = code({1}, 0, 40, "fnv1a64:0000000000000000");
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("the model changed"), std::string::npos) << s;
  EXPECT_EQ(code({1}, 0, 99).code(), absl::StatusCode::kFailedPrecondition);  // no such job
}

// SteerPrompt runs the dataset's own model and SAE (those EncodePrompt loaded, from the same
// cache), with the dataset's BOS: the clean run is the model's, the latent's values are the
// ones EncodePrompt reports, and ablating it changes the prediction.
TEST_F(DatasetModelsTest, APromptIsSteeredThroughTheDatasetsModelAndSae) {
  const std::string dir = root_ + "/sae_steer";
  const std::string hash = WriteSae(dir, MakeWeights(16, 8));
  AddReferenceJob(40, "blocks.1.hook_resid_post", dir);
  jobs_[40].mutable_spec()->mutable_extract()->mutable_tokens()->set_prepend_bos(true);
  jobs_[40].mutable_spec()->mutable_extract()->mutable_tokens()->set_bos_token_id(50);
  const DatasetSource source{7, 40, hash, ReferenceHash("blocks.1.hook_resid_post"), kDSae};
  DatasetModels models(env_);
  PromptQuery prompt;
  prompt.token_ids = {1, 5, 9, 3, 63};
  prompt.latents_per_token = 1000;
  auto encoded = models.EncodePrompt(source, prompt);
  ASSERT_TRUE(encoded.ok()) << encoded.status();
  const int64_t cached = models.cached_bytes();
  const ScoredIndex strongest = encoded->tokens[5].latents[0];  // the last token's largest

  SteeringQuery q;
  q.token_ids = prompt.token_ids;
  q.interventions = {{strongest.index, InterventionMode::kSet, 0, {}}};
  q.new_tokens = 2;
  SteeringQuery of_a_source = q;  // only a crosscoder over models has sources to choose
  of_a_source.crosscoder_source = 0;
  auto not_a_crosscoder = models.SteerPrompt(source, of_a_source, nullptr);
  EXPECT_EQ(not_a_crosscoder.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(not_a_crosscoder.status().message().find(
                "crosscoder_source: dataset 7's SAE is not a crosscoder over several models"),
            std::string::npos)
      << not_a_crosscoder.status();
  auto got = models.SteerPrompt(source, q, nullptr);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(models.cached_bytes(), cached);  // nothing loaded twice
  EXPECT_TRUE(got->bos_prepended);
  EXPECT_EQ(got->prompt, (std::vector<int64_t>{50, 1, 5, 9, 3, 63}));
  auto model = CreateReferenceModel(SmallModel(), *ParseHookName("blocks.1.hook_resid_post"),
                                    at::Device(at::kCPU));
  ASSERT_TRUE(model.ok());
  at::NoGradGuard no_grad;
  const NextTokenPredictions own = (*model)->PredictNextTokens(
      at::tensor(got->prompt, at::TensorOptions().dtype(at::kLong)).view({1, -1}), {}, true);
  ASSERT_EQ(got->clean.token_losses.size(), 5u);
  for (int64_t s = 0; s < 5; ++s) {
    EXPECT_NEAR(got->clean.token_losses[s], own.losses[0][s].item<float>(), 1e-5) << s;
  }
  EXPECT_EQ(got->clean.next[0].token_id, own.last_logits[0].argmax().item<int64_t>());
  EXPECT_EQ(got->clean.generated.size(), 2u);
  ASSERT_EQ(got->latent_values.size(), 1u);
  for (size_t r = 0; r < got->prompt.size(); ++r) {
    float want = 0;
    for (const ScoredIndex& l : encoded->tokens[r].latents) {
      if (l.index == strongest.index) want = l.score;
    }
    EXPECT_NEAR(got->latent_values[0].second[r], want, 1e-5) << r;
  }
  EXPECT_GT(got->kl_divergence, 0);
  EXPECT_NE(got->steered.token_losses, got->clean.token_losses);

  // Bad input: the prompt's checks are EncodePrompt's; the context counts the new tokens.
  q.token_ids = {1, 64};
  auto s = models.SteerPrompt(source, q, nullptr).status();
  EXPECT_NE(s.message().find("token_ids[1]: id 64 outside the vocabulary"), std::string::npos) << s;
  q.token_ids = {};
  EXPECT_EQ(models.SteerPrompt(source, q, nullptr).status().code(),
            absl::StatusCode::kInvalidArgument);
  q.token_ids = {1, 2, 3, 4, 5, 6};  // 7 with BOS, + 2 pass the context of 8
  s = models.SteerPrompt(source, q, nullptr).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("new_tokens: 2 after a prompt of 7 tokens"), std::string::npos) << s;
  q.new_tokens = 1;
  EXPECT_TRUE(models.SteerPrompt(source, q, nullptr).ok());
  q.interventions[0].latent = kDSae;
  s = models.SteerPrompt(source, q, nullptr).status();
  EXPECT_NE(s.message().find("interventions[0].latent"), std::string::npos) << s;

  // Attribution runs the same model and SAE: its activations are EncodePrompt's, with BOS.
  AttributionQuery attribute;
  attribute.token_ids = prompt.token_ids;
  attribute.top = 1000;
  auto attributed = models.AttributePrompt(source, attribute);
  ASSERT_TRUE(attributed.ok()) << attributed.status();
  EXPECT_EQ(models.cached_bytes(), cached);
  EXPECT_TRUE(attributed->bos_prepended);
  EXPECT_EQ(attributed->prompt, got->prompt);
  EXPECT_EQ(attributed->target_token_id, own.last_logits[0].argmax().item<int64_t>());
  int64_t entries = 0;
  for (const PromptToken& token : encoded->tokens) entries += token.active;
  ASSERT_EQ(static_cast<int64_t>(attributed->top_entries.size()), entries);
  for (const LatentAttribution& e : attributed->top_entries) {
    float want = 0;
    for (const ScoredIndex& l : encoded->tokens[e.position].latents) {
      if (l.index == e.latent) want = l.score;
    }
    EXPECT_NEAR(e.activation, want, 1e-5) << e.latent << " at " << e.position;
  }
  attribute.token_ids = {1, 64};
  s = models.AttributePrompt(source, attribute).status();
  EXPECT_NE(s.message().find("token_ids[1]"), std::string::npos) << s;

  // The backward pass's activations past the memory limit: refused with the numbers. Six tokens
  // with BOS through 2 blocks keep 2 x 6 x activation_bytes_per_token(6) bytes.
  const int64_t need = 2 * 6 * (*model)->activation_bytes_per_token(6);
  DatasetModelsOptions tight;
  tight.memory_limit_bytes = need - 1;  // the SAE still fits: it is far smaller
  DatasetModels limited(env_, tight);
  attribute.token_ids = {1, 5, 9, 3, 63};
  s = limited.AttributePrompt(source, attribute).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  EXPECT_NE(s.message().find("attributing a prompt of 6 tokens keeps about"), std::string::npos)
      << s;
  EXPECT_NE(s.message().find("(2 blocks)"), std::string::npos) << s;
  attribute.token_ids = {1, 5, 9};  // 4 tokens fit
  EXPECT_TRUE(limited.AttributePrompt(source, attribute).ok());
}

// A crosscoder's latent: how its decoder splits between the sources, at the training scale the
// crosscoder compared them at (as training measured it), each source's logits through its own
// model, for a crosscoder over a model's hooks and one over two models' stored datasets alike;
// the neighbours are of the whole row. A prompt goes through every source's model.
TEST_F(DatasetModelsTest, ACrosscodersLatentSaysHowItsDecoderSplitsBetweenItsSources) {
  CrosscoderModelOptions options;
  options.sources = 2;
  options.d_in = 16;
  options.d_sae = kDSae;
  options.k = 3;
  options.seed = 5;
  CrosscoderModelImpl crosscoder(options);
  crosscoder.InitWeights();
  // Sources 10x apart in scale, so the training scale matters; one latent all in source 1.
  at::manual_seed(6);
  crosscoder.InitFromData(at::cat({at::randn({64, 16}) * 10, at::randn({64, 16})}, 1));
  {
    at::NoGradGuard no_grad;
    crosscoder.W_dec[4].slice(0, 0, 16).zero_();
  }
  crosscoder.CalibrateBatchThreshold({at::randn({64, 32})});
  {
    // Every latent with a positive pre-activation fires on the prompts below, whatever the
    // models' scale against the data above.
    at::NoGradGuard no_grad;
    crosscoder.batch_threshold.fill_(0);
  }
  const std::string dir = root_ + "/crosscoder";
  const std::vector<std::string> hooks = {"blocks.0.hook_resid_post", "blocks.1.hook_resid_post"};
  ASSERT_TRUE(crosscoder.Save(dir, {{hooks[0], "ref", "live"}, {hooks[1], "ref", "live"}}).ok());
  auto sae = Sae::Load(dir);
  ASSERT_TRUE(sae.ok()) << sae.status();
  AddReferenceJob(80, hooks[0], dir);
  jobs_[80].mutable_spec()->mutable_extract()->add_crosscoder_hooks(hooks[1]);
  latentd::v1::Job stored;
  stored.mutable_spec()->mutable_extract()->mutable_model()->mutable_stored()->add_dataset_ids(1);
  stored.mutable_spec()->mutable_extract()->mutable_model()->mutable_stored()->add_dataset_ids(2);
  stored.mutable_spec()->mutable_extract()->mutable_sae()->set_path(dir);
  jobs_[81] = stored;
  // The stored datasets 1 and 2 came from two models (model diffing): the reference model and
  // the same with seed 4, each at its hook.
  latentd::v1::ReferenceModelSpec other = SmallModel();
  other.set_seed(4);
  auto other_model = CreateReferenceModel(other, *ParseHookName(hooks[1]), at::Device(at::kCPU));
  ASSERT_TRUE(other_model.ok());
  AddReferenceJob(90, hooks[0], "");
  AddReferenceJob(91, hooks[1], "");
  *jobs_[91].mutable_spec()->mutable_extract()->mutable_model()->mutable_reference() = other;
  const std::string hashes[2] = {ReferenceHash(hooks[0]), (*other_model)->weight_hash()};
  env_.open_stored_dense =
      [&](uint64_t id,
          const std::string& field) -> absl::StatusOr<std::shared_ptr<const StoredDenseRows>> {
    StoredDenseInfo info;
    info.id = id;
    info.job_id = 89 + id;
    info.hook_name = hooks[id - 1];
    info.model_weight_hash = hashes[id - 1];
    info.width = 16;
    return InMemoryStoredDenseRows(info, {}, {});
  };
  at::Tensor W_E[2] = {ReferenceWeight("embed.W_E").to(at::kDouble), at::Tensor()};
  for (const auto& [name, t] : (*other_model)->NamedWeights()) {
    if (name == "embed.W_E") W_E[1] = t.to(at::kDouble);
  }
  DatasetModels models(env_);
  const at::Tensor norms = crosscoder.DecoderNorms();  // [2, d_sae], the training scale
  const at::Tensor W_dec = crosscoder.W_dec.detach().to(at::kDouble);
  const at::Tensor saved_dec = sae->weights().W_dec.to(at::kDouble);  // the hooks' own units
  for (uint64_t job : {80, 81}) {
    const DatasetSource source{job, job, sae->weight_hash(), "", kDSae};
    for (int64_t j : {0, 4, 7}) {
      LatentWeightsQuery q;
      q.latent = j;
      auto got = models.ReadLatentWeights(source, q);
      ASSERT_TRUE(got.ok()) << got.status();
      ASSERT_EQ(got->decoder_by_source.size(), 2u);
      const double total = norms.select(1, j).sum().item<double>();
      for (int s = 0; s < 2; ++s) {
        const SourceDecoder& d = got->decoder_by_source[s];
        EXPECT_EQ(d.hook_name, hooks[s]);
        EXPECT_NEAR(d.norm, norms[s][j].item<double>(), 1e-4 * total);
        EXPECT_NEAR(d.share, norms[s][j].item<double>() / total, 1e-5);
      }
      const at::Tensor a = W_dec[j].slice(0, 0, 16), b = W_dec[j].slice(0, 16, 32);
      // (1 for source 0 but where its block is 0.)
      EXPECT_FLOAT_EQ(got->decoder_by_source[0].cosine_with_first, j == 4 ? 0.0f : 1.0f);
      if (j == 4) {
        EXPECT_FLOAT_EQ(got->decoder_by_source[1].share, 1.0f);  // source 1's own
        EXPECT_EQ(got->decoder_by_source[1].cosine_with_first, 0.0f);
      } else {
        EXPECT_NEAR(got->decoder_by_source[1].cosine_with_first,
                    (a.dot(b) / (a.norm() * b.norm())).item<double>(), 1e-5);
      }
      EXPECT_EQ(got->neighbors.size(), 10u);
      EXPECT_TRUE(got->positive_logits.empty());
      EXPECT_NE(got->logits_unavailable.find("crosscoder"), std::string::npos);
      // Each source's block through its model's unembedding (the tied embedding); for the
      // stored pair, source 1's is the other model's.
      for (int s = 0; s < 2; ++s) {
        const SourceDecoder& d = got->decoder_by_source[s];
        if (j == 4 && s == 0) {
          EXPECT_TRUE(d.positive_logits.empty());
          EXPECT_EQ(d.logits_unavailable, "its decoder into this source is 0");
          continue;
        }
        EXPECT_EQ(d.logits_source, "embed.W_E (tied)") << d.logits_unavailable;
        const at::Tensor& unembed = job == 81 ? W_E[s] : W_E[0];
        ExpectLogitTables(d.positive_logits, d.negative_logits,
                          unembed.mv(saved_dec[j].slice(0, 16 * s, 16 * (s + 1))), 10);
      }
    }
    // A prompt goes through each source's model to its hook, side by side, as EXTRACT read the
    // rows: the latents the crosscoder gives those activations.
    PromptQuery prompt;
    prompt.token_ids = {1, 5, 9, 3};
    prompt.latents_per_token = 1000;
    auto got = models.EncodePrompt(source, prompt);
    ASSERT_TRUE(got.ok()) << got.status();
    // Over one model's hooks its latents steer and attribute (through every source: the
    // engine's tests check the figures); over two models (model diffing) they do not, one
    // forward pass running one model, unless steering names the model (below).
    SteeringQuery steer;
    steer.token_ids = prompt.token_ids;
    steer.interventions = {{1, InterventionMode::kAdd, 5, {}}};
    auto steered = models.SteerPrompt(source, steer, nullptr);
    AttributionQuery attribute;
    attribute.token_ids = prompt.token_ids;
    auto attributed = models.AttributePrompt(source, attribute);
    if (job == 80) {
      ASSERT_TRUE(steered.ok()) << steered.status();
      EXPECT_GT(steered->kl_divergence, 0);
      ASSERT_TRUE(attributed.ok()) << attributed.status();
      EXPECT_FALSE(attributed->top_entries.empty());
      // Its latent as a target (read from both hooks): here of its own latents.
      const PromptToken& last = got->tokens.back();
      ASSERT_FALSE(last.latents.empty());
      AttributionQuery to_latent;
      to_latent.token_ids = prompt.token_ids;
      to_latent.target_latent = TargetLatent{last.latents[0].index, 3};
      auto driven = models.AttributePrompt(source, to_latent, &source);
      ASSERT_TRUE(driven.ok()) << driven.status();
      EXPECT_NEAR(driven->metric, last.latents[0].score, 1e-4);
    } else {
      for (const absl::Status& s : {steered.status(), attributed.status()}) {
        EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
        EXPECT_NE(s.message().find("dataset 81's SAE is a crosscoder over several models' "
                                   "activations (it reads stored datasets 1, 2)"),
                  std::string::npos)
            << s;
      }
      EXPECT_NE(steered.status().message().find(
                    "steering runs one model, named by crosscoder_source (SteerPrompt, "
                    "AttributePrompt, AttributionGraph; the others run beside it)"),
                std::string::npos)
          << steered.status();
      // Named, the model of source 1 (the stored dataset 2's: seed 4) runs, a latent's ADD
      // writing block 1 of its decoder row at that model's hook; the other model runs beside
      // it, so the latent's values are the prompt's (EncodePrompt's) and SET steers too.
      SteeringQuery in_second = steer;
      in_second.crosscoder_source = 1;
      auto diffed = models.SteerPrompt(source, in_second, nullptr);
      ASSERT_TRUE(diffed.ok()) << diffed.status();
      ASSERT_EQ(diffed->prompt.size(), got->tokens.size());
      ASSERT_FALSE(got->top.empty());
      const int64_t j = std::max_element(got->top.begin(), got->top.end(),
                                         [](const PromptLatent& a, const PromptLatent& b) {
                                           return a.positions < b.positions;
                                         })
                            ->latent;                   // the latent firing on the most positions
      std::vector<float> zj(got->tokens.size(), 0.0f);  // its value at each position
      for (size_t p = 0; p < got->tokens.size(); ++p) {
        for (const auto& l : got->tokens[p].latents) {
          if (l.index == j) zj[p] = l.score;
        }
      }
      SteeringQuery set_in_second = in_second;
      set_in_second.interventions = {{j, InterventionMode::kSet, 5, {}}};
      auto set = models.SteerPrompt(source, set_in_second, nullptr);
      ASSERT_TRUE(set.ok()) << set.status();
      ASSERT_EQ(set->latent_values.size(), 1u);
      EXPECT_EQ(set->latent_values[0].first, j);
      for (size_t p = 0; p < zj.size(); ++p) {
        EXPECT_NEAR(set->latent_values[0].second[p], zj[p], 1e-4) << p;
      }
      {
        at::NoGradGuard no_grad;
        const at::Tensor run = at::tensor(diffed->prompt, at::kLong).view({1, -1});
        const at::Tensor block = saved_dec[1].slice(0, 16, 32).to(at::kFloat);
        const at::Tensor to_5 = (5 - at::tensor(zj)).unsqueeze(1) *
                                saved_dec[j].slice(0, 16, 32).to(at::kFloat).unsqueeze(0);
        const HookSplices add = {
            {*ParseHookName(hooks[1]), [&](const at::Tensor& a) { return a + block * 5; }}};
        const HookSplices set_5 = {
            {*ParseHookName(hooks[1]), [&](const at::Tensor& a) { return a + to_5; }}};
        const NextTokenPredictions clean = (*other_model)->PredictNextTokens(run, {}, true);
        const NextTokenPredictions added = (*other_model)->PredictNextTokens(run, add, true);
        const NextTokenPredictions set_by_hand =
            (*other_model)->PredictNextTokens(run, set_5, true);
        ASSERT_EQ(diffed->clean.token_losses.size(), static_cast<size_t>(clean.losses.size(1)));
        for (size_t s = 0; s < diffed->clean.token_losses.size(); ++s) {
          EXPECT_NEAR(diffed->clean.token_losses[s], clean.losses[0][s].item<float>(), 1e-4);
          EXPECT_NEAR(diffed->steered.token_losses[s], added.losses[0][s].item<float>(), 1e-4);
          EXPECT_NEAR(set->steered.token_losses[s], set_by_hand.losses[0][s].item<float>(), 1e-4);
        }
      }
      // Attribution credits the latents in that model's prediction, each with its value from
      // both models (the prompt's, as EncodePrompt gives them).
      AttributionQuery credit;
      credit.token_ids = prompt.token_ids;
      credit.crosscoder_source = 1;
      auto credited = models.AttributePrompt(source, credit);
      ASSERT_TRUE(credited.ok()) << credited.status();
      ASSERT_FALSE(credited->top_entries.empty());
      for (const LatentAttribution& e : credited->top_entries) {
        float encoded = 0;
        for (const auto& l : got->tokens[e.position].latents) {
          if (l.index == e.latent) encoded = l.score;
        }
        EXPECT_NEAR(e.activation, encoded, 1e-4) << e.latent << "@" << e.position;
      }
      // And in a later latent of that model (credited in source 0, the reference model: a
      // dataset of its blocks.1 hook is the target), with the same values; a target of another
      // model than the source that runs is refused.
      const std::string later_dir = root_ + "/sae_later";
      const std::string later_hash = WriteSae(later_dir, MakeWeights(16, 12));
      AddReferenceJob(93, hooks[1], later_dir);
      const DatasetSource later{93, 93, later_hash, "", kDSae};
      auto later_latents = models.EncodePrompt(later, prompt);
      ASSERT_TRUE(later_latents.ok()) << later_latents.status();
      ASSERT_FALSE(later_latents->tokens[3].latents.empty());
      AttributionQuery to_later = credit;
      to_later.crosscoder_source = 0;
      to_later.ablate = 1;
      to_later.target_latent = TargetLatent{later_latents->tokens[3].latents[0].index, 3};
      auto drives = models.AttributePrompt(source, to_later, &later);
      ASSERT_TRUE(drives.ok()) << drives.status();
      EXPECT_NEAR(drives->metric, later_latents->tokens[3].latents[0].score, 1e-4);
      ASSERT_FALSE(drives->top_entries.empty());
      EXPECT_EQ(drives->ablated_changes.size(), 1u);
      for (const LatentAttribution& e : drives->top_entries) {
        EXPECT_LE(e.position, 3);
        float encoded = 0;
        for (const auto& l : got->tokens[e.position].latents) {
          if (l.index == e.latent) encoded = l.score;
        }
        EXPECT_NEAR(e.activation, encoded, 1e-4) << e.latent << "@" << e.position;
      }
      // An attribution graph's passes and circuit: the latent alone as AttributePrompt gives it,
      // and the top entry taken out with the same change as the ablation check's (the source
      // named per dataset: the diff's, and none for the SAE beside it).
      EXPECT_EQ(*models.ReadsSeveralModels(source), true);
      EXPECT_EQ(*models.ReadsSeveralModels(later), false);
      auto batch = models.AttributeToLatents(source, to_later, later, {*to_later.target_latent});
      ASSERT_TRUE(batch.ok() && batch->front().ok()) << batch.status();
      EXPECT_NEAR(batch->front()->latent_attribution, drives->latent_attribution, 1e-6);
      const LatentAttribution& top = drives->top_entries[0];
      auto together = models.AblateTogether({source, later}, {{{top.latent, top.position}}, {}},
                                            to_later, 0, &later, {0, std::nullopt});
      ASSERT_TRUE(together.ok()) << together.status();
      EXPECT_NEAR(*together, drives->ablated_changes[0], 1e-5);
      auto unnamed = models.AblateTogether({later, source}, {{}, {{top.latent, top.position}}},
                                           to_later, 0, &later);
      EXPECT_EQ(unnamed.status().code(), absl::StatusCode::kFailedPrecondition) << unnamed.status();
      auto too_many = models.AblateTogether({source}, {{{top.latent, top.position}}}, to_later, 0,
                                            &later, {0, 0});
      EXPECT_EQ(too_many.status().code(), absl::StatusCode::kInvalidArgument) << too_many.status();
      to_later.crosscoder_source = 1;
      auto other_forward = models.AttributePrompt(source, to_later, &later);
      EXPECT_EQ(other_forward.status().code(), absl::StatusCode::kInvalidArgument);
      EXPECT_NE(other_forward.status().message().find(
                    "target_latent.dataset_id: dataset 93 was made with another model than "
                    "dataset 81"),
                std::string::npos)
          << other_forward.status();
      // Source 0 runs the other model: another clean run.
      in_second.crosscoder_source = 0;
      auto first_model = models.SteerPrompt(source, in_second, nullptr);
      ASSERT_TRUE(first_model.ok()) << first_model.status();
      EXPECT_NE(first_model->clean.token_losses, diffed->clean.token_losses);
      // Refused: a source past the crosscoder's.
      in_second.crosscoder_source = 2;
      auto past = models.SteerPrompt(source, in_second, nullptr);
      EXPECT_EQ(past.status().code(), absl::StatusCode::kInvalidArgument);
      EXPECT_NE(past.status().message().find("crosscoder_source: 2 outside [0, 2)"),
                std::string::npos)
          << past.status();
      // Its latent is a target of the forward of one of its models: dataset 80's model is
      // source 0's (the reference model), the seed-4 model runs beside it, and the metric is the
      // latent over both, as EncodePrompt gives it (the engine's attribution_test checks the
      // entries).
      ASSERT_FALSE(got->tokens[3].latents.empty());
      AttributionQuery to_latent;
      to_latent.token_ids = prompt.token_ids;
      to_latent.target_latent = TargetLatent{got->tokens[3].latents[0].index, 3};
      const DatasetSource of_one_model{80, 80, sae->weight_hash(), "", kDSae};
      auto driven = models.AttributePrompt(of_one_model, to_latent, &source);
      ASSERT_TRUE(driven.ok()) << driven.status();
      EXPECT_NEAR(driven->metric, got->tokens[3].latents[0].score, 1e-4);
      // A model that is none of its sources' is refused, naming the target.
      const std::string third_dir = root_ + "/sae_third";
      const std::string third_hash = WriteSae(third_dir, MakeWeights(16, 12));
      AddReferenceJob(92, hooks[0], third_dir);
      latentd::v1::ReferenceModelSpec third = SmallModel();
      third.set_seed(9);
      *jobs_[92].mutable_spec()->mutable_extract()->mutable_model()->mutable_reference() = third;
      auto refused = models.AttributePrompt({92, 92, third_hash, "", kDSae}, to_latent, &source);
      EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
      EXPECT_NE(refused.status().message().find(
                    "target_latent.dataset_id: dataset 81's SAE is a crosscoder over several "
                    "models' activations (it reads stored datasets 1, 2), none of them dataset "
                    "92's model"),
                std::string::npos)
          << refused.status();
    }
    if (job == 80) {
      // Over one model there is no model to choose.
      SteeringQuery named = steer;
      named.crosscoder_source = 0;
      auto refused = models.SteerPrompt(source, named, nullptr);
      EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
      EXPECT_NE(refused.status().message().find("crosscoder_source: dataset 80's SAE is a "
                                                "crosscoder over hooks of one model"),
                std::string::npos)
          << refused.status();
    }
    const at::Tensor ids = at::tensor(prompt.token_ids, at::kLong).view({1, -1});
    auto first = CreateReferenceModel(SmallModel(), *ParseHookName(hooks[0]), at::Device(at::kCPU));
    auto second = CreateReferenceModel(job == 81 ? other : SmallModel(), *ParseHookName(hooks[1]),
                                       at::Device(at::kCPU));
    ASSERT_TRUE(first.ok() && second.ok());
    const at::Tensor x =
        at::cat({(*first)->Forward(ids).view({4, -1}), (*second)->Forward(ids).view({4, -1})}, 1);
    const at::Tensor z = sae->EncodeDense(x);
    ASSERT_EQ(got->tokens.size(), 4u);
    int64_t active = 0;
    for (int64_t r = 0; r < 4; ++r) {
      const PromptToken& token = got->tokens[r];
      ASSERT_EQ(token.active, z[r].nonzero().numel()) << "job " << job << " token " << r;
      active += token.active;
      for (const ScoredIndex& l : token.latents) {
        EXPECT_NEAR(l.score, z[r][l.index].item<float>(), 1e-4);
      }
    }
    EXPECT_GT(active, 0);
  }
  // Latent scaling fits stored activations: a crosscoder over hooks has none, and a stored
  // dataset deleted since is named (the engine's latent_scaling_test and the end-to-end test fit
  // one).
  {
    auto over_hooks = models.LatentScaling({80, 80, sae->weight_hash(), "", kDSae}, {}, nullptr);
    EXPECT_EQ(over_hooks.status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_NE(over_hooks.status().message().find(
                  "dataset 80's SAE is a crosscoder over hooks of one model "
                  "(blocks.0.hook_resid_post and blocks.1.hook_resid_post), whose activations are "
                  "not stored"),
              std::string::npos)
        << over_hooks.status();
    ExtractEnv without_second = env_;
    const StoredDenseOpener open = env_.open_stored_dense;
    without_second.open_stored_dense =
        [open](uint64_t id,
               const std::string& field) -> absl::StatusOr<std::shared_ptr<const StoredDenseRows>> {
      if (id == 2) return absl::NotFoundError(absl::StrCat(field, ": no dataset 2"));
      return open(id, field);
    };
    DatasetModels deleted(without_second);
    auto gone = deleted.LatentScaling({81, 81, sae->weight_hash(), "", kDSae}, {}, nullptr);
    EXPECT_EQ(gone.status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_NE(gone.status().message().find(
                  "dataset 81 encodes the activations of dataset 2 (its crosscoder's source 1), "
                  "which latent scaling reads: extract.model.stored.dataset_ids[1]: no dataset 2"),
              std::string::npos)
        << gone.status();
  }
  // A source whose model is not known: the prompt is refused naming it.
  jobs_.erase(91);
  DatasetModels without(env_);
  PromptQuery prompt;
  prompt.token_ids = {1, 2};
  auto refused = without.EncodePrompt({81, 81, sae->weight_hash(), "", kDSae}, prompt);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(refused.status().message().find("the crosscoder's input for a prompt: dataset 81 "
                                            "encodes the activations of dataset 2"),
            std::string::npos)
      << refused.status();
}

// A dataset EXTRACT encoded from stored activations (ModelSpec.stored) is answered with the
// model of the job that stored them, at their hook: as the dataset the model run encoded. A
// crosscoder over several, or a source whose record is gone, is named.
TEST_F(DatasetModelsTest, ADatasetOfStoredActivationsIsAnsweredWithTheModelThatStoredThem) {
  const std::string dir = root_ + "/sae_stored";
  const std::string hash = WriteSae(dir, MakeWeights(16, 9));
  const std::string hook = "blocks.1.hook_resid_post";
  AddReferenceJob(70, hook, dir);  // the model run's SPARSE job
  jobs_[71] = jobs_[70];           // the DENSE job that stored the activations
  jobs_[71].mutable_spec()->mutable_extract()->clear_sae();
  latentd::v1::Job stored_job;
  latentd::v1::ExtractSpec* spec = stored_job.mutable_spec()->mutable_extract();
  spec->mutable_model()->mutable_stored()->add_dataset_ids(500);
  spec->mutable_sae()->set_path(dir);
  jobs_[72] = stored_job;
  jobs_[73] = stored_job;
  jobs_[73].mutable_spec()->mutable_extract()->mutable_model()->mutable_stored()->add_dataset_ids(
      501);
  env_.open_stored_dense =
      [](uint64_t id,
         const std::string& field) -> absl::StatusOr<std::shared_ptr<const StoredDenseRows>> {
    if (id != 500) return absl::NotFoundError(field + ": no dataset " + std::to_string(id));
    StoredDenseInfo info;
    info.id = id;
    info.hook_name = "blocks.1.hook_resid_post";
    info.job_id = 71;
    info.width = 16;
    return InMemoryStoredDenseRows(info, {}, {});
  };
  DatasetModels models(env_);
  const std::string model_hash = ReferenceHash(hook);
  PromptQuery q;
  q.token_ids = {1, 5, 9, 3};
  q.latents_per_token = 1000;
  auto from_model = models.EncodePrompt({1, 70, hash, model_hash, kDSae}, q);
  auto from_stored = models.EncodePrompt({2, 72, hash, model_hash, kDSae}, q);
  ASSERT_TRUE(from_model.ok()) << from_model.status();
  ASSERT_TRUE(from_stored.ok()) << from_stored.status();
  ASSERT_EQ(from_stored->tokens.size(), from_model->tokens.size());
  for (size_t t = 0; t < from_model->tokens.size(); ++t) {
    ASSERT_EQ(from_stored->tokens[t].latents.size(), from_model->tokens[t].latents.size());
    for (size_t e = 0; e < from_model->tokens[t].latents.size(); ++e) {
      EXPECT_EQ(from_stored->tokens[t].latents[e].index, from_model->tokens[t].latents[e].index);
      EXPECT_EQ(from_stored->tokens[t].latents[e].score, from_model->tokens[t].latents[e].score);
    }
  }
  // Rows stored from sequences that began with BOS: the prompt gets BOS too.
  jobs_[71].mutable_spec()->mutable_extract()->mutable_tokens()->set_prepend_bos(true);
  jobs_[71].mutable_spec()->mutable_extract()->mutable_tokens()->set_bos_token_id(50);
  auto with_bos = models.EncodePrompt({2, 72, hash, model_hash, kDSae}, q);
  ASSERT_TRUE(with_bos.ok()) << with_bos.status();
  EXPECT_TRUE(with_bos->bos_prepended);
  ASSERT_EQ(with_bos->tokens.size(), q.token_ids.size() + 1);
  EXPECT_EQ(with_bos->tokens[0].token_id, 50);
  LatentWeightsQuery w;
  w.latent = 2;
  auto weights = models.ReadLatentWeights({2, 72, hash, model_hash, kDSae}, w);
  ASSERT_TRUE(weights.ok()) << weights.status();
  EXPECT_EQ(weights->logits_source, "embed.W_E (tied)");

  // A crosscoder over 500 and 501, whose second dataset the store does not hold.
  auto crosscoder = models.EncodePrompt({3, 73, hash, model_hash, kDSae}, q);
  EXPECT_EQ(crosscoder.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(crosscoder.status().message().find("encodes the activations of dataset 501"),
            std::string::npos)
      << crosscoder.status();
  jobs_.erase(71);
  DatasetModels fresh(env_);
  auto orphan = fresh.EncodePrompt({2, 72, hash, model_hash, kDSae}, q);
  EXPECT_EQ(orphan.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(orphan.status().message().find("encodes the activations of dataset 500"),
            std::string::npos)
      << orphan.status();
}

// A dataset made from a Hugging Face GPT-2 checkpoint is answered from that checkpoint: here the
// reference model's weights written as one, so every answer equals the reference dataset's. A
// checkpoint changed since is named, not used.
TEST_F(DatasetModelsTest, AHuggingFaceGpt2DatasetIsAnsweredFromItsCheckpoint) {
  const std::string sae_dir = root_ + "/sae_hf";
  const std::string hash = WriteSae(sae_dir, MakeWeights(16, 9));
  const std::string model_dir = root_ + "/gpt2";
  auto resolved = ResolveReferenceSpec(SmallModel());
  ASSERT_TRUE(resolved.ok());
  ASSERT_TRUE(WriteHfGpt2Checkpoint(model_dir, DrawReferenceWeights(*resolved)));
  const std::string hook = "blocks.1.hook_resid_post";
  AddReferenceJob(50, hook, sae_dir);
  AddHuggingFaceJob(51, model_dir, hook, sae_dir);
  auto hf_model = LoadHfGpt2Model({model_dir}, {*ParseHookName(hook)}, at::Device(at::kCPU));
  ASSERT_TRUE(hf_model.ok()) << hf_model.status();
  const std::string hf_hash = (*hf_model)->weight_hash();
  const DatasetSource reference{1, 50, hash, ReferenceHash(hook), kDSae};
  const DatasetSource hf{2, 51, hash, hf_hash, kDSae};

  DatasetModels models(env_);
  PromptQuery q;
  q.token_ids = {4, 17, 33, 2, 60, 8};
  q.latents_per_token = 1000;
  auto want = models.EncodePrompt(reference, q);
  auto got = models.EncodePrompt(hf, q);
  ASSERT_TRUE(want.ok()) << want.status();
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_EQ(got->tokens.size(), want->tokens.size());
  for (size_t r = 0; r < got->tokens.size(); ++r) {
    ASSERT_EQ(got->tokens[r].latents.size(), want->tokens[r].latents.size()) << r;
    for (size_t e = 0; e < got->tokens[r].latents.size(); ++e) {
      EXPECT_EQ(got->tokens[r].latents[e].index, want->tokens[r].latents[e].index);
      EXPECT_EQ(got->tokens[r].latents[e].score, want->tokens[r].latents[e].score);
    }
  }
  LatentWeightsQuery wq;
  wq.latent = 3;
  wq.top_n = 5;
  auto want_logits = models.ReadLatentWeights(reference, wq);
  auto got_logits = models.ReadLatentWeights(hf, wq);
  ASSERT_TRUE(want_logits.ok() && got_logits.ok()) << got_logits.status();
  EXPECT_EQ(got_logits->logits_unavailable, "");
  ASSERT_EQ(got_logits->positive_logits.size(), 5u);
  for (size_t i = 0; i < 5; ++i) {
    EXPECT_EQ(got_logits->positive_logits[i].index, want_logits->positive_logits[i].index);
    EXPECT_NEAR(got_logits->positive_logits[i].score, want_logits->positive_logits[i].score, 1e-5);
  }

  // The checkpoint changes on disk: a fresh reader (nothing cached) refuses to use it.
  auto changed = DrawReferenceWeights(*resolved);
  changed.W_E = changed.W_E * 2;
  ASSERT_TRUE(WriteHfGpt2Checkpoint(model_dir, changed));
  DatasetModels fresh(env_);
  auto refused = fresh.EncodePrompt(hf, q);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition) << refused.status();
  EXPECT_NE(refused.status().message().find("changed since the dataset was made"),
            std::string::npos)
      << refused.status();
  auto logits = fresh.ReadLatentWeights(hf, wq);
  ASSERT_TRUE(logits.ok()) << logits.status();
  EXPECT_TRUE(logits->positive_logits.empty());
  EXPECT_NE(logits->logits_unavailable.find(hf_hash), std::string::npos)
      << logits->logits_unavailable;
}

// A dataset made in bfloat16 is answered by the model run in bfloat16 (the weight hash says
// which), and its direct logits come from the bfloat16 weights widened: within bfloat16's
// rounding of the float32 answers.
TEST_F(DatasetModelsTest, ABfloat16DatasetIsAnsweredInBfloat16) {
  const std::string model_dir = root_ + "/llama";
  ASSERT_FALSE(WriteRandomLlamaCheckpoint(model_dir).empty());
  const std::string sae_dir = root_ + "/sae_llama";
  const std::string hash = WriteSae(sae_dir, MakeWeights(32, 11));
  const std::string hook = "blocks.1.hook_resid_post";
  AddLlamaJob(60, model_dir, hook, sae_dir, latentd::v1::FLOAT32);
  AddLlamaJob(61, model_dir, hook, sae_dir, latentd::v1::BFLOAT16);
  HfModelOptions f32{model_dir}, bf16{model_dir};
  bf16.bfloat16 = true;
  auto f32_model = LoadHfModel(f32, {*ParseHookName(hook)}, at::Device(at::kCPU));
  auto bf16_model = LoadHfModel(bf16, {*ParseHookName(hook)}, at::Device(at::kCPU));
  ASSERT_TRUE(f32_model.ok() && bf16_model.ok());
  const DatasetSource full{1, 60, hash, (*f32_model)->weight_hash(), kDSae};
  const DatasetSource half{2, 61, hash, (*bf16_model)->weight_hash(), kDSae};

  DatasetModels models(env_);
  PromptQuery q;
  q.token_ids = {4, 17, 33, 2, 40, 8};  // the checkpoint's vocabulary is 50
  q.latents_per_token = 1000;
  auto got = models.EncodePrompt(half, q);
  ASSERT_TRUE(got.ok()) << got.status();  // the hash matched: the model ran in bfloat16
  auto want = models.EncodePrompt(full, q);
  ASSERT_TRUE(want.ok()) << want.status();
  ASSERT_EQ(got->tokens.size(), want->tokens.size());
  // A float32 dataset's hash does not match the bfloat16 model, nor the other way round.
  DatasetSource mixed = half;
  mixed.model_weight_hash = full.model_weight_hash;
  EXPECT_EQ(models.EncodePrompt(mixed, q).status().code(), absl::StatusCode::kFailedPrecondition);

  LatentWeightsQuery wq;
  wq.latent = 3;
  wq.top_n = 5;
  auto got_logits = models.ReadLatentWeights(half, wq);
  auto want_logits = models.ReadLatentWeights(full, wq);
  ASSERT_TRUE(got_logits.ok() && want_logits.ok()) << got_logits.status();
  ASSERT_EQ(got_logits->positive_logits.size(), 5u);
  EXPECT_EQ(got_logits->logits_unavailable, "");
  for (size_t i = 0; i < 5; ++i) {
    EXPECT_NEAR(got_logits->positive_logits[i].score, want_logits->positive_logits[i].score,
                2e-2 * std::abs(want_logits->positive_logits[0].score));
  }
}

TEST_F(DatasetModelsTest, ComparingSaesFindsEachLatentsNearestDirection) {
  // B holds A's decoder rows in another order (slightly perturbed) and its own first rows.
  const SaeWeights a = MakeWeights(16, 9);
  const std::vector<int64_t> perm = {5, 11, 0, 7, 2, 9, 4, 1, 10, 3, 8, 6};
  SaeWeights b = MakeWeights(16, 10);
  for (int64_t j = 2; j < kDSae; ++j) {
    b.W_dec[perm[j]] = a.W_dec[j] * 2.0 + 0.01 * at::randn({16});
  }
  const std::string hash_a = WriteSae(root_ + "/cmp_a", a);
  const std::string hash_b = WriteSae(root_ + "/cmp_b", b);
  AddReferenceJob(50, "blocks.1.hook_resid_post", root_ + "/cmp_a");
  AddReferenceJob(51, "blocks.1.hook_resid_post", root_ + "/cmp_b");
  const DatasetSource da{10, 50, hash_a, "", kDSae}, db{11, 51, hash_b, "", kDSae};
  DatasetModels models(env_);
  auto got = models.CompareSaes(da, db, {});
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_EQ(got->latents.size(), static_cast<size_t>(kDSae));
  double sum = 0;
  for (size_t r = 0; r < got->latents.size(); ++r) {
    const int64_t j = got->latents[r];
    EXPECT_EQ(j, static_cast<int64_t>(r));
    // The best match is the largest cosine with any of B's rows, whichever that is.
    double best = -2;
    int64_t arg = -1;
    for (int64_t k = 0; k < kDSae; ++k) {
      const double c = Cosine(a.W_dec[j], b.W_dec[k]);
      if (c > best) best = c, arg = k;
    }
    EXPECT_EQ(got->best[r], arg) << "latent " << j;
    EXPECT_NEAR(got->best_cosine[r], best, 1e-5);
    if (j >= 2) {
      EXPECT_EQ(got->best[r], perm[j]);
      EXPECT_GT(got->best_cosine[r], 0.99);
    }
    sum += got->best_cosine[r];
  }
  EXPECT_NEAR(got->mean_best_cosine, sum / kDSae, 1e-6);
  ASSERT_EQ(got->histogram.size(), 20u);
  EXPECT_GE(got->histogram.back(), 10);  // the ten moved rows, cosine > 0.99 (0.9 to 1.0)
  int64_t counted = 0;
  for (int64_t c : got->histogram) counted += c;
  EXPECT_EQ(counted, kDSae);

  // A sample, explicit latents (sorted, duplicates dropped), bins.
  SaeComparisonQuery q;
  q.sample = 4;
  q.bins = 4;
  got = models.CompareSaes(da, db, q);
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(got->latents, (std::vector<int64_t>{0, 3, 6, 9}));
  EXPECT_EQ(got->histogram.size(), 4u);
  q = {};
  q.latents = {7, 3, 7};
  got = models.CompareSaes(da, db, q);
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(got->latents, (std::vector<int64_t>{3, 7}));
  EXPECT_EQ(got->best, (std::vector<int64_t>{perm[3], perm[7]}));

  // Bad input.
  q.latents = {12};
  EXPECT_EQ(models.CompareSaes(da, db, q).status().code(), absl::StatusCode::kInvalidArgument);
  q = {};
  q.sample = -1;
  EXPECT_EQ(models.CompareSaes(da, db, q).status().code(), absl::StatusCode::kInvalidArgument);
  q = {};
  q.bins = 1001;
  EXPECT_EQ(models.CompareSaes(da, db, q).status().code(), absl::StatusCode::kInvalidArgument);
  // An SAE of another width of input.
  const std::string hash_wide = WriteSae(root_ + "/cmp_wide", MakeWeights(32, 11));
  AddReferenceJob(52, "blocks.1.mlp.hook_post", root_ + "/cmp_wide");
  auto s = models.CompareSaes(da, {12, 52, hash_wide, "", kDSae}, {}).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_NE(s.message().find("d_in 16"), std::string::npos) << s;
  // More work than allowed: the numbers, and how large a sample fits.
  DatasetModelsOptions small;
  small.max_compare_macs = 12 * 16 * 5;  // five latents' worth
  s = DatasetModels(env_, small).CompareSaes(da, db, {}).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  EXPECT_NE(s.message().find("ask a sample of at most 5 latents"), std::string::npos) << s;
}

TEST_F(DatasetModelsTest, TheCacheKeepsWithinItsBudget) {
  const std::string dir = root_ + "/sae_cache";
  const std::string hash = WriteSae(dir, MakeWeights(16, 6));
  AddReferenceJob(30, "blocks.1.hook_resid_post", dir);
  DatasetSource source{5, 30, hash, "", kDSae};
  LatentWeightsQuery q;
  DatasetModelsOptions none;
  none.cache_bytes = 0;
  DatasetModels uncached(env_, none);
  auto a = uncached.ReadLatentWeights(source, q);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(uncached.cached_bytes(), 0);

  DatasetModels cached(env_);
  auto b = cached.ReadLatentWeights(source, q);
  ASSERT_TRUE(b.ok());
  const int64_t bytes = cached.cached_bytes();
  // The unit decoder, three norms / cosines, and the 64 x 16 embedding, all float32.
  EXPECT_EQ(bytes, (kDSae * 16 + 3 * kDSae + 64 * 16) * 4);
  auto c =
      cached.ReadLatentWeights(source, q);  // served from the cache: the same answer, no growth
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(cached.cached_bytes(), bytes);
  ASSERT_EQ(b->neighbors.size(), c->neighbors.size());
  for (size_t r = 0; r < b->neighbors.size(); ++r) {
    EXPECT_EQ(b->neighbors[r].index, a->neighbors[r].index);
    EXPECT_EQ(b->neighbors[r].index, c->neighbors[r].index);
    EXPECT_EQ(b->neighbors[r].score, c->neighbors[r].score);
  }
}

}  // namespace
}  // namespace latentd::engine
