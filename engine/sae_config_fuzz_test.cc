// The SAE config parsers read files users download: damaged or surprising JSON (a number where a
// name belongs, a list where an object does, cut-off text) must come back as INVALID_ARGUMENT,
// never as an exception out of the JSON library (which would take the daemon down at submit).
// Torch-free, so that it runs under --config=asan too.
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "common/mutate.h"
#include "engine/circuit_tracer.h"
#include "engine/sae_config.h"
#include "gtest/gtest.h"

namespace latentd::engine {
namespace {

// Bytes that matter to a JSON parser, and to the fields' types.
const std::string kJsonAlphabet = R"({}[]:,"0123456789-+eE. \ntrufalsn)";

// Every value of `j`, at any depth, by its JSON pointer.
void Pointers(const nlohmann::json& j, const nlohmann::json::json_pointer& at,
              std::vector<nlohmann::json::json_pointer>* out) {
  out->push_back(at);
  if (j.is_object()) {
    for (auto it = j.begin(); it != j.end(); ++it) Pointers(it.value(), at / it.key(), out);
  } else if (j.is_array()) {
    for (size_t i = 0; i < j.size(); ++i) Pointers(j[i], at / i, out);
  }
}

template <typename Parse>
void NeverThrows(const std::string& valid, Parse parse, const char* what) {
  ASSERT_TRUE(parse(valid).ok()) << what << ": " << parse(valid).status();
  // Every field given a value of every other type: what a byte-level mutation rarely makes.
  const nlohmann::json parsed = nlohmann::json::parse(valid);
  std::vector<nlohmann::json::json_pointer> pointers;
  Pointers(parsed, nlohmann::json::json_pointer(), &pointers);
  const std::vector<nlohmann::json> others = {nullptr,
                                              true,
                                              -3,
                                              1e300,
                                              "blocks.x",
                                              nlohmann::json::array({1, "a"}),
                                              nlohmann::json::object({{"k", 1}})};
  for (const auto& pointer : pointers) {
    for (const nlohmann::json& other : others) {
      nlohmann::json changed = parsed;
      changed[pointer] = other;
      absl::StatusOr<SaeConfig> got = absl::InternalError("not run");
      EXPECT_NO_THROW(got = parse(changed.dump())) << what << ": " << changed.dump();
      if (!got.ok()) EXPECT_EQ(got.status().code(), absl::StatusCode::kInvalidArgument);
    }
  }
  std::mt19937 rng(11);
  int refused = 0;
  for (int i = 0; i < 4000; ++i) {
    const std::string text = MutateBytes(valid, &rng, i % 2 ? kJsonAlphabet : "");
    absl::StatusOr<SaeConfig> got = absl::InternalError("not run");
    EXPECT_NO_THROW(got = parse(text)) << what << ": " << text;
    if (!got.ok()) {
      EXPECT_EQ(got.status().code(), absl::StatusCode::kInvalidArgument) << got.status();
      ++refused;
    }
  }
  EXPECT_GT(refused, 100) << what;
}

TEST(SaeConfigFuzzTest, DamagedConfigsAreRefusedNotThrown) {
  NeverThrows(R"({"d_in": 8, "d_sae": 32, "architecture": "standard", "activation_fn_str": "topk",
      "activation_fn_kwargs": {"k": 4, "signed": false}, "apply_b_dec_to_input": true,
      "normalize_activations": "layer_norm", "finetuning_scaling_factor": false,
      "metadata": {"hook_name": "blocks.2.hook_resid_post", "model_name": "m",
                   "hook_head_index": null,
                   "model_from_pretrained_kwargs": {"center_writing_weights": false}},
      "matryoshka_widths": [8, 32]})",
              ParseSaeConfigJson, "cfg.json");
  NeverThrows(R"({"d_in": 8, "d_out": 8, "d_sae": 32, "architecture": "jumprelu_skip_transcoder",
      "hook_name": "blocks.1.ln2.hook_normalized", "hook_name_out": "blocks.1.hook_mlp_out"})",
              ParseSaeConfigJson, "transcoder cfg.json");
  NeverThrows(R"({"trainer": {"trainer_class": "BatchTopKTrainer", "dict_class": "BatchTopKSAE",
      "activation_dim": 8, "dict_size": 32, "k": 4, "layer": 3, "lm_name": "m",
      "submodule_name": "resid_post_layer_3"}, "buffer": {"d_submodule": 8}})",
              ParseDictionaryLearningConfig, "config.json");
  NeverThrows(R"({"d_model": 8, "d_sae": 32, "hook_point_in": "blocks.3.hook_resid_post",
      "hook_point_out": "blocks.3.hook_resid_post", "act_fn": "jumprelu",
      "jump_relu_threshold": 0.5, "norm_activation": "dataset-wise",
      "dataset_average_activation_norm": {"in": 4.0, "out": 4.0},
      "apply_decoder_bias_to_pre_encoder": false, "use_decoder_bias": true,
      "sparsity_include_decoder_norm": true})",
              ParseLmSaesHyperparams, "hyperparams.json");
}

// circuit-tracer's config.yaml, read by a hand-written key reader: damaged text is refused or
// read, never a crash (under ASan: never a read out of bounds).
TEST(SaeConfigFuzzTest, DamagedYamlIsRefusedOrRead) {
  const std::string valid =
      "model_kind: cross_layer_transcoder  # a comment\n"
      "feature_input_hook: \"hook_resid_mid\"\n"
      "feature_output_hook: 'hook_mlp_out'\n"
      "scan: gemma-2-2b\n"
      "transcoders:\n"
      "  - hf://org/repo/W_enc_0.safetensors\n"
      "activation: jumprelu\n";
  auto parsed = ParseTopLevelYaml(valid);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->at("feature_output_hook"), "hook_mlp_out");
  std::mt19937 rng(13);
  for (int i = 0; i < 4000; ++i) {
    const std::string text = MutateBytes(valid, &rng, i % 2 ? std::string(":#'\"- \n\t[]{}") : "");
    const auto got = ParseTopLevelYaml(text);
    if (!got.ok()) EXPECT_EQ(got.status().code(), absl::StatusCode::kInvalidArgument);
  }
}

}  // namespace
}  // namespace latentd::engine
