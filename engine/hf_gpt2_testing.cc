#include "engine/hf_gpt2_testing.h"

#include <filesystem>
#include <fstream>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/safetensors.h"

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

}  // namespace latentd::engine
