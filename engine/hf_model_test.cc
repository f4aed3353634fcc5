#include "engine/hf_model.h"

#include "common/test_dir.h"
#include "engine/hf_llama.h"
#include "engine/hf_testing.h"
#include "engine/reference_model.h"
#include "gtest/gtest.h"

namespace latentd::engine {
namespace {

std::vector<HookName> Hooks(const std::vector<std::string>& names) {
  std::vector<HookName> hooks;
  for (const auto& n : names) hooks.push_back(*ParseHookName(n));
  return hooks;
}

void ExpectError(const absl::Status& s, absl::StatusCode code, const std::string& needle) {
  EXPECT_EQ(s.code(), code) << s;
  EXPECT_NE(s.message().find(needle), std::string::npos) << s;
}

TEST(HfModelTest, ModelTypePicksTheArchitecture) {
  latentd::v1::ReferenceModelSpec spec;
  spec.set_d_model(16);
  spec.set_n_layers(2);
  spec.set_n_heads(2);
  spec.set_vocab_size(40);
  spec.set_context_length(8);
  const Gpt2Weights gpt2 = DrawReferenceWeights(*ResolveReferenceSpec(spec));
  const std::string gpt2_dir = FreshTestDir("hf_model_gpt2");
  ASSERT_TRUE(WriteHfGpt2Checkpoint(gpt2_dir, gpt2));
  auto shape = CheckHfModel({gpt2_dir});
  ASSERT_TRUE(shape.ok()) << shape.status();
  EXPECT_EQ(shape->d_mlp, 64);
  EXPECT_EQ(shape->context_length, 8);
  const at::Tensor tokens = at::randint(0, 40, {2, 8}, at::kLong);
  auto model = LoadHfModel({gpt2_dir}, Hooks({"blocks.1.hook_resid_post"}), at::kCPU);
  ASSERT_TRUE(model.ok()) << model.status();
  auto reference = Gpt2Model::Create(gpt2, Hooks({"blocks.1.hook_resid_post"}), at::kCPU);
  EXPECT_TRUE(at::equal((*model)->Forward(tokens), (*reference)->Forward(tokens)));

  const std::string llama_dir = FreshTestDir("hf_model_llama");
  ASSERT_FALSE(WriteRandomLlamaCheckpoint(llama_dir).empty());
  shape = CheckHfModel({llama_dir});
  ASSERT_TRUE(shape.ok()) << shape.status();
  EXPECT_EQ(shape->d_mlp, 48);
  model = LoadHfModel({llama_dir}, Hooks({"blocks.0.mlp.hook_post", "layers.1"}), at::kCPU);
  ASSERT_TRUE(model.ok()) << model.status();
  EXPECT_EQ((*model)->hook_widths(), (std::vector<int64_t>{48, 32}));
  EXPECT_EQ((*model)->model_id(), "huggingface:llama:" + llama_dir);

  // bfloat16: Llama-family and GPT-NeoX only.
  HfModelOptions bf16{gpt2_dir};
  bf16.bfloat16 = true;
  ExpectError(CheckHfModel(bf16).status(), absl::StatusCode::kInvalidArgument,
              "extract.model.huggingface.dtype: BFLOAT16 runs the Llama-family");

  const std::string other = FreshTestDir("hf_model_other");
  WriteTextFile(other + "/config.json", "{\"model_type\": \"phi\"}");
  ExpectError(CheckHfModel({other}).status(), absl::StatusCode::kInvalidArgument,
              "model_type \"phi\": gpt2, gpt_neox, llama, mistral, qwen2, qwen3, gemma, gemma2, "
              "gemma3, phi3 and olmo2 run natively");
  ExpectError(CheckHfModel({FreshTestDir("hf_model_none")}).status(), absl::StatusCode::kNotFound,
              "config.json");
}

// What the model reports it holds is what the checkpoint gave it, tied or not.
TEST(HfModelTest, LlamaParameterBytesAndUnembeddingAreTheCheckpoints) {
  for (const bool tied : {false, true}) {
    const std::string dir = FreshTestDir(tied ? "hf_llama_tied" : "hf_llama_untied");
    const auto tensors = WriteRandomLlamaCheckpoint(dir, tied);
    int64_t bytes = 0;
    for (const auto& [name, t] : tensors) {
      if (name != "model.norm.weight") bytes += 4 * t.numel();  // the final norm feeds no hook
    }
    auto shape = CheckHfModel({dir});
    ASSERT_TRUE(shape.ok()) << shape.status();
    EXPECT_EQ(shape->parameter_bytes, bytes) << tied;
    auto model = LoadHfModel({dir}, Hooks({"blocks.0.hook_resid_post"}), at::kCPU);
    ASSERT_TRUE(model.ok()) << model.status();
    EXPECT_EQ((*model)->parameter_bytes(), bytes);
    // In bfloat16 the model holds half the bytes, the weight hash says so, and it exposes its
    // weights as it holds them (the checkpoint's, rounded to bfloat16).
    HfModelOptions bf16{dir};
    bf16.bfloat16 = true;
    EXPECT_EQ(CheckHfModel(bf16)->parameter_bytes, bytes / 2);
    auto half = LoadHfModel(bf16, Hooks({"blocks.0.hook_resid_post"}), at::kCPU);
    ASSERT_TRUE(half.ok()) << half.status();
    EXPECT_EQ((*half)->parameter_bytes(), bytes / 2);
    EXPECT_NE((*half)->weight_hash(), (*model)->weight_hash());
    for (const auto& [name, t] : (*half)->NamedWeights()) {
      if (name == "embed.W_E") {
        EXPECT_EQ(t.scalar_type(), at::kBFloat16);
        EXPECT_TRUE(at::equal(t, tensors.at("model.embed_tokens.weight").to(at::kBFloat16)));
      }
    }
    for (const auto& [name, t] : (*model)->NamedWeights()) {
      if (name == "unembed.W_U") {
        EXPECT_TRUE(
            at::equal(t, tensors.at(tied ? "model.embed_tokens.weight" : "lm_head.weight")));
      }
      if (name == "blocks.1.mlp.W_out") {
        EXPECT_TRUE(at::equal(t, tensors.at("model.layers.1.mlp.down_proj.weight").t()));
      }
    }
  }
}

// A field config.json leaves out takes the value Hugging Face's config class gives it: Gemma 3's
// multimodal checkpoints save their text_config with only what differs from those.
TEST(HfModelTest, ConfigDefaultsAreHuggingFaces) {
  const std::string dir = FreshTestDir("hf_config_defaults");
  auto read = [&](const std::string& json) {
    WriteTextFile(dir + "/config.json", json);
    absl::StatusOr<HfConfig> config = HfConfig::Read(dir);
    EXPECT_TRUE(config.ok()) << config.status();
    return ReadHfLlamaConfig(*config);
  };
  // Gemma 3 4B as released: text_config holds what differs from Gemma3TextConfig.
  auto gemma3 = read(R"({"model_type": "gemma3", "text_config": {"model_type": "gemma3_text",
      "hidden_size": 2560, "intermediate_size": 10240, "num_hidden_layers": 34,
      "rope_scaling": {"factor": 8.0, "rope_type": "linear"}, "sliding_window": 1024}})");
  ASSERT_TRUE(gemma3.ok()) << gemma3.status();
  EXPECT_EQ(gemma3->vocab_size, 262208);
  EXPECT_EQ(gemma3->n_heads, 8);
  EXPECT_EQ(gemma3->n_kv_heads, 4);
  EXPECT_EQ(gemma3->head_dim, 256);
  EXPECT_EQ(gemma3->context_length, 131072);
  EXPECT_EQ(gemma3->rope_theta, 1e6);
  EXPECT_EQ(gemma3->rope_local_theta, 1e4);
  EXPECT_EQ(gemma3->rope_linear_factor, 8.0);
  EXPECT_EQ(gemma3->sliding_window, 1024);
  ASSERT_EQ(gemma3->sliding_layers.size(), 34u);
  EXPECT_FALSE(gemma3->sliding_layers[5]);  // every sixth layer is global
  EXPECT_TRUE(gemma3->sliding_layers[6]);
  EXPECT_TRUE(gemma3->qk_norm && gemma3->post_norms && gemma3->tied_embeddings);
  EXPECT_EQ(gemma3->attn_softcap, 0);
  auto qwen3 = read(R"({"model_type": "qwen3", "hidden_size": 1024, "num_attention_heads": 16,
      "num_key_value_heads": 8})");
  ASSERT_TRUE(qwen3.ok()) << qwen3.status();
  EXPECT_EQ(qwen3->head_dim, 128);  // Qwen3's heads are not hidden_size / heads wide
  EXPECT_EQ(qwen3->vocab_size, 151936);
  // Mistral: a window unless null (v0.2 and later turn it off that way).
  auto mistral = read(R"({"model_type": "mistral"})");
  ASSERT_TRUE(mistral.ok()) << mistral.status();
  EXPECT_EQ(mistral->context_length, 4096);
  EXPECT_EQ(mistral->n_kv_heads, 8);
  mistral = read(R"({"model_type": "mistral", "sliding_window": null})");
  EXPECT_EQ(mistral->context_length, 4096 * 32);
  // Phi-3 mini 4k: fused projections, eps 1e-5, a window of 2047 that caps the context.
  auto phi3 = read(R"({"model_type": "phi3", "sliding_window": 2047, "rope_scaling": null})");
  ASSERT_TRUE(phi3.ok()) << phi3.status();
  EXPECT_TRUE(phi3->fused_projections);
  EXPECT_EQ(phi3->vocab_size, 32064);
  EXPECT_EQ(phi3->norm_eps, 1e-5);
  EXPECT_EQ(phi3->context_length, 2047);
  EXPECT_EQ(phi3->rotary_dim, 0);
  // Phi-3.5 mini's LongRoPE: 128k grown from 4k, so cos and sin scale by
  // sqrt(1 + ln 32 / ln 4096) = 1.19024.
  auto phi35 = read(R"({"model_type": "phi3", "max_position_embeddings": 131072,
      "original_max_position_embeddings": 4096, "rope_scaling": {"type": "longrope",
      "short_factor": [1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1,
      1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1],
      "long_factor": [2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2,
      2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2]}})");
  ASSERT_TRUE(phi35.ok()) << phi35.status();
  EXPECT_EQ(phi35->rope_original_context, 4096);
  EXPECT_NEAR(phi35->rope_attention_factor, 1.19024, 1e-5);
  EXPECT_EQ(phi35->rope_long_factors.size(), 48u);  // head_dim 96: 48 pairs
  auto olmo2 = read(R"({"model_type": "olmo2"})");
  ASSERT_TRUE(olmo2.ok()) << olmo2.status();
  EXPECT_FALSE(olmo2->pre_norms);
  EXPECT_TRUE(olmo2->post_norms && olmo2->qk_norm_full && !olmo2->qk_norm);
  EXPECT_EQ(olmo2->vocab_size, 50304);
  EXPECT_EQ(olmo2->context_length, 2048);
  EXPECT_EQ(olmo2->norm_eps, 1e-5);
}

