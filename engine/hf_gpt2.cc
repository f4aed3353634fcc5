#include "engine/hf_gpt2.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/status_macros.h"

namespace latentd::engine {
namespace {

constexpr char kPrefix[] = "transformer.";

// The tensors a GPT-2 of `c` has, by their Hugging Face names (without "transformer."), with
// their shapes.
std::vector<HfTensorSpec> ExpectedTensors(const Gpt2Config& c) {
  const int64_t d = c.d_model, f = c.d_mlp;
  std::vector<HfTensorSpec> out = {{"wte.weight", {c.vocab_size, d}},
                                   {"wpe.weight", {c.context_length, d}}};
  for (int64_t l = 0; l < c.n_layers; ++l) {
    const std::string h = absl::StrCat("h.", l, ".");
    out.push_back({h + "ln_1.weight", {d}});
    out.push_back({h + "ln_1.bias", {d}});
    out.push_back({h + "attn.c_attn.weight", {d, 3 * d}});
    out.push_back({h + "attn.c_attn.bias", {3 * d}});
    out.push_back({h + "attn.c_proj.weight", {d, d}});
    out.push_back({h + "attn.c_proj.bias", {d}});
    out.push_back({h + "ln_2.weight", {d}});
    out.push_back({h + "ln_2.bias", {d}});
    out.push_back({h + "mlp.c_fc.weight", {d, f}});
    out.push_back({h + "mlp.c_fc.bias", {f}});
    out.push_back({h + "mlp.c_proj.weight", {f, d}});
    out.push_back({h + "mlp.c_proj.bias", {d}});
  }
  out.push_back({"ln_f.weight", {d}, /*optional=*/true});
  out.push_back({"ln_f.bias", {d}, /*optional=*/true});
  return out;
}

// The configuration the forward pass depends on, as text for the weight hash.
std::string ConfigFingerprint(const Gpt2Config& c) {
  return absl::StrFormat("gpt2 d%d l%d h%d f%d v%d c%d eps%.9g act%d scale%d inv%d", c.d_model,
                         c.n_layers, c.n_heads, c.d_mlp, c.vocab_size, c.context_length,
                         c.layer_norm_eps, static_cast<int>(c.activation), c.scale_attn_weights,
                         c.scale_attn_by_inverse_layer_idx);
}

}  // namespace

absl::StatusOr<Gpt2Config> ReadHfGpt2Config(const HfConfig& j) {
  if (j.model_type() != "gpt2") {
    return j.Bad(absl::StrCat("model_type \"", j.model_type(), "\" is not gpt2"));
  }
  Gpt2Config c;
  c.what = absl::StrCat("the GPT-2 model in ", j.dir());
  ASSIGN_OR_RETURN(c.d_model, j.Integer("n_embd", 768, 1, 1 << 16));
  ASSIGN_OR_RETURN(c.n_layers, j.Integer("n_layer", 12, 1, 1024));
  ASSIGN_OR_RETURN(c.n_heads, j.Integer("n_head", 12, 1, 1 << 16));
  ASSIGN_OR_RETURN(c.d_mlp, j.Integer("n_inner", 4 * c.d_model, 1, 1 << 20));
  ASSIGN_OR_RETURN(c.vocab_size, j.Integer("vocab_size", 50257, 1, 1 << 24));
  ASSIGN_OR_RETURN(c.context_length, j.Integer("n_positions", 1024, 1, 1 << 20));
  if (c.d_model % c.n_heads != 0) {
    return j.Bad(absl::StrCat("n_head = ", c.n_heads, " does not divide n_embd = ", c.d_model));
  }
  ASSIGN_OR_RETURN(c.layer_norm_eps, j.PositiveNumber("layer_norm_epsilon", 1e-5));
  ASSIGN_OR_RETURN(const std::string act, j.String("activation_function", "gelu_new"));
  if (act == "gelu_new" || act == "gelu_pytorch_tanh" || act == "gelu_fast") {
    c.activation = Gpt2Activation::kGeluTanh;
  } else if (act == "gelu") {
    c.activation = Gpt2Activation::kGeluErf;
  } else if (act == "relu") {
    c.activation = Gpt2Activation::kRelu;
  } else {
    return j.Bad(
        absl::StrCat("activation_function \"", act,
                     "\" is not one of gelu_new, gelu_pytorch_tanh, gelu_fast, gelu, relu"));
  }
  ASSIGN_OR_RETURN(c.scale_attn_weights, j.Boolean("scale_attn_weights", true));
  ASSIGN_OR_RETURN(c.scale_attn_by_inverse_layer_idx,
                   j.Boolean("scale_attn_by_inverse_layer_idx", false));
  return c;
}

absl::StatusOr<Gpt2Config> CheckHfGpt2(const std::string& dir) {
  ASSIGN_OR_RETURN(HfConfig json, HfConfig::Read(dir));
  ASSIGN_OR_RETURN(Gpt2Config config, ReadHfGpt2Config(json));
  RETURN_IF_ERROR(CheckHfTensors(dir, ExpectedTensors(config), {kPrefix}));
  return config;
}

absl::StatusOr<Gpt2Weights> LoadHfGpt2Weights(const HfModelOptions& options) {
  ASSIGN_OR_RETURN(HfConfig json, HfConfig::Read(options.dir));
  ASSIGN_OR_RETURN(Gpt2Config config, ReadHfGpt2Config(json));
  ASSIGN_OR_RETURN(HfTensors read, ReadHfTensors(options.dir, ExpectedTensors(config), {kPrefix}));
  const std::map<std::string, at::Tensor>& tensors = read.tensors;
  std::string fingerprint = ConfigFingerprint(config);
  Gpt2Weights w;
  w.config = config;
  w.W_E = tensors.at("wte.weight");
  w.W_pos = tensors.at("wpe.weight");
  for (int64_t l = 0; l < config.n_layers; ++l) {
    const std::string h = absl::StrCat("h.", l, ".");
    Gpt2Block b;
    b.ln1_w = tensors.at(h + "ln_1.weight");
    b.ln1_b = tensors.at(h + "ln_1.bias");
    b.W_qkv = tensors.at(h + "attn.c_attn.weight");
    b.b_qkv = tensors.at(h + "attn.c_attn.bias");
    b.W_O = tensors.at(h + "attn.c_proj.weight");
    b.b_O = tensors.at(h + "attn.c_proj.bias");
    b.ln2_w = tensors.at(h + "ln_2.weight");
    b.ln2_b = tensors.at(h + "ln_2.bias");
    b.W_in = tensors.at(h + "mlp.c_fc.weight");
    b.b_in = tensors.at(h + "mlp.c_fc.bias");
    b.W_out = tensors.at(h + "mlp.c_proj.weight");
    b.b_out = tensors.at(h + "mlp.c_proj.bias");
    w.blocks.push_back(std::move(b));
  }
  if (tensors.count("ln_f.weight") && tensors.count("ln_f.bias")) {
    w.ln_f_w = tensors.at("ln_f.weight");
    w.ln_f_b = tensors.at("ln_f.bias");
  }
  if (options.center_writing_weights) {
    w.W_U = w.W_E;  // the logits come from the checkpoint's own embedding
    // What writes into the residual stream is the last dimension of these (x @ W layout).
    auto center = [](at::Tensor& t) { t = t - t.mean(-1, /*keepdim=*/true); };
    center(w.W_E);
    center(w.W_pos);
    for (Gpt2Block& b : w.blocks) {
      for (at::Tensor* t : {&b.W_O, &b.b_O, &b.W_out, &b.b_out}) center(*t);
    }
    fingerprint += " center_writing_weights";
  }
  w.weight_hash = read.Hash(fingerprint);
  w.model_id = absl::StrCat("huggingface:gpt2:", options.dir);
  return w;
}

absl::StatusOr<std::unique_ptr<Gpt2Model>> LoadHfGpt2Model(const HfModelOptions& options,
                                                           const std::vector<HookName>& hooks,
                                                           const at::Device& device) {
  ASSIGN_OR_RETURN(HfConfig json, HfConfig::Read(options.dir));
  ASSIGN_OR_RETURN(Gpt2Config config, ReadHfGpt2Config(json));
  RETURN_IF_ERROR(TransformerHookWidths(Gpt2Shape(config), hooks).status());
  ASSIGN_OR_RETURN(Gpt2Weights weights, LoadHfGpt2Weights(options));
  return Gpt2Model::Create(std::move(weights), hooks, device);
}

}  // namespace latentd::engine
