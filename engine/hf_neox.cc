#include "engine/hf_neox.h"

#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace latentd::engine {
namespace {

constexpr char kPrefix[] = "gpt_neox.";

std::vector<HfTensorSpec> ExpectedTensors(const LlamaConfig& c) {
  const int64_t d = c.d_model, f = c.d_mlp;
  std::vector<HfTensorSpec> out = {{"embed_in.weight", {c.vocab_size, d}}};
  if (!c.tied_embeddings) out.push_back({"embed_out.weight", {c.vocab_size, d}});
  for (int64_t l = 0; l < c.n_layers; ++l) {
    const std::string p = absl::StrCat("layers.", l, ".");
    for (const char* norm : {"input_layernorm", "post_attention_layernorm"}) {
      out.push_back({p + norm + ".weight", {d}});
      out.push_back({p + norm + ".bias", {d}});
    }
    out.push_back({p + "attention.query_key_value.weight", {3 * d, d}});
    out.push_back({p + "attention.dense.weight", {d, d}});
    if (c.qkv_bias) {
      out.push_back({p + "attention.query_key_value.bias", {3 * d}});
      out.push_back({p + "attention.dense.bias", {d}});
    }
    out.push_back({p + "mlp.dense_h_to_4h.weight", {f, d}});
    out.push_back({p + "mlp.dense_h_to_4h.bias", {f}});
    out.push_back({p + "mlp.dense_4h_to_h.weight", {d, f}});
    out.push_back({p + "mlp.dense_4h_to_h.bias", {d}});
  }
  out.push_back({"final_layer_norm.weight", {d}, /*optional=*/true});
  out.push_back({"final_layer_norm.bias", {d}, /*optional=*/true});
  return out;
}

}  // namespace

absl::StatusOr<LlamaConfig> ReadHfNeoxConfig(const HfConfig& j) {
  if (j.model_type() != "gpt_neox") {
    return j.Bad(absl::StrCat("model_type \"", j.model_type(), "\" is not gpt_neox"));
  }
  LlamaConfig c;
  c.what = absl::StrCat("the gpt_neox model in ", j.dir());
  ASSIGN_OR_RETURN(c.d_model, j.Integer("hidden_size", 6144, 1, 1 << 17));
  ASSIGN_OR_RETURN(c.n_layers, j.Integer("num_hidden_layers", 44, 1, 1024));
  ASSIGN_OR_RETURN(c.n_heads, j.Integer("num_attention_heads", 64, 1, 1 << 12));
  if (c.d_model % c.n_heads != 0) {
    return j.Bad(absl::StrCat("num_attention_heads = ", c.n_heads,
                              " does not divide hidden_size = ", c.d_model));
  }
  c.n_kv_heads = c.n_heads;
  c.head_dim = c.d_model / c.n_heads;
  ASSIGN_OR_RETURN(c.d_mlp, j.Integer("intermediate_size", 4 * c.d_model, 1, 1 << 20));
  ASSIGN_OR_RETURN(c.vocab_size, j.Integer("vocab_size", 50432, 1, 1 << 24));
  ASSIGN_OR_RETURN(c.context_length, j.Integer("max_position_embeddings", 2048, 1, 1 << 24));
  ASSIGN_OR_RETURN(c.norm_eps, j.PositiveNumber("layer_norm_eps", 1e-5));
  c.layer_norm = true;
  ASSIGN_OR_RETURN(const double rotary_pct, j.PositiveNumber("rotary_pct", 0.25));
  if (rotary_pct > 1) return j.Bad("rotary_pct must be in (0, 1]");
  // Hugging Face: int(head_dim * rotary_pct), and the rotation pairs the two halves.
  c.rotary_dim = static_cast<int64_t>(c.head_dim * rotary_pct);
  if (c.rotary_dim < 2 || c.rotary_dim % 2 != 0) {
    return j.Bad(absl::StrCat("rotary_pct = ", rotary_pct, " rotates ", c.rotary_dim, " of ",
                              c.head_dim, " dims per head; it must be an even number >= 2"));
  }
  ASSIGN_OR_RETURN(const double base, j.PositiveNumber("rotary_emb_base", 10000.0));
  ASSIGN_OR_RETURN(c.rope_theta, j.PositiveNumber("rope_theta", base));
  if (j.Has("rope_scaling")) return j.Bad("rope_scaling: only null is read for gpt_neox");
  ASSIGN_OR_RETURN(const std::string act, j.String("hidden_act", "gelu"));
  if (act == "gelu") {
    c.activation = LlamaActivation::kGeluErf;
  } else if (act == "gelu_new" || act == "gelu_fast" || act == "gelu_pytorch_tanh") {
    c.activation = LlamaActivation::kGeluTanh;
  } else {
    return j.Bad(absl::StrCat("hidden_act \"", act,
                              "\" is not one of gelu, gelu_new, gelu_fast, gelu_pytorch_tanh"));
  }
  c.gated_mlp = false;
  c.mlp_bias = true;
  ASSIGN_OR_RETURN(const bool attention_bias, j.Boolean("attention_bias", true));
  c.qkv_bias = c.o_bias = attention_bias;
  ASSIGN_OR_RETURN(c.parallel_residual, j.Boolean("use_parallel_residual", true));
  ASSIGN_OR_RETURN(c.tied_embeddings, j.Boolean("tie_word_embeddings", false));
  return c;
}