// A continuation through a KeyValueCache predicts what the whole sequence run again predicts:
// the first 5 tokens, then 3 at once, then one at a time.
void ExpectCachedContinuationsMatch(ActivationModel& model, int64_t vocab,
                                    const std::string& what) {
  at::manual_seed(9);
  const at::Tensor tokens = at::randint(0, vocab, {2, 12}, at::kLong);
  at::NoGradGuard no_grad;
  KeyValueCache cache;
  int64_t held = 0;
  for (const int64_t step : {5, 3, 1, 1, 1, 1}) {
    const NextTokenPredictions cached =
        model.PredictNextTokens(tokens.narrow(1, held, step), {}, /*losses=*/true, &cache);
    held += step;
    EXPECT_EQ(cache.positions, held) << what;
    const NextTokenPredictions whole = model.PredictNextTokens(tokens.narrow(1, 0, held), {}, true);
    EXPECT_TRUE(at::allclose(cached.last_logits, whole.last_logits, 1e-4, 1e-5))
        << what << " after " << held << ": "
        << (cached.last_logits - whole.last_logits).abs().max().item<float>();
    // The losses within the new tokens are the whole run's at those positions.
    EXPECT_TRUE(
        at::allclose(cached.losses, whole.losses.narrow(1, held - step, step - 1), 1e-4, 1e-5))
        << what << " after " << held;
  }
}

