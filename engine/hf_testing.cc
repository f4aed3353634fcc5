#include "engine/hf_testing.h"

#include <filesystem>
#include <fstream>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/safetensors.h"

namespace latentd::engine {

std::map<std::string, at::Tensor> HfGpt2Tensors(const Gpt2Weights& w, const std::string& prefix) {
  const int64_t d = w.config.d_model, ctx = w.config.context_length;
  std::map<std::string, at::Tensor> t = {{prefix + "wte.weight", w.W_E},
                                         {prefix + "wpe.weight", w.W_pos},
                                         {prefix + "ln_f.weight", at::ones({d})},
                                         {prefix + "ln_f.bias", at::zeros({d})}};
  for (size_t l = 0; l < w.blocks.size(); ++l) {
    const Gpt2Block& b = w.blocks[l];
    const std::string h = absl::StrCat(prefix, "h.", l, ".");
    t[h + "ln_1.weight"] = b.ln1_w;
    t[h + "ln_1.bias"] = b.ln1_b;
    t[h + "attn.c_attn.weight"] = b.W_qkv;
    t[h + "attn.c_attn.bias"] = b.b_qkv;
    t[h + "attn.c_proj.weight"] = b.W_O;
    t[h + "attn.c_proj.bias"] = b.b_O;
    t[h + "ln_2.weight"] = b.ln2_w;
    t[h + "ln_2.bias"] = b.ln2_b;
    t[h + "mlp.c_fc.weight"] = b.W_in;
    t[h + "mlp.c_fc.bias"] = b.b_in;
    t[h + "mlp.c_proj.weight"] = b.W_out;
    t[h + "mlp.c_proj.bias"] = b.b_out;
    t[h + "attn.bias"] = at::ones({1, 1, ctx, ctx}).tril();
  }
  return t;
}

std::string HfGpt2ConfigJson(const Gpt2Config& c,
                             const std::map<std::string, std::string>& changes) {
  std::map<std::string, std::string> fields = {
      {"model_type", "\"gpt2\""},
      {"n_embd", absl::StrCat(c.d_model)},
      {"n_layer", absl::StrCat(c.n_layers)},
      {"n_head", absl::StrCat(c.n_heads)},
      {"n_inner", c.d_mlp == 4 * c.d_model ? "null" : absl::StrCat(c.d_mlp)},
      {"vocab_size", absl::StrCat(c.vocab_size)},
      {"n_positions", absl::StrCat(c.context_length)},
      {"layer_norm_epsilon", "1e-05"},
      {"activation_function", "\"gelu_new\""}};
  for (const auto& [key, value] : changes) fields[key] = value;
  std::string json = "{";
  for (const auto& [key, value] : fields) {
    absl::StrAppend(&json, json.size() > 1 ? ", " : "", "\"", key, "\": ", value);
  }
  return json + "}";
}

void WriteTextFile(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::binary) << text;
}

bool WriteF32Safetensors(const std::string& path,
                         const std::map<std::string, at::Tensor>& tensors) {
  std::vector<at::Tensor> keep;
  std::vector<StTensorToWrite> out;
  for (const auto& [name, tensor] : tensors) {
    keep.push_back(tensor.to(at::kFloat).contiguous());
    out.push_back({name, StDtype::kF32, keep.back().sizes().vec(), keep.back().data_ptr()});
  }
  return WriteSafetensors(path, out).ok();
}

bool WriteHfGpt2Checkpoint(const std::string& dir, const Gpt2Weights& w, const std::string& prefix,
                           const std::map<std::string, std::string>& config_changes) {
  std::filesystem::create_directories(dir);
  WriteTextFile(dir + "/config.json", HfGpt2ConfigJson(w.config, config_changes));
  return WriteF32Safetensors(dir + "/model.safetensors", HfGpt2Tensors(w, prefix));
}

std::map<std::string, at::Tensor> WriteRandomLlamaCheckpoint(
    const std::string& dir, bool tied, const std::map<std::string, std::string>& config_changes) {
  const int64_t d = 32, layers = 2, q = 4 * 8, kv = 2 * 8, f = 48, vocab = 50;
  at::manual_seed(17);
  auto g = [](std::vector<int64_t> shape) { return at::randn(shape) * 0.1; };
  const auto type = config_changes.find("model_type");
  const bool gemma3 = type != config_changes.end() && type->second == "\"gemma3_text\"";
  std::map<std::string, at::Tensor> t = {{"model.embed_tokens.weight", g({vocab, d})},
                                         {"model.norm.weight", at::ones({d})}};
  if (!tied) t["lm_head.weight"] = g({vocab, d});
  for (int64_t l = 0; l < layers; ++l) {
    const std::string p = absl::StrCat("model.layers.", l, ".");
    t[p + "input_layernorm.weight"] = 1 + g({d});
    t[p + "post_attention_layernorm.weight"] = 1 + g({d});
    t[p + "self_attn.q_proj.weight"] = g({q, d});
    t[p + "self_attn.k_proj.weight"] = g({kv, d});
    t[p + "self_attn.v_proj.weight"] = g({kv, d});
    t[p + "self_attn.o_proj.weight"] = g({d, q});
    t[p + "mlp.gate_proj.weight"] = g({f, d});
    t[p + "mlp.up_proj.weight"] = g({f, d});
    t[p + "mlp.down_proj.weight"] = g({d, f});
    if (gemma3) {  // its per-head query/key norms and the norms around its MLP
      t[p + "self_attn.q_norm.weight"] = g({8});
      t[p + "self_attn.k_norm.weight"] = g({8});
      t[p + "pre_feedforward_layernorm.weight"] = g({d});
      t[p + "post_feedforward_layernorm.weight"] = g({d});
    }
  }
  std::map<std::string, std::string> fields = {{"model_type", "\"llama\""},
                                               {"hidden_size", "32"},
                                               {"num_hidden_layers", "2"},
                                               {"num_attention_heads", "4"},
                                               {"num_key_value_heads", "2"},
                                               {"head_dim", "8"},
                                               {"intermediate_size", "48"},
                                               {"vocab_size", "50"},
                                               {"max_position_embeddings", "32"},
                                               {"rms_norm_eps", "1e-05"},
                                               {"tie_word_embeddings", tied ? "true" : "false"}};
  for (const auto& [key, value] : config_changes) fields[key] = value;
  std::string json = "{";
  for (const auto& [key, value] : fields) {
    absl::StrAppend(&json, json.size() > 1 ? ", " : "", "\"", key, "\": ", value);
  }
  std::filesystem::create_directories(dir);
  WriteTextFile(dir + "/config.json", json + "}");
  if (!WriteF32Safetensors(dir + "/model.safetensors", t)) return {};
  return t;
}

}  // namespace latentd::engine
