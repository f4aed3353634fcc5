#include "engine/hf_llama.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace latentd::engine {
namespace {

// Where the language model's tensors are: LlamaForCausalLM's "model.", or in Gemma 3's
// multimodal checkpoints "language_model.model." (as released) or "model.language_model."
// (as newer transformers save them). Names without a prefix are taken too.
std::vector<std::string> TensorPrefixes(const std::string& model_type) {
  if (model_type == "gemma3") return {"language_model.model.", "model.language_model."};
  return {"model."};
}

std::vector<HfTensorSpec> ExpectedTensors(const LlamaConfig& c) {
  const int64_t d = c.d_model, f = c.d_mlp, q = c.n_heads * c.head_dim,
                kv = c.n_kv_heads * c.head_dim;
  std::vector<HfTensorSpec> out = {{"embed_tokens.weight", {c.vocab_size, d}}};
  if (!c.tied_embeddings) out.push_back({"lm_head.weight", {c.vocab_size, d}});
  out.push_back({"norm.weight", {d}, /*optional=*/true});
  for (int64_t l = 0; l < c.n_layers; ++l) {
    const std::string p = absl::StrCat("layers.", l, ".");
    if (c.pre_norms) out.push_back({p + "input_layernorm.weight", {d}});
    if (c.fused_projections) {
      out.push_back({p + "self_attn.qkv_proj.weight", {q + 2 * kv, d}});
    } else {
      out.push_back({p + "self_attn.q_proj.weight", {q, d}});
      out.push_back({p + "self_attn.k_proj.weight", {kv, d}});
      out.push_back({p + "self_attn.v_proj.weight", {kv, d}});
    }
    out.push_back({p + "self_attn.o_proj.weight", {d, q}});
    if (c.qk_norm || c.qk_norm_full) {
      out.push_back({p + "self_attn.q_norm.weight", {c.qk_norm_full ? q : c.head_dim}});
      out.push_back({p + "self_attn.k_norm.weight", {c.qk_norm_full ? kv : c.head_dim}});
    }
    if (c.qkv_bias) {
      out.push_back({p + "self_attn.q_proj.bias", {q}});
      out.push_back({p + "self_attn.k_proj.bias", {kv}});
      out.push_back({p + "self_attn.v_proj.bias", {kv}});
    }
    if (c.o_bias) out.push_back({p + "self_attn.o_proj.bias", {d}});
    out.push_back({p + "post_attention_layernorm.weight", {d}});
    if (c.post_norms) {  // Gemma 2, OLMo 2: post_attention_layernorm is attention's post-norm
      if (c.pre_norms) out.push_back({p + "pre_feedforward_layernorm.weight", {d}});
      out.push_back({p + "post_feedforward_layernorm.weight", {d}});
    }
    if (c.fused_projections) {
      out.push_back({p + "mlp.gate_up_proj.weight", {2 * f, d}});
    } else {
      out.push_back({p + "mlp.gate_proj.weight", {f, d}});
      out.push_back({p + "mlp.up_proj.weight", {f, d}});
    }
    out.push_back({p + "mlp.down_proj.weight", {d, f}});
    if (c.mlp_bias) {
      out.push_back({p + "mlp.gate_proj.bias", {f}});
      out.push_back({p + "mlp.up_proj.bias", {f}});
      out.push_back({p + "mlp.down_proj.bias", {d}});
    }
  }
  return out;
}

// Which layers slide (Gemma 3): config.json's layer_types ("sliding_attention" /
// "full_attention") when given, else every layer but each sliding_window_pattern-th.
absl::StatusOr<std::vector<bool>> SlidingLayers(const HfConfig& j, int64_t n_layers) {
  std::vector<bool> sliding(n_layers);
  if (j.Has("layer_types")) {
    const nlohmann::json& types = j.json()["layer_types"];
    if (!types.is_array() || static_cast<int64_t>(types.size()) != n_layers) {
      return j.Bad(absl::StrCat("layer_types must list num_hidden_layers = ", n_layers, " types"));
    }
    for (int64_t l = 0; l < n_layers; ++l) {
      const std::string type = types[l].is_string() ? types[l].get<std::string>() : "";
      if (type != "sliding_attention" && type != "full_attention") {
        return j.Bad(absl::StrCat("layer_types[", l, "] is neither \"sliding_attention\" nor ",
                                  "\"full_attention\""));
      }
      sliding[l] = type == "sliding_attention";
    }
    return sliding;
  }
  ASSIGN_OR_RETURN(const int64_t pattern, j.Integer("sliding_window_pattern", 6, 1, 1 << 20));
  for (int64_t l = 0; l < n_layers; ++l) sliding[l] = (l + 1) % pattern != 0;
  return sliding;
}

// What Hugging Face's config class for each model_type assumes for a field config.json leaves
// out. They matter: a nested config (Gemma 3's text_config) is saved with only the fields that
// differ from these.
struct ConfigDefaults {
  int64_t vocab_size, hidden_size, intermediate_size, num_hidden_layers, num_attention_heads;
  int64_t num_key_value_heads;  // 0: num_attention_heads
  int64_t head_dim;             // 0: hidden_size / num_attention_heads
  int64_t max_position_embeddings;
  double rope_theta;
  double rms_norm_eps = 1e-6;
};

ConfigDefaults DefaultsFor(const std::string& type) {
  if (type == "mistral") return {32000, 4096, 14336, 32, 32, 8, 0, 4096 * 32, 10000.0};
  if (type == "qwen2") return {151936, 4096, 22016, 32, 32, 32, 0, 32768, 10000.0};
  if (type == "qwen3") return {151936, 4096, 22016, 32, 32, 32, 128, 32768, 10000.0};
  if (type == "gemma") return {256000, 3072, 24576, 28, 16, 16, 256, 8192, 10000.0};
  if (type == "gemma2") return {256000, 2304, 9216, 26, 8, 4, 256, 8192, 10000.0};
  if (type == "gemma3_text") return {262208, 2304, 9216, 26, 8, 4, 256, 131072, 1e6};
  if (type == "phi3") return {32064, 3072, 8192, 32, 32, 0, 0, 4096, 10000.0, 1e-5};
  if (type == "olmo2") return {50304, 4096, 11008, 32, 32, 0, 0, 2048, 10000.0, 1e-5};
  return {32000, 4096, 11008, 32, 32, 0, 0, 2048, 10000.0};  // llama
}

// LongRoPE's rope_scaling (Phi-3): short_factor and long_factor, one per rotated pair; the
// original context from config.json's original_max_position_embeddings (else rope_scaling's,
// else max_position_embeddings); the factor by which the context grew from it (else
// rope_scaling.factor) sets the attention factor, unless rope_scaling gives attention_factor:
// sqrt(1 + ln(factor) / ln(original)) when the context grew, 1 otherwise.
absl::Status ReadLongRope(const HfConfig& j, const nlohmann::json& r, int64_t max_positions,
                          LlamaConfig* c) {
  auto factors = [&](const char* key, std::vector<double>* out) -> absl::Status {
    if (!r.contains(key) || !r[key].is_array() || r[key].empty()) {
      return j.Bad(absl::StrCat("rope_scaling.", key, " must be a list of positive numbers"));
    }
    for (const nlohmann::json& v : r[key]) {
      if (!v.is_number() || !(v.get<double>() > 0)) {
        return j.Bad(
            absl::StrCat("rope_scaling.", key, " holds ", v.dump(), ", not a positive number"));
      }
      out->push_back(v.get<double>());
    }
    return absl::OkStatus();
  };
  RETURN_IF_ERROR(factors("short_factor", &c->rope_short_factors));
  RETURN_IF_ERROR(factors("long_factor", &c->rope_long_factors));
  const int64_t pairs = (c->rotary_dim > 0 ? c->rotary_dim : c->head_dim) / 2;
  if (static_cast<int64_t>(c->rope_short_factors.size()) != pairs ||
      static_cast<int64_t>(c->rope_long_factors.size()) != pairs) {
    return j.Bad(absl::StrCat("rope_scaling.short_factor and long_factor need ", pairs,
                              " entries (one per rotated pair of dims), not ",
                              c->rope_short_factors.size(), " and ", c->rope_long_factors.size()));
  }
  double factor = 0;
  int64_t original = 0;
  if (j.Has("original_max_position_embeddings")) {
    ASSIGN_OR_RETURN(original, j.Integer("original_max_position_embeddings", 0, 1, 1 << 24));
    factor = static_cast<double>(max_positions) / static_cast<double>(original);
  } else if (r.contains("original_max_position_embeddings") &&
             r["original_max_position_embeddings"].is_number_integer() &&
             r["original_max_position_embeddings"].get<int64_t>() > 0) {
    original = r["original_max_position_embeddings"].get<int64_t>();
    factor = static_cast<double>(max_positions) / static_cast<double>(original);
  } else {
    original = max_positions;
    if (r.contains("factor") && r["factor"].is_number()) factor = r["factor"].get<double>();
  }
  c->rope_original_context = original;
  if (r.contains("attention_factor") && r["attention_factor"].is_number()) {
    c->rope_attention_factor = r["attention_factor"].get<double>();
  } else if (factor > 1 && original > 1) {
    c->rope_attention_factor =
        std::sqrt(1 + std::log(factor) / std::log(static_cast<double>(original)));
  }
  return absl::OkStatus();
}

}  // namespace