// ForwardSpliced stops at its hook with the splices before it applied: what the whole run to
// the logits sees there with the same splices.
void ExpectSplicedForwardMatches(ActivationModel& model, int64_t vocab, const std::string& what) {
  at::manual_seed(10);
  const at::Tensor tokens = at::randint(0, vocab, {2, 8}, at::kLong);
  at::NoGradGuard no_grad;
  const HookName later = *ParseHookName("blocks.1.hook_resid_mid");
  HookSplices splices = {
      {*ParseHookName("blocks.0.hook_mlp_out"), [](const at::Tensor& x) { return x + 0.5; }}};
  const std::vector<at::Tensor> got = model.ForwardSpliced(tokens, {later}, splices);
  ASSERT_EQ(got.size(), 1u) << what;
  at::Tensor seen;
  splices.push_back({later, [&](const at::Tensor& x) {
                       seen = x;
                       return x;
                     }});
  model.PredictNextTokens(tokens, splices, /*losses=*/false);
  ASSERT_TRUE(seen.defined()) << what;
  EXPECT_TRUE(at::allclose(got[0], seen, 1e-5, 1e-6)) << what;
  const at::Tensor plain = model.ForwardSpliced(tokens, {later}, {})[0];
  EXPECT_FALSE(at::allclose(got[0], plain, 1e-3, 1e-3)) << what << ": the splice changed nothing";
}

