#include "engine/hf_llama.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace latentd::engine {
namespace {

constexpr char kPrefix[] = "model.";

std::vector<HfTensorSpec> ExpectedTensors(const LlamaConfig& c) {
  const int64_t d = c.d_model, f = c.d_mlp, q = c.n_heads * c.head_dim,
                kv = c.n_kv_heads * c.head_dim;
  std::vector<HfTensorSpec> out = {{"embed_tokens.weight", {c.vocab_size, d}}};
  if (!c.tied_embeddings) out.push_back({"lm_head.weight", {c.vocab_size, d}});
  for (int64_t l = 0; l < c.n_layers; ++l) {
    const std::string p = absl::StrCat("layers.", l, ".");
    out.push_back({p + "input_layernorm.weight", {d}});
    out.push_back({p + "self_attn.q_proj.weight", {q, d}});
    out.push_back({p + "self_attn.k_proj.weight", {kv, d}});
    out.push_back({p + "self_attn.v_proj.weight", {kv, d}});
    out.push_back({p + "self_attn.o_proj.weight", {d, q}});
    if (c.qkv_bias) {
      out.push_back({p + "self_attn.q_proj.bias", {q}});
      out.push_back({p + "self_attn.k_proj.bias", {kv}});
      out.push_back({p + "self_attn.v_proj.bias", {kv}});
    }
    if (c.o_bias) out.push_back({p + "self_attn.o_proj.bias", {d}});
    out.push_back({p + "post_attention_layernorm.weight", {d}});
    if (c.post_norms) {  // Gemma 2: post_attention_layernorm is then attention's post-norm
      out.push_back({p + "pre_feedforward_layernorm.weight", {d}});
      out.push_back({p + "post_feedforward_layernorm.weight", {d}});
    }
    out.push_back({p + "mlp.gate_proj.weight", {f, d}});
    out.push_back({p + "mlp.up_proj.weight", {f, d}});
    out.push_back({p + "mlp.down_proj.weight", {d, f}});
    if (c.mlp_bias) {
      out.push_back({p + "mlp.gate_proj.bias", {f}});
      out.push_back({p + "mlp.up_proj.bias", {f}});
      out.push_back({p + "mlp.down_proj.bias", {d}});
    }
  }
  return out;
}

}  // namespace

bool IsHfLlamaType(const std::string& t) {
  return t == "llama" || t == "mistral" || t == "qwen2" || t == "gemma" || t == "gemma2";
}