bool IsHfLlamaType(const std::string& t) {
  return t == "llama" || t == "mistral" || t == "qwen2" || t == "qwen3" || t == "gemma" ||
         t == "gemma2" || t == "gemma3_text" || t == "gemma3" || t == "phi3" || t == "olmo2";
}

absl::StatusOr<LlamaConfig> ReadHfLlamaConfig(const HfConfig& j) {
  const std::string& type = j.model_type();
  if (!IsHfLlamaType(type)) {
    return j.Bad(absl::StrCat(
        "model_type \"", type,
        "\" is not llama, mistral, qwen2, qwen3, gemma, gemma2, gemma3, phi3 or olmo2"));
  }
  if (type == "gemma3") {  // the multimodal checkpoint: the language model's config is nested
    ASSIGN_OR_RETURN(const HfConfig text, j.Nested("text_config", "gemma3_text"));
    if (text.model_type() != "gemma3_text") {
      return text.Bad(absl::StrCat("model_type \"", text.model_type(), "\" is not gemma3_text"));
    }
    return ReadHfLlamaConfig(text);
  }
  const bool gemma3 = type == "gemma3_text";
  const ConfigDefaults defaults = DefaultsFor(type);
  LlamaConfig c;
  c.what = absl::StrCat("the ", type, " model in ", j.dir());
  ASSIGN_OR_RETURN(c.d_model, j.Integer("hidden_size", defaults.hidden_size, 1, 1 << 17));
  ASSIGN_OR_RETURN(c.n_layers, j.Integer("num_hidden_layers", defaults.num_hidden_layers, 1, 1024));
  ASSIGN_OR_RETURN(c.n_heads,
                   j.Integer("num_attention_heads", defaults.num_attention_heads, 1, 1 << 12));
  ASSIGN_OR_RETURN(
      c.n_kv_heads,
      j.Integer("num_key_value_heads",
                defaults.num_key_value_heads > 0 ? defaults.num_key_value_heads : c.n_heads, 1,
                c.n_heads));
  if (c.n_heads % c.n_kv_heads != 0) {
    return j.Bad(absl::StrCat("num_key_value_heads = ", c.n_kv_heads,
                              " does not divide num_attention_heads = ", c.n_heads));
  }
  if (!j.Has("head_dim") && defaults.head_dim == 0 && c.d_model % c.n_heads != 0) {
    return j.Bad(absl::StrCat("num_attention_heads = ", c.n_heads,
                              " does not divide hidden_size = ", c.d_model,
                              " (and there is no head_dim)"));
  }
  ASSIGN_OR_RETURN(
      c.head_dim,
      j.Integer("head_dim", defaults.head_dim > 0 ? defaults.head_dim : c.d_model / c.n_heads, 2,
                1 << 12));
  if (c.head_dim % 2 != 0) return j.Bad(absl::StrCat("head_dim = ", c.head_dim, " is odd"));
  ASSIGN_OR_RETURN(c.d_mlp, j.Integer("intermediate_size", defaults.intermediate_size, 1, 1 << 20));
  ASSIGN_OR_RETURN(c.vocab_size, j.Integer("vocab_size", defaults.vocab_size, 1, 1 << 24));
  ASSIGN_OR_RETURN(c.context_length, j.Integer("max_position_embeddings",
                                               defaults.max_position_embeddings, 1, 1 << 24));
  ASSIGN_OR_RETURN(c.norm_eps, j.PositiveNumber("rms_norm_eps", defaults.rms_norm_eps));
  ASSIGN_OR_RETURN(c.rope_theta, j.PositiveNumber("rope_theta", defaults.rope_theta));
  const bool gemma = type == "gemma" || type == "gemma2" || gemma3;
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
  if (type == "gemma2" || gemma3) {
    c.post_norms = true;
    // Gemma 3 dropped the soft-capping (null in its configs); Gemma 2 caps at 50 by default.
    ASSIGN_OR_RETURN(c.attn_softcap,
                     j.PositiveNumber("attn_logit_softcapping", gemma3 ? 0.0 : 50.0));
    ASSIGN_OR_RETURN(c.final_logit_softcap,
                     j.PositiveNumber("final_logit_softcapping", gemma3 ? 0.0 : 30.0));
    ASSIGN_OR_RETURN(const double scalar, j.PositiveNumber("query_pre_attn_scalar", 256.0));
    c.attn_scale = 1.0 / std::sqrt(scalar);
  }
  c.qk_norm = type == "qwen3" || gemma3;
  if (type == "olmo2") {
    c.pre_norms = false;
    c.post_norms = true;
    c.qk_norm_full = true;
    c.norm_gain_float32 = true;
  }
  if (type == "phi3") {
    c.fused_projections = true;
    ASSIGN_OR_RETURN(const double rotary, j.PositiveNumber("partial_rotary_factor", 1.0));
    const auto rotary_dim = static_cast<int64_t>(static_cast<double>(c.head_dim) * rotary);
    if (rotary > 1 || rotary_dim < 2 || rotary_dim % 2 != 0) {
      return j.Bad(absl::StrCat("partial_rotary_factor = ", rotary, " rotates ", rotary_dim,
                                " of each head's ", c.head_dim, " dims; it must be an even count"));
    }
    if (rotary_dim < c.head_dim) c.rotary_dim = rotary_dim;
  }
  if (gemma3) {
    // Local layers see a window of the latest positions and rotate with their own base.
    ASSIGN_OR_RETURN(c.sliding_window, j.Integer("sliding_window", 4096, 1, 1 << 24));
    ASSIGN_OR_RETURN(c.sliding_layers, SlidingLayers(j, c.n_layers));
    ASSIGN_OR_RETURN(c.rope_local_theta, j.PositiveNumber("rope_local_base_freq", 10000.0));
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
    if (rope_type == "linear") {
      RETURN_IF_ERROR(number("factor", &c.rope_linear_factor));
    } else if (rope_type == "llama3") {
      double original = 0;
      RETURN_IF_ERROR(number("factor", &c.rope_factor));
      RETURN_IF_ERROR(number("low_freq_factor", &c.rope_low_freq_factor));
      RETURN_IF_ERROR(number("high_freq_factor", &c.rope_high_freq_factor));
      RETURN_IF_ERROR(number("original_max_position_embeddings", &original));
      c.rope_original_context = static_cast<int64_t>(original);
      if (!(c.rope_high_freq_factor > c.rope_low_freq_factor)) {
        return j.Bad("rope_scaling.high_freq_factor must exceed low_freq_factor");
      }
    } else if (rope_type == "longrope" || rope_type == "su") {
      RETURN_IF_ERROR(ReadLongRope(j, r, c.context_length, &c));
    } else if (rope_type != "default") {
      return j.Bad(absl::StrCat(
          "rope_scaling ", r.dump(),
          ": only null, \"default\", \"linear\", \"llama3\" and \"longrope\" are read"));
    }
  }
  // Mistral's window is on unless null (Mistral v0.2 on); Gemma 2's alternate layers always
  // have one (4096 when left out). Within the window attention is full, so capping the
  // sequence there is exact. (Gemma 3 windows its local layers instead: 512 or 1024
  // positions, too few to cap at.)
  const bool mistral_or_gemma2 = type == "mistral" || type == "gemma2";
  // Phi-3's config has no use_sliding_window: a sliding_window it gives is on.
  ASSIGN_OR_RETURN(
      const bool use_window,
      j.Boolean("use_sliding_window", /*fallback=*/mistral_or_gemma2 || type == "phi3"));
  const bool window_null =
      j.json().contains("sliding_window") && j.json()["sliding_window"].is_null();
  if (use_window && !gemma3 && !window_null) {
    ASSIGN_OR_RETURN(const int64_t window,
                     j.Integer("sliding_window", mistral_or_gemma2 ? 4096 : 0, 0, 1 << 24));
    if (window > 0) c.context_length = std::min(c.context_length, window);
  }
  return c;
}