TEST(HfModelTest, CachedContinuationsAndSplicedForwardsAgreeWithTheWholeRun) {
  latentd::v1::ReferenceModelSpec spec;
  spec.set_d_model(16);
  spec.set_n_layers(2);
  spec.set_n_heads(2);
  spec.set_vocab_size(40);
  spec.set_context_length(16);
  const std::string gpt2_dir = FreshTestDir("hf_model_cache_gpt2");
  ASSERT_TRUE(WriteHfGpt2Checkpoint(gpt2_dir, DrawReferenceWeights(*ResolveReferenceSpec(spec))));
  auto gpt2 = LoadHfModel({gpt2_dir}, Hooks({"blocks.0.hook_resid_post"}), at::kCPU);
  ASSERT_TRUE(gpt2.ok()) << gpt2.status();
  ExpectCachedContinuationsMatch(**gpt2, 40, "gpt2");
  ExpectSplicedForwardMatches(**gpt2, 40, "gpt2");
  // Llama with grouped-query attention; Gemma 3, whose local layers attend to a window shorter
  // than the sequence (4 positions) and rotate by their own base.
  for (const auto& [name, changes] :
       std::vector<std::pair<std::string, std::map<std::string, std::string>>>{
           {"llama", {}},
           {"gemma3",
            {{"model_type", "\"gemma3_text\""},
             {"sliding_window", "4"},
             {"sliding_window_pattern", "2"}}}}) {
    const std::string dir = FreshTestDir("hf_model_cache_" + name);
    ASSERT_FALSE(WriteRandomLlamaCheckpoint(dir, name == "gemma3", changes).empty());
    auto model = LoadHfModel({dir}, Hooks({"blocks.0.hook_resid_post"}), at::kCPU);
    ASSERT_TRUE(model.ok()) << model.status();
    ExpectCachedContinuationsMatch(**model, 50, name);
    ExpectSplicedForwardMatches(**model, 50, name);
  }
}