absl::StatusOr<LlamaConfig> ReadHfLlamaConfig(const HfConfig& j) {
  const std::string& type = j.model_type();
  if (!IsHfLlamaType(type)) {
    return j.Bad(
        absl::StrCat("model_type \"", type, "\" is not llama, mistral, qwen2, gemma or gemma2"));
  }
  LlamaConfig c;
  c.what = absl::StrCat("the ", type, " model in ", j.dir());
  ASSIGN_OR_RETURN(c.d_model, j.Integer("hidden_size", 4096, 1, 1 << 17));
  ASSIGN_OR_RETURN(c.n_layers, j.Integer("num_hidden_layers", 32, 1, 1024));
  ASSIGN_OR_RETURN(c.n_heads, j.Integer("num_attention_heads", 32, 1, 1 << 12));
  ASSIGN_OR_RETURN(c.n_kv_heads, j.Integer("num_key_value_heads", c.n_heads, 1, c.n_heads));
  if (c.n_heads % c.n_kv_heads != 0) {
    return j.Bad(absl::StrCat("num_key_value_heads = ", c.n_kv_heads,
                              " does not divide num_attention_heads = ", c.n_heads));
  }
  if (!j.Has("head_dim") && c.d_model % c.n_heads != 0) {
    return j.Bad(absl::StrCat("num_attention_heads = ", c.n_heads,
                              " does not divide hidden_size = ", c.d_model,
                              " (and there is no head_dim)"));
  }
  ASSIGN_OR_RETURN(c.head_dim, j.Integer("head_dim", c.d_model / c.n_heads, 2, 1 << 12));
  if (c.head_dim % 2 != 0) return j.Bad(absl::StrCat("head_dim = ", c.head_dim, " is odd"));
  ASSIGN_OR_RETURN(c.d_mlp, j.Integer("intermediate_size", 11008, 1, 1 << 20));
  ASSIGN_OR_RETURN(c.vocab_size, j.Integer("vocab_size", 32000, 1, 1 << 24));
  ASSIGN_OR_RETURN(c.context_length, j.Integer("max_position_embeddings", 2048, 1, 1 << 24));
  ASSIGN_OR_RETURN(c.norm_eps, j.PositiveNumber("rms_norm_eps", 1e-6));
  ASSIGN_OR_RETURN(c.rope_theta, j.PositiveNumber("rope_theta", 10000.0));
  const bool gemma = type == "gemma" || type == "gemma2";
  // Gemma's MLP reads hidden_activation (its legacy hidden_act "gelu" is not what runs).
  ASSIGN_OR_RETURN(const std::string act, gemma ? j.String("hidden_activation", "gelu_pytorch_tanh")
                                                : j.String("hidden_act", "silu"));
  if (act == "silu" || act == "swish") {
    c.activation = LlamaActivation::kSilu;
  } else if (act == "gelu_pytorch_tanh" || act == "gelu_new") {
    c.activation = LlamaActivation::kGeluTanh;
  } else if (act == "gelu") {
    c.activation = LlamaActivation::kGeluErf;
  } else {
    return j.Bad(
        absl::StrCat("hidden_act \"", act, "\" is not one of silu, gelu_pytorch_tanh, gelu"));
  }
  if (type == "qwen2") {
    c.qkv_bias = true;  // Qwen2's q/k/v projections always have biases, o_proj none
  } else {
    ASSIGN_OR_RETURN(const bool attention_bias, j.Boolean("attention_bias", false));
    c.qkv_bias = c.o_bias = attention_bias;
  }
  ASSIGN_OR_RETURN(c.mlp_bias, j.Boolean("mlp_bias", false));
  ASSIGN_OR_RETURN(c.tied_embeddings, j.Boolean("tie_word_embeddings", /*fallback=*/gemma));
  if (gemma) {
    c.embed_scale = std::sqrt(static_cast<double>(c.d_model));
    c.norm_gain_offset = true;
  }
  if (type == "gemma2") {
    c.post_norms = true;
    ASSIGN_OR_RETURN(c.attn_softcap, j.PositiveNumber("attn_logit_softcapping", 50.0));
    ASSIGN_OR_RETURN(const double scalar, j.PositiveNumber("query_pre_attn_scalar", 256.0));
    c.attn_scale = 1.0 / std::sqrt(scalar);
  }
  if (j.Has("rope_scaling")) {
    const nlohmann::json& r = j.json()["rope_scaling"];
    std::string rope_type;
    if (r.is_object() && r.contains("rope_type") && r["rope_type"].is_string()) {
      rope_type = r["rope_type"].get<std::string>();
    } else if (r.is_object() && r.contains("type") && r["type"].is_string()) {
      rope_type = r["type"].get<std::string>();
    }
    auto number = [&](const char* key, double* out) -> absl::Status {
      if (!r.contains(key) || !r[key].is_number() || !(r[key].get<double>() > 0)) {
        return j.Bad(absl::StrCat("rope_scaling.", key, " must be a positive number"));
      }
      *out = r[key].get<double>();
      return absl::OkStatus();
    };
    if (rope_type == "llama3") {
      double original = 0;
      RETURN_IF_ERROR(number("factor", &c.rope_factor));
      RETURN_IF_ERROR(number("low_freq_factor", &c.rope_low_freq_factor));
      RETURN_IF_ERROR(number("high_freq_factor", &c.rope_high_freq_factor));
      RETURN_IF_ERROR(number("original_max_position_embeddings", &original));
      c.rope_original_context = static_cast<int64_t>(original);
      if (!(c.rope_high_freq_factor > c.rope_low_freq_factor)) {
        return j.Bad("rope_scaling.high_freq_factor must exceed low_freq_factor");
      }
    } else if (rope_type != "default") {
      return j.Bad(absl::StrCat("rope_scaling ", r.dump(),
                                ": only null, \"default\" and \"llama3\" are read"));
    }
  }
  // Mistral's window is on when given; Gemma 2's alternate layers always have one.
  ASSIGN_OR_RETURN(const bool use_window,
                   j.Boolean("use_sliding_window",
                             /*fallback=*/type == "mistral" || type == "gemma2"));
  if (use_window && j.Has("sliding_window")) {
    ASSIGN_OR_RETURN(const int64_t window, j.Integer("sliding_window", 0, 1, 1 << 24));
    c.context_length = std::min(c.context_length, window);
  }
  return c;
}

