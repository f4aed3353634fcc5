#include "engine/hf_gpt2.h"

#include <fstream>
#include <map>

#include "common/safetensors.h"
#include "common/test_dir.h"
#include "engine/hf_testing.h"
#include "engine/reference_model.h"
#include "gtest/gtest.h"

namespace latentd::engine {
namespace {

constexpr int64_t kVocab = 100, kD = 32, kLayers = 3, kHeads = 4, kCtx = 16;

latentd::v1::ReferenceModelSpec SmallSpec() {
  latentd::v1::ReferenceModelSpec s;
  s.set_d_model(kD);
  s.set_n_layers(kLayers);
  s.set_n_heads(kHeads);
  s.set_vocab_size(kVocab);
  s.set_context_length(kCtx);
  s.set_seed(11);
  return *ResolveReferenceSpec(s);
}

// The reference model's weights with non-trivial LayerNorms and biases (its own are 1 and 0),
// so that a mapping mistake in any of them shows.
Gpt2Weights Weights() {
  Gpt2Weights w = DrawReferenceWeights(SmallSpec());
  at::manual_seed(5);
  for (Gpt2Block& b : w.blocks) {
    for (at::Tensor* t : {&b.ln1_w, &b.ln2_w}) *t = 1 + 0.2 * at::randn_like(*t);
    for (at::Tensor* t : {&b.ln1_b, &b.b_qkv, &b.b_O, &b.ln2_b, &b.b_in, &b.b_out}) {
      *t = 0.05 * at::randn_like(*t);
    }
  }
  return w;
}

std::string ConfigJson(const std::map<std::string, std::string>& changes = {}) {
  return HfGpt2ConfigJson(ReferenceGpt2Config(SmallSpec()), changes);
}

std::string WriteCheckpoint(const std::string& name, const Gpt2Weights& w,
                            const std::string& prefix = "",
                            const std::map<std::string, std::string>& config_changes = {}) {
  const std::string dir = FreshTestDir(name);
  EXPECT_TRUE(WriteHfGpt2Checkpoint(dir, w, prefix, config_changes));
  return dir;
}

std::vector<HookName> Hooks(const std::vector<std::string>& names) {
  std::vector<HookName> hooks;
  for (const auto& n : names) hooks.push_back(*ParseHookName(n));
  return hooks;
}

const std::vector<std::string> kAllPoints = {"blocks.0.hook_resid_pre", "blocks.0.hook_attn_out",
                                             "blocks.1.hook_resid_mid", "blocks.1.mlp.hook_post",
                                             "blocks.2.hook_mlp_out",   "blocks.2.hook_resid_post"};

std::vector<at::Tensor> Activations(const absl::StatusOr<std::unique_ptr<Gpt2Model>>& model,
                                    const at::Tensor& tokens) {
  EXPECT_TRUE(model.ok()) << model.status();
  return model.ok() ? (*model)->ForwardHooks(tokens) : std::vector<at::Tensor>{};
}

at::Tensor Tokens() {
  at::manual_seed(3);
  return at::randint(0, kVocab, {2, kCtx}, at::kLong);
}

TEST(HfGpt2Test, CheckpointRunsAsTheSameWeightsDo) {
  const Gpt2Weights w = Weights();
  const at::Tensor tokens = Tokens();
  auto direct = Activations(Gpt2Model::Create(w, Hooks(kAllPoints), at::kCPU), tokens);
  for (const std::string prefix : {"", "transformer."}) {
    const std::string dir = WriteCheckpoint("hf_same" + std::to_string(prefix.size()), w, prefix);
    auto config = CheckHfGpt2(dir);
    ASSERT_TRUE(config.ok()) << config.status();
    EXPECT_EQ(config->d_mlp, 4 * kD);  // n_inner null
    auto model = LoadHfGpt2Model({dir}, Hooks(kAllPoints), at::kCPU);
    auto got = Activations(model, tokens);
    ASSERT_EQ(got.size(), direct.size());
    for (size_t i = 0; i < got.size(); ++i) {
      EXPECT_TRUE(at::equal(got[i], direct[i])) << prefix << kAllPoints[i];
    }
    EXPECT_EQ((*model)->hook_widths(), (std::vector<int64_t>{32, 32, 32, 128, 32, 32}));
    EXPECT_EQ((*model)->model_id(), "huggingface:gpt2:" + dir);
    EXPECT_EQ((*model)->weight_hash().rfind("crc32c:", 0), 0u);
    EXPECT_EQ((*model)->vocab_size(), kVocab);
    EXPECT_EQ((*model)->max_context(), kCtx);
  }
}

TEST(HfGpt2Test, ShardedCheckpointLoadsLikeOneFile) {
  const Gpt2Weights w = Weights();
  const std::string one = WriteCheckpoint("hf_one", w);
  const std::string dir = FreshTestDir("hf_sharded");
  WriteTextFile(dir + "/config.json", ConfigJson());
  std::map<std::string, at::Tensor> all = HfGpt2Tensors(w, ""), first, second;
  std::string index = "{\"metadata\": {}, \"weight_map\": {";
  for (const auto& [name, t] : all) {
    const bool in_first = name.rfind("h.2.", 0) != 0;
    (in_first ? first : second)[name] = t;
    index += (index.back() == '{' ? "\"" : ", \"") + name + "\": \"model-0000" +
             (in_first ? "1" : "2") + "-of-00002.safetensors\"";
  }
  WriteF32Safetensors(dir + "/model-00001-of-00002.safetensors", first);
  WriteF32Safetensors(dir + "/model-00002-of-00002.safetensors", second);
  WriteTextFile(dir + "/model.safetensors.index.json", index + "}}");
  auto files = HfWeightFiles(dir);
  ASSERT_TRUE(files.ok()) << files.status();
  EXPECT_EQ(files->size(), 2u);
  const at::Tensor tokens = Tokens();
  auto one_model = LoadHfGpt2Model({one}, Hooks(kAllPoints), at::kCPU);
  auto sharded_model = LoadHfGpt2Model({dir}, Hooks(kAllPoints), at::kCPU);
  auto a = Activations(one_model, tokens);
  auto b = Activations(sharded_model, tokens);
  // The hash is of the weights, not of how they are stored.
  EXPECT_EQ((*one_model)->weight_hash(), (*sharded_model)->weight_hash());
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(at::equal(a[i], b[i])) << kAllPoints[i];
}

// TransformerLens' center_writing_weights: what is written to the residual stream loses its mean
// over d_model, and LayerNorm makes everything read from it unchanged.
TEST(HfGpt2Test, CenterWritingWeightsCentersTheResidualStreamOnly) {
  const std::string dir = WriteCheckpoint("hf_center", Weights());
  const at::Tensor tokens = Tokens();
  HfModelOptions centered{dir, /*center_writing_weights=*/true};
  auto plain_model = LoadHfGpt2Model({dir}, Hooks(kAllPoints), at::kCPU);
  auto centered_model = LoadHfGpt2Model(centered, Hooks(kAllPoints), at::kCPU);
  auto plain = Activations(plain_model, tokens), got = Activations(centered_model, tokens);
  ASSERT_EQ(plain.size(), got.size());
  for (size_t i = 0; i < got.size(); ++i) {
    const at::Tensor want = kAllPoints[i] == "blocks.1.mlp.hook_post"
                                ? plain[i]
                                : plain[i] - plain[i].mean(-1, /*keepdim=*/true);
    EXPECT_TRUE(at::allclose(got[i], want, 1e-4, 1e-5)) << kAllPoints[i];
  }
  EXPECT_NE((*plain_model)->weight_hash(), (*centered_model)->weight_hash());
}

TEST(HfGpt2Test, ConfigOptionsChangeTheForwardPass) {
  const Gpt2Weights w = Weights();
  const at::Tensor tokens = Tokens();
  const auto hooks =
      Hooks({"blocks.0.hook_attn_out", "blocks.1.hook_attn_out", "blocks.0.mlp.hook_post"});
  auto base =
      Activations(LoadHfGpt2Model({WriteCheckpoint("hf_base", w)}, hooks, at::kCPU), tokens);
  auto inverse = Activations(
      LoadHfGpt2Model(
          {WriteCheckpoint("hf_inv", w, "", {{"scale_attn_by_inverse_layer_idx", "true"}})}, hooks,
          at::kCPU),
      tokens);
  EXPECT_TRUE(at::equal(base[0], inverse[0]));  // layer 0 divides by 1
  EXPECT_FALSE(at::allclose(base[1], inverse[1]));
  auto erf = Activations(
      LoadHfGpt2Model({WriteCheckpoint("hf_erf", w, "", {{"activation_function", "\"gelu\""}})},
                      hooks, at::kCPU),
      tokens);
  EXPECT_TRUE(at::equal(base[0], erf[0]));
  EXPECT_FALSE(at::equal(base[2], erf[2]));
  EXPECT_TRUE(at::allclose(base[2], erf[2], 1e-2, 1e-3));  // tanh-GELU approximates GELU
}

absl::Status LoadStatus(const std::string& dir,
                        const std::string& hook = "blocks.0.hook_resid_pre") {
  return LoadHfGpt2Model({dir}, Hooks({hook}), at::kCPU).status();
}

void ExpectError(const absl::Status& s, absl::StatusCode code, const std::string& needle) {
  EXPECT_EQ(s.code(), code) << s;
  EXPECT_NE(s.message().find(needle), std::string::npos) << s;
}

TEST(HfGpt2Test, BadCheckpointsAreRefusedNamingWhatIsWrong) {
  const Gpt2Weights w = Weights();
  ExpectError(LoadStatus(FreshTestDir("hf_empty")), absl::StatusCode::kNotFound, "config.json");

  std::string dir = WriteCheckpoint("hf_llama", w);
  WriteTextFile(dir + "/config.json", "{\"model_type\": \"llama\"}");
  ExpectError(LoadStatus(dir), absl::StatusCode::kInvalidArgument, "model_type \"llama\"");
  WriteTextFile(dir + "/config.json", ConfigJson({{"n_head", "5"}}));
  ExpectError(LoadStatus(dir), absl::StatusCode::kInvalidArgument, "n_head = 5");
  WriteTextFile(dir + "/config.json", ConfigJson({{"activation_function", "\"swish\""}}));
  ExpectError(LoadStatus(dir), absl::StatusCode::kInvalidArgument, "swish");
  WriteTextFile(dir + "/config.json", ConfigJson({{"n_layer", "\"3\""}}));
  ExpectError(LoadStatus(dir), absl::StatusCode::kInvalidArgument, "n_layer is not an integer");
  WriteTextFile(dir + "/config.json", "[1, 2]");
  ExpectError(LoadStatus(dir), absl::StatusCode::kInvalidArgument, "not a JSON object");

  dir = WriteCheckpoint("hf_hook", w);
  ExpectError(LoadStatus(dir, "blocks.3.hook_resid_post"), absl::StatusCode::kInvalidArgument,
              "layer 3 out of range");
  ExpectError(LoadStatus(dir, "hidden_states.1"), absl::StatusCode::kInvalidArgument,
              "TransformerLens names");

  dir = FreshTestDir("hf_noweights");
  WriteTextFile(dir + "/config.json", ConfigJson());
  ExpectError(LoadStatus(dir), absl::StatusCode::kNotFound, "model.safetensors");

  auto tensors = HfGpt2Tensors(w, "");
  tensors.erase("h.1.mlp.c_fc.bias");
  WriteF32Safetensors(dir + "/model.safetensors", tensors);
  ExpectError(LoadStatus(dir), absl::StatusCode::kInvalidArgument, "no tensor h.1.mlp.c_fc.bias");
  EXPECT_EQ(CheckHfGpt2(dir).status().code(), absl::StatusCode::kInvalidArgument);

  tensors = HfGpt2Tensors(w, "");
  tensors["h.2.attn.c_proj.weight"] = at::zeros({kD, kD + 1});
  WriteF32Safetensors(dir + "/model.safetensors", tensors);
  ExpectError(LoadStatus(dir), absl::StatusCode::kInvalidArgument,
              "tensor h.2.attn.c_proj.weight has shape [32, 33], config.json implies [32, 32]");

  tensors = HfGpt2Tensors(w, "");
  tensors["h.0.ln_2.bias"][3] = std::numeric_limits<float>::quiet_NaN();
  WriteF32Safetensors(dir + "/model.safetensors", tensors);
  EXPECT_TRUE(CheckHfGpt2(dir).ok());  // headers only
  ExpectError(LoadStatus(dir), absl::StatusCode::kInvalidArgument,
              "tensor h.0.ln_2.bias has NaN or Inf entries");
}

}  // namespace
}  // namespace latentd::engine