TEST(HfModelTest, BadLlamaCheckpointsAreRefusedNamingWhatIsWrong) {
  const std::string dir = FreshTestDir("hf_llama_bad");
  auto check = [&](const std::map<std::string, std::string>& changes) {
    WriteRandomLlamaCheckpoint(dir, /*tied=*/false, changes);
    return CheckHfModel({dir}).status();
  };
  EXPECT_TRUE(check({{"tie_word_embeddings", "true"}}).ok());  // lm_head is then not needed
  ExpectError(check({{"num_key_value_heads", "3"}}), absl::StatusCode::kInvalidArgument,
              "num_key_value_heads = 3 does not divide num_attention_heads = 4");
  ExpectError(check({{"rope_scaling", "{\"type\": \"yarn\", \"factor\": 2.0}"}}),
              absl::StatusCode::kInvalidArgument,
              "only null, \"default\", \"linear\", \"llama3\" and \"longrope\"");
  ExpectError(check({{"rope_scaling",
                      "{\"rope_type\": \"longrope\", \"short_factor\": [1, 1], "
                      "\"long_factor\": [1, 1, 1, 1]}"}}),
              absl::StatusCode::kInvalidArgument,
              "rope_scaling.short_factor and long_factor need 4 entries");
  ExpectError(check({{"rope_scaling",
                      "{\"rope_type\": \"longrope\", \"short_factor\": [1, 0, 1, 1], "
                      "\"long_factor\": [1, 1, 1, 1]}"}}),
              absl::StatusCode::kInvalidArgument, "rope_scaling.short_factor holds 0");
  ExpectError(check({{"model_type", "\"phi3\""}, {"partial_rotary_factor", "0.1"}}),
              absl::StatusCode::kInvalidArgument, "partial_rotary_factor = 0.1 rotates 0");
  // Phi-3 fuses the projections, OLMo 2 norms all query heads at once: a Llama layout is not
  // theirs.
  ExpectError(check({{"model_type", "\"phi3\""}}), absl::StatusCode::kInvalidArgument,
              "no tensor layers.0.self_attn.qkv_proj.weight");
  ExpectError(check({{"model_type", "\"olmo2\""}}), absl::StatusCode::kInvalidArgument,
              "no tensor layers.0.self_attn.q_norm.weight");
  ExpectError(check({{"rope_scaling", "{\"rope_type\": \"llama3\", \"factor\": 8.0}"}}),
              absl::StatusCode::kInvalidArgument, "rope_scaling.low_freq_factor");
  ExpectError(check({{"hidden_act", "\"relu2\""}}), absl::StatusCode::kInvalidArgument,
              "hidden_act \"relu2\"");
  ExpectError(check({{"head_dim", "7"}}), absl::StatusCode::kInvalidArgument,
              "head_dim = 7 is odd");
  ExpectError(check({{"intermediate_size", "40"}}), absl::StatusCode::kInvalidArgument,
              "tensor model.layers.0.mlp.gate_proj.weight has shape [48, 32], config.json implies "
              "[40, 32]");
  ExpectError(check({{"model_type", "\"qwen2\""}}), absl::StatusCode::kInvalidArgument,
              "no tensor layers.0.self_attn.q_proj.bias");
  ExpectError(check({{"model_type", "\"qwen3\""}}), absl::StatusCode::kInvalidArgument,
              "no tensor layers.0.self_attn.q_norm.weight");
  ExpectError(check({{"model_type", "\"gemma3_text\""}, {"layer_types", "[\"full_attention\"]"}}),
              absl::StatusCode::kInvalidArgument, "layer_types must list num_hidden_layers = 2");
  ExpectError(check({{"model_type", "\"gemma3\""}}), absl::StatusCode::kInvalidArgument,
              "text_config is not an object");
  // A tied checkpoint whose config says otherwise lacks the unembedding.
  WriteRandomLlamaCheckpoint(dir, /*tied=*/true, {{"tie_word_embeddings", "false"}});
  ExpectError(CheckHfModel({dir}).status(), absl::StatusCode::kInvalidArgument,
              "no tensor lm_head.weight");
  WriteRandomLlamaCheckpoint(dir);
  HfModelOptions centered{dir, /*center_writing_weights=*/true};
  ExpectError(CheckHfModel(centered).status(), absl::StatusCode::kInvalidArgument,
              "center_writing_weights: for LayerNorm models only");
  HfModelOptions small{dir};
  small.host_memory_limit_bytes = 100000;  // the float32 weights alone are 193 kB
  ExpectError(LoadHfModel(small, Hooks({"blocks.0.hook_resid_pre"}), at::kCPU).status(),
              absl::StatusCode::kResourceExhausted, "GB of float32 weights");
  ExpectError(LoadHfModel({dir}, Hooks({"blocks.2.hook_resid_pre"}), at::kCPU).status(),
              absl::StatusCode::kInvalidArgument, "layer 2 out of range, the llama model in");
}

}  // namespace
}  // namespace latentd::engine