absl::StatusOr<LlamaConfig> CheckHfLlama(const std::string& dir) {
  ASSIGN_OR_RETURN(HfConfig json, HfConfig::Read(dir));
  ASSIGN_OR_RETURN(LlamaConfig config, ReadHfLlamaConfig(json));
  RETURN_IF_ERROR(CheckHfTensors(dir, ExpectedTensors(config), TensorPrefixes(json.model_type())));
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
  config.bfloat16 = options.bfloat16;
  ASSIGN_OR_RETURN(HfTensors read,
                   ReadHfTensors(options.dir, ExpectedTensors(config),
                                 TensorPrefixes(json.model_type()), options.weight_dtype()));
  const std::map<std::string, at::Tensor>& t = read.tensors;
  auto optional = [&](const std::string& name) {
    auto it = t.find(name);
    return it == t.end() ? at::Tensor() : it->second;
  };
  const int64_t q = config.n_heads * config.head_dim, kv = config.n_kv_heads * config.head_dim,
                f = config.d_mlp;
  LlamaWeights w;
  w.config = config;
  w.W_E = t.at("embed_tokens.weight");
  w.W_U = config.tied_embeddings ? w.W_E : t.at("lm_head.weight");
  w.final_norm = optional("norm.weight");
  if (w.final_norm.defined() && config.norm_gain_offset) {
    w.final_norm = w.final_norm.to(at::kFloat) + 1;  // Gemma's 1 + w, as for every norm
  } else if (w.final_norm.defined() && config.norm_gain_float32) {
    w.final_norm = w.final_norm.to(at::kFloat);
  }
  for (int64_t l = 0; l < config.n_layers; ++l) {
    const std::string p = absl::StrCat("layers.", l, ".");
    LlamaBlock b;
    b.attn_norm = optional(p + "input_layernorm.weight");
    if (config.fused_projections) {  // rows: q, then k, then v
      const at::Tensor& qkv = t.at(p + "self_attn.qkv_proj.weight");
      b.W_q = qkv.narrow(0, 0, q);
      b.W_k = qkv.narrow(0, q, kv);
      b.W_v = qkv.narrow(0, q + kv, kv);
    } else {
      b.W_q = t.at(p + "self_attn.q_proj.weight");
      b.W_k = t.at(p + "self_attn.k_proj.weight");
      b.W_v = t.at(p + "self_attn.v_proj.weight");
    }
    b.W_o = t.at(p + "self_attn.o_proj.weight");
    b.b_q = optional(p + "self_attn.q_proj.bias");
    b.b_k = optional(p + "self_attn.k_proj.bias");
    b.b_v = optional(p + "self_attn.v_proj.bias");
    b.b_o = optional(p + "self_attn.o_proj.bias");
    b.q_norm = optional(p + "self_attn.q_norm.weight");
    b.k_norm = optional(p + "self_attn.k_norm.weight");
    if (config.post_norms) {
      b.post_attn_norm = t.at(p + "post_attention_layernorm.weight");
      b.mlp_norm = optional(p + "pre_feedforward_layernorm.weight");
      b.post_mlp_norm = t.at(p + "post_feedforward_layernorm.weight");
    } else {
      b.mlp_norm = t.at(p + "post_attention_layernorm.weight");
    }
    if (config.norm_gain_offset) {
      for (at::Tensor* norm :
           {&b.attn_norm, &b.mlp_norm, &b.post_attn_norm, &b.post_mlp_norm, &b.q_norm, &b.k_norm}) {
        // 1 + w in float32, as Gemma computes it whatever the model's dtype
        if (norm->defined()) *norm = norm->to(at::kFloat) + 1;
      }
    }
    if (config.norm_gain_float32) {
      for (at::Tensor* norm : {&b.post_attn_norm, &b.post_mlp_norm, &b.q_norm, &b.k_norm}) {
        if (norm->defined()) *norm = norm->to(at::kFloat);
      }
    }
    if (config.fused_projections) {  // rows: gate, then up
      const at::Tensor& gate_up = t.at(p + "mlp.gate_up_proj.weight");
      b.W_gate = gate_up.narrow(0, 0, f);
      b.W_up = gate_up.narrow(0, f, f);
    } else {
      b.W_gate = t.at(p + "mlp.gate_proj.weight");
      b.W_up = t.at(p + "mlp.up_proj.weight");
    }
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