absl::StatusOr<LlamaConfig> CheckHfLlama(const std::string& dir) {
  ASSIGN_OR_RETURN(HfConfig json, HfConfig::Read(dir));
  ASSIGN_OR_RETURN(LlamaConfig config, ReadHfLlamaConfig(json));
  RETURN_IF_ERROR(CheckHfTensors(dir, ExpectedTensors(config), kPrefix));
  return config;
}

absl::Status CheckHfLlamaOptions(const LlamaConfig& config, const HfModelOptions& options) {
  if (options.center_writing_weights) {
    return absl::InvalidArgumentError(absl::StrCat(
        "extract.model.huggingface.center_writing_weights: for LayerNorm models only (gpt2, "
        "gpt_neox); ",
        config.what, " normalizes with RMSNorm, which the mean changes"));
  }
  return absl::OkStatus();
}

absl::StatusOr<LlamaWeights> LoadHfLlamaWeights(const HfModelOptions& options) {
  ASSIGN_OR_RETURN(HfConfig json, HfConfig::Read(options.dir));
  ASSIGN_OR_RETURN(LlamaConfig config, ReadHfLlamaConfig(json));
  RETURN_IF_ERROR(CheckHfLlamaOptions(config, options));
  ASSIGN_OR_RETURN(HfTensors read, ReadHfTensors(options.dir, ExpectedTensors(config), kPrefix));
  const std::map<std::string, at::Tensor>& t = read.tensors;
  auto optional = [&](const std::string& name) {
    auto it = t.find(name);
    return it == t.end() ? at::Tensor() : it->second;
  };
  LlamaWeights w;
  w.config = config;
  w.W_E = t.at("embed_tokens.weight");
  w.W_U = config.tied_embeddings ? w.W_E : t.at("lm_head.weight");
  for (int64_t l = 0; l < config.n_layers; ++l) {
    const std::string p = absl::StrCat("layers.", l, ".");
    LlamaBlock b;
    b.attn_norm = t.at(p + "input_layernorm.weight");
    b.W_q = t.at(p + "self_attn.q_proj.weight");
    b.W_k = t.at(p + "self_attn.k_proj.weight");
    b.W_v = t.at(p + "self_attn.v_proj.weight");
    b.W_o = t.at(p + "self_attn.o_proj.weight");
    b.b_q = optional(p + "self_attn.q_proj.bias");
    b.b_k = optional(p + "self_attn.k_proj.bias");
    b.b_v = optional(p + "self_attn.v_proj.bias");
    b.b_o = optional(p + "self_attn.o_proj.bias");
    if (config.post_norms) {
      b.post_attn_norm = t.at(p + "post_attention_layernorm.weight");
      b.mlp_norm = t.at(p + "pre_feedforward_layernorm.weight");
      b.post_mlp_norm = t.at(p + "post_feedforward_layernorm.weight");
    } else {
      b.mlp_norm = t.at(p + "post_attention_layernorm.weight");
    }
    if (config.norm_gain_offset) {
      for (at::Tensor* norm : {&b.attn_norm, &b.mlp_norm, &b.post_attn_norm, &b.post_mlp_norm}) {
        if (norm->defined()) *norm = *norm + 1;
      }
    }
    b.W_gate = t.at(p + "mlp.gate_proj.weight");
    b.W_up = t.at(p + "mlp.up_proj.weight");
    b.W_down = t.at(p + "mlp.down_proj.weight");
    b.b_gate = optional(p + "mlp.gate_proj.bias");
    b.b_up = optional(p + "mlp.up_proj.bias");
    b.b_down = optional(p + "mlp.down_proj.bias");
    w.blocks.push_back(std::move(b));
  }
  w.weight_hash = read.Hash(LlamaConfigFingerprint(config));
  w.model_id = absl::StrCat("huggingface:", json.model_type(), ":", options.dir);
  return w;
}

}  // namespace latentd::engine