absl::StatusOr<LlamaConfig> CheckHfNeox(const std::string& dir) {
  ASSIGN_OR_RETURN(HfConfig json, HfConfig::Read(dir));
  ASSIGN_OR_RETURN(LlamaConfig config, ReadHfNeoxConfig(json));
  RETURN_IF_ERROR(CheckHfTensors(dir, ExpectedTensors(config), {kPrefix}));
  return config;
}

absl::StatusOr<LlamaWeights> LoadHfNeoxWeights(const HfModelOptions& options) {
  ASSIGN_OR_RETURN(HfConfig json, HfConfig::Read(options.dir));
  ASSIGN_OR_RETURN(LlamaConfig config, ReadHfNeoxConfig(json));
  config.bfloat16 = options.bfloat16;
  ASSIGN_OR_RETURN(HfTensors read, ReadHfTensors(options.dir, ExpectedTensors(config), {kPrefix},
                                                 options.weight_dtype()));
  const std::map<std::string, at::Tensor>& t = read.tensors;
  const int64_t H = config.n_heads, dh = config.head_dim, d = config.d_model;
  LlamaWeights w;
  w.config = config;
  w.W_E = t.at("embed_in.weight");
  w.W_U = config.tied_embeddings ? w.W_E : t.at("embed_out.weight");
  if (t.count("final_layer_norm.weight") && t.count("final_layer_norm.bias")) {
    w.final_norm = t.at("final_layer_norm.weight");
    w.final_norm_b = t.at("final_layer_norm.bias");
  }
  for (int64_t l = 0; l < config.n_layers; ++l) {
    const std::string p = absl::StrCat("layers.", l, ".");
    LlamaBlock b;
    b.attn_norm = t.at(p + "input_layernorm.weight");
    b.attn_norm_b = t.at(p + "input_layernorm.bias");
    b.mlp_norm = t.at(p + "post_attention_layernorm.weight");
    b.mlp_norm_b = t.at(p + "post_attention_layernorm.bias");
    // query_key_value's rows are [head][q | k | v][d_head]: take each part across the heads.
    const at::Tensor qkv = t.at(p + "attention.query_key_value.weight").view({H, 3, dh, d});
    b.W_q = qkv.select(1, 0).reshape({H * dh, d}).contiguous();
    b.W_k = qkv.select(1, 1).reshape({H * dh, d}).contiguous();
    b.W_v = qkv.select(1, 2).reshape({H * dh, d}).contiguous();
    b.W_o = t.at(p + "attention.dense.weight");
    if (config.qkv_bias) {
      const at::Tensor bias = t.at(p + "attention.query_key_value.bias").view({H, 3, dh});
      b.b_q = bias.select(1, 0).reshape({H * dh}).contiguous();
      b.b_k = bias.select(1, 1).reshape({H * dh}).contiguous();
      b.b_v = bias.select(1, 2).reshape({H * dh}).contiguous();
      b.b_o = t.at(p + "attention.dense.bias");
    }
    b.W_up = t.at(p + "mlp.dense_h_to_4h.weight");
    b.b_up = t.at(p + "mlp.dense_h_to_4h.bias");
    b.W_down = t.at(p + "mlp.dense_4h_to_h.weight");
    b.b_down = t.at(p + "mlp.dense_4h_to_h.bias");
    w.blocks.push_back(std::move(b));
  }
  std::string fingerprint = LlamaConfigFingerprint(config);
  if (options.center_writing_weights) {
    // What writes to the residual stream, with d_model as nn.Linear's output rows.
    auto center_rows = [](at::Tensor& t) { t = t - t.mean(0, /*keepdim=*/true); };
    auto center = [](at::Tensor& t) { t = t - t.mean(-1, /*keepdim=*/true); };
    center(w.W_E);
    for (LlamaBlock& b : w.blocks) {
      center_rows(b.W_o);
      center_rows(b.W_down);
      center(b.b_down);
      if (b.b_o.defined()) center(b.b_o);
    }
    fingerprint += " center_writing_weights";
  }
  w.weight_hash = read.Hash(fingerprint);
  w.model_id = absl::StrCat("huggingface:gpt_neox:", options.dir);
  return w;
}

}  // namespace latentd::engine
