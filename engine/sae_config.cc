#include "engine/sae_config.h"

#include <dirent.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"
#include "common/safetensors.h"
#include "common/status_macros.h"
#include "engine/circuit_tracer.h"
#include "engine/hook_name.h"
#include "engine/npz.h"
#include "engine/torch_pickle.h"

namespace latentd::engine {

using nlohmann::json;

const char* SaeArchitectureName(SaeArchitecture a) {
  switch (a) {
    case SaeArchitecture::kRelu:
      return "relu";
    case SaeArchitecture::kTopK:
      return "topk";
    case SaeArchitecture::kJumpRelu:
      return "jumprelu";
    case SaeArchitecture::kGated:
      return "gated";
  }
  return "?";
}

const char* InputNormalizationName(InputNormalization n) {
  switch (n) {
    case InputNormalization::kNone:
      return "none";
    case InputNormalization::kConstantNormRescale:
      return "constant_norm_rescale";
    case InputNormalization::kLayerNorm:
      return "layer_norm";
  }
  return "?";
}

std::string DescribeSaeReading(const SaeConfig& cfg) {
  std::vector<std::string> parts;
  if (cfg.state_dict_class) {
    parts.push_back(absl::StrCat(
        StateDictTensorsOf(*cfg.state_dict_class).module, " read as a ",
        SaeArchitectureName(cfg.architecture), " SAE",
        cfg.architecture == SaeArchitecture::kTopK ? absl::StrCat(" (k ", cfg.k, ")") : ""));
  }
  if (cfg.crosscoder_sources > 0) {
    parts.push_back(
        absl::StrCat("a crosscoder of ", cfg.crosscoder_sources, " hooks, read as a ",
                     SaeArchitectureName(cfg.architecture), " SAE over them side by side",
                     cfg.architecture == SaeArchitecture::kJumpRelu
                         ? " (BatchTopKCrossCoder's threshold over each latent's decoder-norm sum)"
                         : ""));
  }
  if (cfg.input_normalization != InputNormalization::kNone) {
    parts.push_back(absl::StrCat(
        "each token's activation is normalized first (normalize_activations ",
        InputNormalizationName(cfg.input_normalization),
        ", as SAELens does), and undone on the reconstruction the fit and downstream loss use"));
  }
  if (cfg.finetuning_scaling_factor) {
    parts.push_back("its finetuning_scaling_factor scales the latents it decodes");
  }
  return absl::StrJoin(parts, "; ");
}

absl::StatusOr<SaeConfig> ParseSaeConfigJson(const std::string& text) {
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    return absl::InvalidArgumentError("cfg.json: not a JSON object");
  }
  auto get_int = [&](const char* key, int64_t* out) -> absl::Status {
    if (!j.contains(key)) return absl::OkStatus();
    if (!j[key].is_number_integer()) {
      return absl::InvalidArgumentError(absl::StrCat("cfg.json: ", key, " is not an integer"));
    }
    *out = j[key].get<int64_t>();
    return absl::OkStatus();
  };
  SaeConfig cfg;
  int64_t k = 0;
  RETURN_IF_ERROR(get_int("d_in", &cfg.d_in));
  RETURN_IF_ERROR(get_int("num_latents", &cfg.d_sae));
  RETURN_IF_ERROR(get_int("d_sae", &cfg.d_sae));
  RETURN_IF_ERROR(get_int("k", &k));
  if (j.contains("activation_fn_kwargs") && j["activation_fn_kwargs"].is_object() &&
      j["activation_fn_kwargs"].contains("k") &&
      j["activation_fn_kwargs"]["k"].is_number_integer()) {
    k = j["activation_fn_kwargs"]["k"].get<int64_t>();
  }
  // The activation function where cfg.json names it apart from the architecture: SAELens 3-5's
  // activation_fn_str (its TopK SAEs, OpenAI's GPT-2 ones and SAEBench's among them, say
  // "architecture": "standard" with "activation_fn_str": "topk"), mats_sae_training's
  // activation_fn, sparsify's activation. "" when none says.
  std::string activation;
  for (const char* key : {"activation_fn_str", "activation_fn", "activation"}) {
    if (!j.contains(key) || j[key].is_null()) continue;
    if (!j[key].is_string()) {
      return absl::InvalidArgumentError(absl::StrCat("cfg.json: ", key, " is not a string"));
    }
    activation = j[key].get<std::string>();
    const bool names_the_architecture =
        j.contains("architecture") && j["architecture"] == activation;
    if (activation != "topk" && activation != "relu" && !names_the_architecture) {
      return absl::InvalidArgumentError(absl::StrCat(
          "cfg.json: ", key, " \"", activation,
          "\" is not an activation latentd computes (relu, topk; or the architectures standard, "
          "topk, jumprelu, gated): the latents would not be this SAE's"));
    }
    break;
  }
  // A signed TopK (sparsify's "signed", SAELens' conversion of it in activation_fn_kwargs).
  const bool is_signed =
      j.value("signed", json()) == true ||
      (j.contains("activation_fn_kwargs") && j["activation_fn_kwargs"].is_object() &&
       j["activation_fn_kwargs"].value("signed", json()) == true);
  if (is_signed) {
    return absl::InvalidArgumentError(
        "cfg.json: signed true keeps the k largest |pre-activations| with their signs, which "
        "latentd's TopK (the k largest, ReLU'd) does not compute");
  }
  std::string arch;
  if (j.contains("architecture")) {
    if (!j["architecture"].is_string()) {
      return absl::InvalidArgumentError("cfg.json: architecture is not a string");
    }
    arch = j["architecture"].get<std::string>();
  } else if (activation == "topk") {
    arch = "topk";
  } else if (k > 0) {
    arch = "topk";  // sparsify writes no architecture
  } else {
    arch = "standard";
  }
  // SAELens names a transcoder by its encoder, "skip" when it has W_skip, then "transcoder".
  if (arch == "transcoder" || absl::EndsWith(arch, "_transcoder")) {
    cfg.transcoder = true;
    absl::string_view base = arch;
    absl::ConsumeSuffix(&base, "transcoder");
    absl::ConsumeSuffix(&base, "_");
    if (base == "skip") {
      cfg.skip = true;
      base = "";
    } else if (absl::ConsumeSuffix(&base, "_skip")) {
      cfg.skip = true;
    }
    if (!base.empty() && base != "relu" && base != "topk" && base != "jumprelu") {
      return absl::InvalidArgumentError(absl::StrCat(
          "cfg.json: unsupported architecture \"", arch,
          "\" (transcoders: transcoder, skip_transcoder, jumprelu_transcoder, topk_transcoder, "
          "jumprelu_skip_transcoder, topk_skip_transcoder)"));
    }
    arch = base.empty() ? "standard" : std::string(base);
  }
  if (arch == "standard" || arch == "relu") {
    cfg.architecture = activation == "topk" ? SaeArchitecture::kTopK : SaeArchitecture::kRelu;
  } else if (arch == "topk") {
    cfg.architecture = SaeArchitecture::kTopK;
  } else if (arch == "jumprelu") {
    cfg.architecture = SaeArchitecture::kJumpRelu;
  } else if (arch == "gated") {
    cfg.architecture = SaeArchitecture::kGated;
  } else {
    return absl::InvalidArgumentError(absl::StrCat("cfg.json: unsupported architecture \"", arch,
                                                   "\" (standard, relu, topk, jumprelu, gated)"));
  }
  if (cfg.d_in <= 0) return absl::InvalidArgumentError("cfg.json: d_in must be positive");
  if (cfg.d_sae <= 0) return absl::InvalidArgumentError("cfg.json: d_sae must be positive");
  if (cfg.architecture == SaeArchitecture::kTopK) {
    if (k <= 0 || k > cfg.d_sae) {
      return absl::InvalidArgumentError(
          absl::StrCat("cfg.json: k = ", k, " must be in [1, d_sae = ", cfg.d_sae, "]"));
    }
    cfg.k = static_cast<int32_t>(k);
  }
  if (j.contains("apply_b_dec_to_input")) {
    if (!j["apply_b_dec_to_input"].is_boolean()) {
      return absl::InvalidArgumentError("cfg.json: apply_b_dec_to_input is not a boolean");
    }
    cfg.apply_b_dec_to_input = j["apply_b_dec_to_input"].get<bool>();
  }
  // sparsify: transcode (+ skip_connection) in place of an architecture.
  if (j.contains("transcode") && j["transcode"] == true) cfg.transcoder = true;
  if (cfg.transcoder && j.contains("skip_connection") && j["skip_connection"] == true) {
    cfg.skip = true;
  }
  if (cfg.transcoder) {
    cfg.d_out = cfg.d_in;
    RETURN_IF_ERROR(get_int("d_out", &cfg.d_out));
    if (cfg.d_out <= 0) return absl::InvalidArgumentError("cfg.json: d_out must be positive");
    if (j.contains("hook_name_out") && j["hook_name_out"].is_string()) {
      cfg.hook_name_out = j["hook_name_out"];
    }
    // Its b_dec is on the output side: no transcoder subtracts it from the input (SAELens
    // ignores apply_b_dec_to_input for them, sparsify skips it when transcoding).
    cfg.apply_b_dec_to_input = false;
  }
  // What the SAE was trained on: top-level fields, or SAELens 6's "metadata" object.
  static const json kAbsent;
  auto about = [&](const char* key) -> const json& {
    if (j.contains(key)) return j[key];
    if (j.contains("metadata") && j["metadata"].is_object() && j["metadata"].contains(key)) {
      return j["metadata"][key];
    }
    return kAbsent;
  };
  if (about("hook_name").is_string()) {
    cfg.hook_name = about("hook_name");
  } else if (j.contains("hook_point") && j["hook_point"].is_string()) {
    cfg.hook_name = j["hook_point"];  // SAELens before 3.0 and mats_sae_training
  }
  if (about("model_name").is_string()) cfg.model_name = about("model_name");
  if (!about("hook_head_index").is_null()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cfg.json: hook_head_index ", about("hook_head_index").dump(),
        ": an SAE of one attention head's activations, which latentd does not extract (its "
        "blocks.L.attn.hook_z holds every head side by side)"));
  }
  if (j.contains("matryoshka_widths") && j["matryoshka_widths"].is_array()) {
    for (const json& w : j["matryoshka_widths"]) {
      if (w.is_number_integer()) cfg.matryoshka_widths.push_back(w.get<int64_t>());
    }
  }
  if (about("model_from_pretrained_kwargs").is_object()) {
    const json& kwargs = about("model_from_pretrained_kwargs");
    if (kwargs.contains("center_writing_weights") &&
        kwargs["center_writing_weights"].is_boolean()) {
      cfg.center_writing_weights = kwargs["center_writing_weights"].get<bool>();
    }
  }
  // SAELens options that change what the encoder computes from the hook's activations: encoding
  // without them would store latents the SAE never gives, silently, so those latentd cannot
  // reproduce are refused.
  if (j.contains("normalize_activations") && !j["normalize_activations"].is_null()) {
    const json& norm = j["normalize_activations"];
    if (norm == "constant_norm_rescale") {
      cfg.input_normalization = InputNormalization::kConstantNormRescale;
    } else if (norm == "layer_norm") {
      cfg.input_normalization = InputNormalization::kLayerNorm;
    } else if (norm == "expected_average_only_in") {
      return absl::InvalidArgumentError(
          "cfg.json: normalize_activations \"expected_average_only_in\" scales the input by a "
          "factor that SAELens' from_pretrained takes from its release directory "
          "(norm_scaling_factor), not from cfg.json, so latentd cannot know it: fold it into the "
          "weights (W_enc * f, W_dec / f, b_dec / f, as SAELens' "
          "fold_activation_norm_scaling_factor does) and set normalize_activations to \"none\"");
    } else if (!(norm == "none" || norm == "")) {
      return absl::InvalidArgumentError(absl::StrCat(
          "cfg.json: normalize_activations ", norm.dump(),
          " is not one latentd knows: the latents would not be this SAE's. Supported: \"none\", "
          "\"constant_norm_rescale\", \"layer_norm\""));
    }
    if (cfg.transcoder && cfg.input_normalization != InputNormalization::kNone) {
      return absl::InvalidArgumentError(absl::StrCat(
          "cfg.json: normalize_activations ", norm.dump(),
          " on a transcoder: SAELens would undo the input's normalization on the output hook's "
          "prediction, which latentd does not do. Supported for transcoders: \"none\""));
    }
  }
  if (j.contains("finetuning_scaling_factor") && j["finetuning_scaling_factor"] == true) {
    cfg.finetuning_scaling_factor = true;
  }
  if (j.contains("rescale_acts_by_decoder_norm") && j["rescale_acts_by_decoder_norm"] == true) {
    return absl::InvalidArgumentError(
        "cfg.json: rescale_acts_by_decoder_norm true scales each latent by its decoder norm "
        "before the activation, which latentd does not do: the latents would not be this SAE's");
  }
  return cfg;
}

StateDictTensors StateDictTensorsOf(StateDictClass c) {
  StateDictTensors t;
  // nn.Linear encoder and decoder (weights stored [out, in]); b_dec names the decoder-side bias.
  auto linear = [&t](const char* module, const char* b_dec) {
    t.module = module;
    t.W_enc = "encoder.weight";
    t.b_enc = "encoder.bias";
    t.W_dec = "decoder.weight";
    t.b_dec = b_dec;
    t.linear = true;
  };
  // Parameters in SAELens' own names and layout.
  auto parameters = [&t](const char* module) {
    t.module = module;
    t.W_enc = "W_enc";
    t.b_enc = "b_enc";
    t.W_dec = "W_dec";
    t.b_dec = "b_dec";
  };
  // BatchTopK at inference: one learned threshold for every latent, on ReLU'd values.
  auto batch_threshold = [&t] {
    t.architecture = SaeArchitecture::kJumpRelu;
    t.threshold = "threshold";
    t.scalar_threshold = true;
  };
  switch (c) {
    case StateDictClass::kAutoEncoder:
      linear("dictionary_learning's AutoEncoder", "bias");
      break;
    case StateDictClass::kAutoEncoderNew:
      linear("dictionary_learning's AutoEncoderNew", "decoder.bias");
      t.apply_b_dec_to_input = false;
      break;
    case StateDictClass::kGoodfire:
      linear("Goodfire's SparseAutoEncoder", "decoder_linear.bias");
      t.W_enc = "encoder_linear.weight";
      t.b_enc = "encoder_linear.bias";
      t.W_dec = "decoder_linear.weight";
      t.apply_b_dec_to_input = false;
      break;
    case StateDictClass::kTopK:
      linear("dictionary_learning's AutoEncoderTopK", "b_dec");
      t.architecture = SaeArchitecture::kTopK;
      break;
    case StateDictClass::kBatchTopK:
      linear("dictionary_learning's BatchTopKSAE", "b_dec");
      batch_threshold();
      break;
    case StateDictClass::kMatryoshkaBatchTopK:
      parameters("dictionary_learning's MatryoshkaBatchTopKSAE");
      batch_threshold();
      break;
    case StateDictClass::kJumpRelu:
      parameters("dictionary_learning's JumpReluAutoEncoder");
      t.architecture = SaeArchitecture::kJumpRelu;
      t.apply_b_dec_to_input = false;
      t.threshold = "threshold";
      t.decoder_norm_scaled = true;
      break;
    case StateDictClass::kGated:
      linear("dictionary_learning's GatedAutoEncoder", "decoder_bias");
      t.architecture = SaeArchitecture::kGated;
      t.b_enc = "gate_bias";
      t.decoder_norm_scaled = true;
      t.r_mag = "r_mag";
      t.b_mag = "mag_bias";
      break;
  }
  return t;
}

namespace {

// The config of a state-dict class before its tensors say its widths: its encoder, whether b_dec
// is subtracted first.
SaeConfig StateDictSaeConfig(StateDictClass c) {
  const StateDictTensors layout = StateDictTensorsOf(c);
  SaeConfig cfg;
  cfg.state_dict_class = c;
  cfg.architecture = layout.architecture;
  cfg.apply_b_dec_to_input = layout.apply_b_dec_to_input;
  return cfg;
}

// dictionary_learning's class names, as config.json's trainer.dict_class spells them.
constexpr std::pair<const char*, StateDictClass> kDictionaryLearningClasses[] = {
    {"AutoEncoder", StateDictClass::kAutoEncoder},
    {"AutoEncoderNew", StateDictClass::kAutoEncoderNew},
    {"AutoEncoderTopK", StateDictClass::kTopK},
    {"BatchTopKSAE", StateDictClass::kBatchTopK},
    {"MatryoshkaBatchTopKSAE", StateDictClass::kMatryoshkaBatchTopK},
    {"JumpReluAutoEncoder", StateDictClass::kJumpRelu},
    {"GatedAutoEncoder", StateDictClass::kGated}};

}  // namespace

absl::StatusOr<SaeConfig> ParseDictionaryLearningConfig(const std::string& text) {
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object() || !j.contains("trainer") || !j["trainer"].is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat(kDictionaryLearningConfig, ": not a JSON object with a \"trainer\" object"));
  }
  const json& t = j["trainer"];
  const json& named = t.value("dict_class", json());
  const std::string dict_class = named.is_string() ? named.get<std::string>() : named.dump();
  std::optional<StateDictClass> found;
  for (const auto& [name, c] : kDictionaryLearningClasses) {
    if (dict_class == name) found = c;
  }
  if (!found) {
    return absl::InvalidArgumentError(
        absl::StrCat(kDictionaryLearningConfig, ": trainer.dict_class \"", dict_class,
                     "\" is not one latentd reads (AutoEncoder, AutoEncoderNew, AutoEncoderTopK, "
                     "BatchTopKSAE, MatryoshkaBatchTopKSAE, JumpReluAutoEncoder, "
                     "GatedAutoEncoder)"));
  }
  SaeConfig cfg = StateDictSaeConfig(*found);
  if (t.contains("activation_dim") && t["activation_dim"].is_number_integer()) {
    cfg.d_in = t["activation_dim"].get<int64_t>();
  }
  if (t.contains("dict_size") && t["dict_size"].is_number_integer()) {
    cfg.d_sae = t["dict_size"].get<int64_t>();
  }
  if (t.contains("k") && t["k"].is_number_integer()) cfg.k = t["k"].get<int32_t>();
  if (t.contains("lm_name") && t["lm_name"].is_string()) cfg.model_name = t["lm_name"];
  // submodule_name "resid_post_layer_12": the site, then the layer.
  const json& submodule_name = t.value("submodule_name", json());
  const std::string submodule = submodule_name.is_string() ? submodule_name.get<std::string>() : "";
  for (const auto& [site, hook] :
       std::vector<std::pair<const char*, const char*>>{{"resid_post_layer_", "hook_resid_post"},
                                                        {"mlp_out_layer_", "hook_mlp_out"},
                                                        {"attn_out_layer_", "hook_attn_out"}}) {
    int layer = 0;
    if (absl::StartsWith(submodule, site) &&
        absl::SimpleAtoi(submodule.substr(std::string(site).size()), &layer) && layer >= 0) {
      cfg.hook_name = absl::StrCat("blocks.", layer, ".", hook);
    }
  }
  return cfg;
}

absl::StatusOr<SaeConfig> ParseLmSaesHyperparams(const std::string& text) {
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    return absl::InvalidArgumentError("hyperparams.json: not a JSON object");
  }
  auto bad = [](const std::string& what) {
    return absl::InvalidArgumentError(absl::StrCat("hyperparams.json: ", what));
  };
  auto get_int = [&](const char* key, bool required, int64_t* out) -> absl::Status {
    if (!j.contains(key) || j[key].is_null()) {
      return required ? bad(absl::StrCat(key, " missing")) : absl::OkStatus();
    }
    if (!j[key].is_number_integer()) return bad(absl::StrCat(key, " is not an integer"));
    *out = j[key].get<int64_t>();
    return absl::OkStatus();
  };
  auto get_string = [&](const char* key, bool required, std::string* out) -> absl::Status {
    if (!j.contains(key) || j[key].is_null()) {
      return required ? bad(absl::StrCat(key, " missing")) : absl::OkStatus();
    }
    if (!j[key].is_string()) return bad(absl::StrCat(key, " is not a string"));
    *out = j[key].get<std::string>();
    return absl::OkStatus();
  };
  auto get_bool = [&](const char* key, std::optional<bool> default_value,
                      bool* out) -> absl::Status {
    if (!j.contains(key) || j[key].is_null()) {
      if (!default_value.has_value()) {
        return bad(absl::StrCat(key,
                                " missing (lm-saes' default for it changed between versions, "
                                "so latentd does not guess)"));
      }
      *out = *default_value;
      return absl::OkStatus();
    }
    if (!j[key].is_boolean()) return bad(absl::StrCat(key, " is not a boolean"));
    *out = j[key].get<bool>();
    return absl::OkStatus();
  };
  SaeConfig cfg;
  LmSaesFold fold;
  int64_t expansion = 0, top_k = 0;
  RETURN_IF_ERROR(get_int("d_model", true, &cfg.d_in));
  RETURN_IF_ERROR(get_int("d_sae", false, &cfg.d_sae));
  RETURN_IF_ERROR(get_int("expansion_factor", false, &expansion));
  if (cfg.d_sae == 0) cfg.d_sae = cfg.d_in * expansion;
  if (cfg.d_in <= 0) return bad("d_model must be positive");
  if (cfg.d_sae <= 0) return bad("d_sae (or d_model * expansion_factor) must be positive");
  std::string hook_out, act_fn, norm;
  RETURN_IF_ERROR(get_string("hook_point_in", true, &cfg.hook_name));
  RETURN_IF_ERROR(get_string("hook_point_out", false, &hook_out));
  if (!hook_out.empty() && hook_out != cfg.hook_name) {
    cfg.transcoder = true;  // lm-saes' transcoders keep d_model on both sides
    cfg.d_out = cfg.d_in;
    cfg.hook_name_out = hook_out;
  }
  RETURN_IF_ERROR(get_string("model_name", false, &cfg.model_name));
  bool use_glu = false;
  RETURN_IF_ERROR(get_bool("use_glu_encoder", false, &use_glu));
  if (use_glu) return bad("use_glu_encoder true gates the encoder, which latentd does not run");
  RETURN_IF_ERROR(get_bool("use_decoder_bias", true, &fold.decoder_bias));
  RETURN_IF_ERROR(
      get_bool("apply_decoder_bias_to_pre_encoder", std::nullopt, &cfg.apply_b_dec_to_input));
  if (!fold.decoder_bias) cfg.apply_b_dec_to_input = false;  // it subtracts only a bias it has
  if (cfg.transcoder && cfg.apply_b_dec_to_input) {
    return bad(absl::StrCat("apply_decoder_bias_to_pre_encoder true with hook_point_out \"",
                            hook_out,
                            "\" != hook_point_in: a transcoder's decoder bias belongs to "
                            "its output hook, not its input"));
  }
  RETURN_IF_ERROR(
      get_bool("sparsity_include_decoder_norm", true, &fold.threshold_over_decoder_norm));
  RETURN_IF_ERROR(get_string("act_fn", true, &act_fn));
  RETURN_IF_ERROR(get_int("top_k", false, &top_k));
  if (act_fn == "jumprelu") {
    cfg.architecture = SaeArchitecture::kJumpRelu;
    if (j.contains("jump_relu_threshold") && !j["jump_relu_threshold"].is_null()) {
      if (!j["jump_relu_threshold"].is_number() ||
          !std::isfinite(j["jump_relu_threshold"].get<double>())) {
        return bad("jump_relu_threshold is not a finite number");
      }
      fold.threshold = j["jump_relu_threshold"].get<double>();
    }
  } else if (act_fn == "relu") {
    cfg.architecture = SaeArchitecture::kRelu;  // pre * |d_j| > 0 is pre > 0 wherever |d_j| > 0
  } else if (act_fn == "topk") {
    if (fold.threshold_over_decoder_norm) {
      return bad(
          "act_fn \"topk\" with sparsity_include_decoder_norm true ranks pre * |decoder "
          "direction|, which latentd's TopK (ranking pre) does not: the latents would not be "
          "this SAE's");
    }
    if (top_k <= 0 || top_k > cfg.d_sae) {
      return bad(absl::StrCat("top_k = ", top_k, " must be in [1, d_sae = ", cfg.d_sae, "]"));
    }
    cfg.architecture = SaeArchitecture::kTopK;
    cfg.k = static_cast<int32_t>(top_k);
  } else if (act_fn == "batchtopk") {
    return bad(
        "act_fn \"batchtopk\" keeps the top k * rows of a whole batch, so a row's latents would "
        "depend on the rows batched with it; convert it to a JumpReLU threshold first");
  } else {
    return bad(absl::StrCat("act_fn \"", act_fn, "\" is not one of jumprelu, relu, topk"));
  }
  RETURN_IF_ERROR(get_string("norm_activation", true, &norm));
  if (norm == "dataset-wise") {
    const char* key = "dataset_average_activation_norm";
    if (!j.contains(key) || !j[key].is_object()) {
      return bad(absl::StrCat("norm_activation \"dataset-wise\" needs ", key,
                              " {\"in\": ..., \"out\": ...}, which is missing"));
    }
    const json& norms = j[key];
    auto norm_of = [&](const char* side, const std::string& hook, double* out) -> absl::Status {
      const json* v = norms.contains(side)   ? &norms[side]
                      : norms.contains(hook) ? &norms[hook]
                                             : nullptr;
      if (v == nullptr || !v->is_number() || !std::isfinite(v->get<double>()) ||
          v->get<double>() <= 0) {
        return bad(absl::StrCat(key, ".", side, " (or .", hook,
                                ") must be a positive number, the mean norm of the SAE's ",
                                side == std::string("in") ? "input" : "output"));
      }
      *out = v->get<double>();
      return absl::OkStatus();
    };
    double norm_in = 0, norm_out = 0;
    RETURN_IF_ERROR(norm_of("in", cfg.hook_name, &norm_in));
    RETURN_IF_ERROR(norm_of("out", hook_out.empty() ? cfg.hook_name : hook_out, &norm_out));
    fold.input_scale = std::sqrt(static_cast<double>(cfg.d_in)) / norm_in;
    fold.output_scale = std::sqrt(static_cast<double>(cfg.d_in)) / norm_out;
  } else if (norm != "inference") {
    return bad(absl::StrCat("norm_activation \"", norm, "\" scales each ",
                            norm == "token-wise" ? "row" : "batch",
                            " by its own norm, which latentd does not do; supported: "
                            "\"dataset-wise\", \"inference\""));
  }
  if (cfg.apply_b_dec_to_input && fold.input_scale != fold.output_scale) {
    // The fold subtracts b_dec / s_out before W_enc * s_in, which is lm-saes' x * s_in - b_dec
    // only when the two scales agree.
    return bad(
        "apply_decoder_bias_to_pre_encoder with different dataset_average_activation_norm in "
        "and out cannot be folded");
  }
  cfg.lm_saes = fold;
  return cfg;
}

absl::StatusOr<std::string> TranscoderOutputHook(const SaeConfig& cfg, const HookName& input) {
  if (!cfg.hook_name_out.empty()) return cfg.hook_name_out;
  if (input.point == HookPoint::kHiddenStates) {
    return absl::InvalidArgumentError(
        "extract.sae: a transcoder on a hidden state must name the hidden state it predicts "
        "(hook_name_out in its cfg.json)");
  }
  return absl::StrCat("blocks.", input.layer, ".hook_mlp_out");
}

std::string SaeConfigToJson(const SaeConfig& cfg) {
  json j = {{"d_in", cfg.d_in},
            {"d_sae", cfg.d_sae},
            {"architecture", cfg.architecture == SaeArchitecture::kRelu
                                 ? "standard"
                                 : SaeArchitectureName(cfg.architecture)},
            {"apply_b_dec_to_input", cfg.apply_b_dec_to_input},
            {"dtype", "float32"},
            {"hook_name", cfg.hook_name},
            {"model_name", cfg.model_name}};
  if (cfg.architecture == SaeArchitecture::kTopK) {
    j["k"] = cfg.k;
    j["activation_fn_kwargs"] = {{"k", cfg.k}};
  }
  if (cfg.transcoder) {
    j["architecture"] = absl::StrCat(cfg.architecture == SaeArchitecture::kRelu
                                         ? ""
                                         : absl::StrCat(SaeArchitectureName(cfg.architecture), "_"),
                                     cfg.skip ? "skip_" : "", "transcoder");
    j["d_out"] = cfg.d_out;
    j["hook_name_out"] = cfg.hook_name_out;
  }
  if (!cfg.matryoshka_widths.empty()) j["matryoshka_widths"] = cfg.matryoshka_widths;
  if (cfg.input_normalization != InputNormalization::kNone) {
    j["normalize_activations"] = InputNormalizationName(cfg.input_normalization);
  }
  return j.dump(2);
}

namespace {

bool Exists(const std::string& path) { return std::ifstream(path).good(); }

// lm-saes' layout: hyperparams.json and no cfg.json (which would make it SAELens').
bool IsLmSaesLayout(const std::string& dir) {
  return !Exists(dir + "/cfg.json") && Exists(dir + "/" + kLmSaesHyperparams);
}

// dictionary_learning's layout: ae.pt and no cfg.json.
bool IsDictionaryLearningLayout(const std::string& dir) {
  return !Exists(dir + "/cfg.json") && Exists(dir + "/" + kDictionaryLearningWeights);
}

// dictionary_learning's crosscoders as PyTorchModelHubMixin saves them (latentd's TRAIN among
// them): model.safetensors and a config.json with num_encoder_layers.
bool IsCrosscoderLayout(const std::string& dir) {
  if (!Exists(dir + "/model.safetensors")) return false;
  std::ifstream in(dir + "/config.json");
  if (!in) return false;
  const json config = json::parse(in, nullptr, /*allow_exceptions=*/false);
  return config.is_object() && config.contains("num_encoder_layers");
}

// Goodfire's layout: the directory's only .pth file, and no config beside it ("" otherwise).
std::string GoodfireWeights(const std::string& dir) {
  for (const std::string config : {"cfg.json", kDictionaryLearningConfig, kLmSaesHyperparams}) {
    if (Exists(dir + "/" + config)) return "";
  }
  std::string found;
  std::error_code error;
  for (const auto& entry : std::filesystem::directory_iterator(dir, error)) {
    if (entry.path().extension() != ".pth") continue;
    if (!found.empty()) return "";  // several: which one is not ours to guess
    found = entry.path().string();
  }
  return found;
}

}  // namespace

absl::StatusOr<std::string> FindSaeWeightsFile(const std::string& dir,
                                               const std::optional<HookName>& hook) {
  if (hook && IsCircuitTracerLayout(dir)) {
    ASSIGN_OR_RETURN(const CircuitTracerRelease release, ReadCircuitTracerRelease(dir));
    const std::string file = CircuitTracerEncoderFile(dir, release.cross_layer, hook->layer);
    if (!Exists(file)) return absl::NotFoundError(absl::StrCat(file, " not found"));
    return file;
  }
  const std::string preferred = dir + "/sae_weights.safetensors";
  if (Exists(preferred)) return preferred;
  if (IsDictionaryLearningLayout(dir)) return dir + "/" + kDictionaryLearningWeights;
  if (std::string goodfire = GoodfireWeights(dir); !goodfire.empty()) return goodfire;
  if (IsLmSaesLayout(dir)) {
    // lm-saes' own order of preference (its .pt checkpoints are pickles latentd cannot read).
    for (const char* name : {"checkpoints/pruned.safetensors", "checkpoints/final.safetensors"}) {
      if (Exists(dir + "/" + name)) return dir + "/" + name;
    }
  }
  DIR* d = opendir(dir.c_str());
  if (d == nullptr) return absl::NotFoundError(absl::StrCat("SAE directory ", dir, " not found"));
  std::vector<std::string> found;
  while (dirent* e = readdir(d)) {
    if (absl::EndsWith(e->d_name, ".safetensors")) found.push_back(e->d_name);
  }
  closedir(d);
  if (found.empty()) {
    const std::string npz = dir + "/" + kGemmaScopeParams;
    if (Exists(npz)) return npz;
    return absl::NotFoundError(
        absl::StrCat("no *.safetensors file (nor Gemma Scope's ", kGemmaScopeParams,
                     ", nor lm-saes' checkpoints/final.safetensors) in ", dir));
  }
  if (found.size() > 1) {
    return absl::InvalidArgumentError(absl::StrCat("several *.safetensors files in ", dir, " (",
                                                   absl::StrJoin(found, ", "),
                                                   "); name the weights sae_weights.safetensors"));
  }
  return dir + "/" + found[0];
}

namespace {

// Gemma Scope names its SAEs by where they sit: .../gemma-scope-2b-pt-res/layer_20/width_16k/...;
// the hook is the residual stream after block 20 (-res) or its MLP's output (-mlp). Empty when
// the path does not say (attention SAEs read hook_z, which EXTRACT does not offer).
std::string GemmaScopeHook(const std::string& dir) {
  int layer = -1;
  std::string kind;
  for (const auto& part : std::filesystem::path(dir).lexically_normal()) {
    const std::string p = part.string();
    if (absl::StartsWith(p, "layer_") && absl::SimpleAtoi(p.substr(6), &layer)) continue;
    if (absl::StrContains(p, "-res")) kind = "hook_resid_post";
    if (absl::StrContains(p, "-mlp")) kind = "hook_mlp_out";
    // Its attention SAEs read the heads' outputs before the output projection (SAELens names
    // them blocks.L.attn.hook_z).
    if (absl::StrContains(p, "-att")) kind = "attn.hook_z";
    if (absl::StrContains(p, "-transcoders")) kind = "ln2.hook_normalized";
  }
  return layer >= 0 && !kind.empty() ? absl::StrCat("blocks.", layer, ".", kind) : "";
}

absl::StatusOr<SaeConfig> CheckStateDictSae(SaeConfig cfg, const std::string& weights);

// dictionary_learning's ae.pt + config.json (ParseDictionaryLearningConfig): the state dict's
// tensors checked against config.json's widths; k read from the state dict, which is what the
// module encodes with.
absl::StatusOr<SaeConfig> ReadDictionaryLearningSae(const std::string& dir) {
  const std::string config_path = dir + "/" + kDictionaryLearningConfig;
  std::ifstream in(config_path);
  if (!in) {
    return absl::NotFoundError(
        absl::StrCat(config_path, " not found (dictionary_learning saves it beside ",
                     kDictionaryLearningWeights, "; it names the dictionary's class)"));
  }
  std::stringstream text;
  text << in.rdbuf();
  auto parsed = ParseDictionaryLearningConfig(text.str());
  if (!parsed.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(dir, "/", parsed.status().message()));
  }
  return CheckStateDictSae(*std::move(parsed), dir + "/" + kDictionaryLearningWeights);
}

// Goodfire's release: one .pth state dict (`weights`) and no config, its widths from the tensors.
absl::StatusOr<SaeConfig> ReadGoodfireSae(const std::string& weights) {
  return CheckStateDictSae(StateDictSaeConfig(StateDictClass::kGoodfire), weights);
}

// `cfg` (its state_dict_class set; d_in, d_sae and k where a config gave them) checked against the
// state dict in `weights`: every tensor of the class present, of the shape its encoder implies
// and a float dtype; widths taken from the encoder, k from the state dict (what the module
// encodes with), a Matryoshka's level widths from its group_sizes.
absl::StatusOr<SaeConfig> CheckStateDictSae(SaeConfig cfg, const std::string& weights) {
  ASSIGN_OR_RETURN(const TorchStateDict state, TorchStateDict::Open(weights));
  const StateDictTensors names = StateDictTensorsOf(*cfg.state_dict_class);
  auto bad = [&](const std::string& why) {
    return absl::InvalidArgumentError(absl::StrCat(weights, ": ", why));
  };
  const TorchTensorInfo* w_enc = state.Find(names.W_enc);
  if (w_enc == nullptr || w_enc->shape.size() != 2) {
    // Most likely another module's state dict: say what it holds.
    std::vector<std::string> held;
    for (const TorchTensorInfo& t : state.tensors()) {
      if (held.size() == 8) {
        held.push_back("...");
        break;
      }
      held.push_back(t.name);
    }
    return bad(absl::StrCat("no 2-D tensor ", names.W_enc, ", so not ", names.module,
                            "'s state dict (it holds ", absl::StrJoin(held, ", "), ")"));
  }
  const int64_t d_in = w_enc->shape[names.linear ? 1 : 0];
  const int64_t d_sae = w_enc->shape[names.linear ? 0 : 1];
  if ((cfg.d_in != 0 && cfg.d_in != d_in) || (cfg.d_sae != 0 && cfg.d_sae != d_sae)) {
    return bad(absl::StrCat(names.W_enc, " is [", absl::StrJoin(w_enc->shape, ", "), "], ",
                            kDictionaryLearningConfig, " says activation_dim ", cfg.d_in,
                            ", dict_size ", cfg.d_sae));
  }
  cfg.d_in = d_in;
  cfg.d_sae = d_sae;
  std::vector<std::pair<const char*, std::vector<int64_t>>> expected = {
      {names.W_dec,
       names.linear ? std::vector<int64_t>{d_in, d_sae} : std::vector<int64_t>{d_sae, d_in}},
      {names.b_enc, {d_sae}},
      {names.b_dec, {d_in}}};
  if (*names.threshold != '\0') {
    const TorchTensorInfo* threshold = state.Find(names.threshold);
    if (threshold == nullptr && names.scalar_threshold) {
      return bad(
          "no threshold: a BatchTopK dictionary without one picks each row's latents by the "
          "batch it is in, which latentd does not reproduce");
    }
    expected.push_back({names.threshold, names.scalar_threshold ? std::vector<int64_t>{}
                                                                : std::vector<int64_t>{d_sae}});
  }
  if (*names.r_mag != '\0') {
    expected.push_back({names.r_mag, {d_sae}});
    expected.push_back({names.b_mag, {d_sae}});
  }
  for (const auto& [name, shape] : expected) {
    const TorchTensorInfo* t = state.Find(name);
    if (t == nullptr) return bad(absl::StrCat("tensor ", name, " missing"));
    if (t->shape != shape) {
      return bad(absl::StrCat("tensor ", name, " has shape [", absl::StrJoin(t->shape, ", "), "], ",
                              names.W_enc, " implies [", absl::StrJoin(shape, ", "), "]"));
    }
    if (!IsStFloat(t->dtype)) {
      return bad(absl::StrCat("tensor ", name, " has dtype ", StDtypeName(t->dtype),
                              " (F32, F16, BF16 or F64 expected)"));
    }
  }
  if (cfg.architecture == SaeArchitecture::kTopK) {
    if (const TorchTensorInfo* k = state.Find("k")) {
      ASSIGN_OR_RETURN(const std::vector<int64_t> values, state.ReadIntegers(*k));
      if (values.size() != 1) return bad("tensor k holds more than one value");
      cfg.k = static_cast<int32_t>(values[0]);
    }
    if (cfg.k <= 0 || cfg.k > cfg.d_sae) {
      return bad(absl::StrCat("k = ", cfg.k, " must be in [1, dict_size = ", cfg.d_sae, "]"));
    }
  }
  if (const TorchTensorInfo* groups = state.Find("group_sizes")) {
    ASSIGN_OR_RETURN(const std::vector<int64_t> sizes, state.ReadIntegers(*groups));
    int64_t width = 0;
    for (int64_t size : sizes) cfg.matryoshka_widths.push_back(width += size);
  }
  return cfg;
}

// Gemma Scope's release layout: params.npz (W_enc [d_in, d_sae], W_dec, b_enc, b_dec,
// threshold) and no cfg.json; a JumpReLU SAE read without subtracting b_dec first.
absl::StatusOr<SaeConfig> ReadGemmaScopeSae(const std::string& dir, const std::string& npz_path) {
  ASSIGN_OR_RETURN(NpzReader npz, NpzReader::Open(npz_path));
  const NpyArrayInfo* w_enc = npz.Find("W_enc");
  if (w_enc == nullptr || w_enc->shape.size() != 2) {
    return absl::InvalidArgumentError(absl::StrCat(npz_path, ": no 2-D array W_enc"));
  }
  SaeConfig cfg;
  cfg.d_in = w_enc->shape[0];
  cfg.d_sae = w_enc->shape[1];
  cfg.architecture = SaeArchitecture::kJumpRelu;
  cfg.apply_b_dec_to_input = false;
  cfg.hook_name = GemmaScopeHook(dir);
  if (absl::EndsWith(cfg.hook_name, ".ln2.hook_normalized")) {  // gemma-scope-*-transcoders
    cfg.transcoder = true;
    cfg.d_out = cfg.d_in;
  }
  const std::vector<std::pair<const char*, std::vector<int64_t>>> expected = {
      {"W_enc", {cfg.d_in, cfg.d_sae}},
      {"W_dec", {cfg.d_sae, cfg.OutWidth()}},
      {"b_enc", {cfg.d_sae}},
      {"b_dec", {cfg.OutWidth()}},
      {"threshold", {cfg.d_sae}}};
  for (const auto& [name, shape] : expected) {
    const NpyArrayInfo* a = npz.Find(name);
    if (a == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(npz_path, ": array ", name, " missing"));
    }
    if (a->shape != shape) {
      return absl::InvalidArgumentError(
          absl::StrCat(npz_path, ": array ", name, " has shape [", absl::StrJoin(a->shape, ", "),
                       "], W_enc implies [", absl::StrJoin(shape, ", "), "]"));
    }
    if (a->descr != "<f4" && a->descr != "<f2" && a->descr != "<f8") {
      return absl::InvalidArgumentError(absl::StrCat(npz_path, ": array ", name, " has dtype ",
                                                     a->descr, " (<f4, <f2 or <f8 expected)"));
    }
  }
  return cfg;
}

}  // namespace

namespace {

// Tensor `name` of `header` (the file `weights`) has shape `want` (or `also`, when given) and a
// float dtype; absent, an error only when `required`. INVALID_ARGUMENT naming the file, the
// tensor and what implied the shape.
absl::Status CheckFloatTensor(const StHeader& header, const std::string& weights,
                              const std::string& name, const std::vector<int64_t>& want,
                              bool required, const std::string& implied_by,
                              const std::vector<int64_t>& also = {}) {
  const StTensorInfo* t = header.Find(name);
  if (t == nullptr) {
    if (!required) return absl::OkStatus();
    return absl::InvalidArgumentError(absl::StrCat(weights, ": tensor ", name, " missing"));
  }
  if (t->shape != want && (also.empty() || t->shape != also)) {
    return absl::InvalidArgumentError(absl::StrCat(weights, ": tensor ", name, " has shape [",
                                                   absl::StrJoin(t->shape, ", "), "], ", implied_by,
                                                   " implies [", absl::StrJoin(want, ", "), "]"));
  }
  if (!IsStFloat(t->dtype)) {
    return absl::InvalidArgumentError(absl::StrCat(weights, ": tensor ", name, " has dtype ",
                                                   StDtypeName(t->dtype),
                                                   " (F32, F16, BF16 or F64 expected)"));
  }
  return absl::OkStatus();
}

// A layer of a circuit-tracer release (circuit_tracer.h), picked by the layer of `hook`.
absl::StatusOr<SaeConfig> ReadCircuitTracerSae(const std::string& dir, const HookName& hook) {
  ASSIGN_OR_RETURN(const CircuitTracerRelease release, ReadCircuitTracerRelease(dir));
  const std::string config = absl::StrCat(dir, "/", kCircuitTracerConfig);
  if (release.transcoders_elsewhere) {
    return absl::InvalidArgumentError(absl::StrCat(
        config, " lists its transcoders as files elsewhere (transcoders: ...) and none is in ", dir,
        "; point the path at the downloaded directory of the layer's transcoder instead"));
  }
  if (release.n_layers == 0) {
    return absl::NotFoundError(
        absl::StrCat("no layer_0.safetensors nor W_enc_0.safetensors in ", dir));
  }
  if (hook.point == HookPoint::kHiddenStates) {
    return absl::InvalidArgumentError(
        absl::StrCat("the circuit-tracer release in ", dir,
                     " holds a transcoder per layer, picked by the hook's block: name the hook "
                     "blocks.L.",
                     release.feature_input_hook.empty() ? "<hook>" : release.feature_input_hook));
  }
  const int layer = hook.layer;
  if (layer >= release.n_layers) {
    return absl::InvalidArgumentError(absl::StrCat("layer ", layer,
                                                   " is not in the circuit-tracer release in ", dir,
                                                   " (layers 0..", release.n_layers - 1, ")"));
  }
  SaeConfig cfg;
  cfg.transcoder = true;
  cfg.apply_b_dec_to_input = false;  // F.linear(x, W_enc, b_enc): nothing subtracted first
  cfg.circuit_tracer = CircuitTracerLayer{layer, release.cross_layer, release.n_layers};
  if (!release.feature_input_hook.empty()) {
    // Informational (the start-of-job warning); one latentd does not name leaves it unsaid.
    const std::string in = absl::StrCat("blocks.", layer, ".", release.feature_input_hook);
    if (ParseHookName(in).ok()) cfg.hook_name = in;
  }
  if (!release.feature_output_hook.empty()) {
    const std::string out = absl::StrCat("blocks.", layer, ".", release.feature_output_hook);
    if (!ParseHookName(out).ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat(config, ": feature_output_hook \"", release.feature_output_hook,
                       "\" is not a hook latentd computes (hook_mlp_out, mlp.hook_out, ...)"));
    }
    cfg.hook_name_out = out;
  }
  const std::string weights = CircuitTracerEncoderFile(dir, release.cross_layer, layer);
  ASSIGN_OR_RETURN(const StHeader header, ReadStHeader(weights));
  const std::string suffix = release.cross_layer ? absl::StrCat("_", layer) : "";
  if (release.activation == "topk" || header.Find("k") != nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        dir, ": a TopK transcoder (", release.activation == "topk" ? config : weights,
        "): circuit-tracer keeps the k largest pre-activations even when negative, latentd's "
        "TopK only the positive ones, so the latents would differ"));
  }
  const StTensorInfo* w_enc = header.Find("W_enc" + suffix);
  const StTensorInfo* b_dec = header.Find("b_dec" + suffix);
  if (w_enc == nullptr || w_enc->shape.size() != 2 || b_dec == nullptr ||
      b_dec->shape.size() != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat(weights, ": no 2-D W_enc", suffix, " [d_sae, d_in] and 1-D b_dec", suffix));
  }
  cfg.d_sae = w_enc->shape[0];
  cfg.d_in = w_enc->shape[1];
  cfg.d_out = b_dec->shape[0];
  const std::string threshold =
      release.cross_layer ? "threshold" + suffix : "activation_function.threshold";
  // circuit-tracer uses the stored thresholds unless config.yaml says relu.
  cfg.architecture = header.Find(threshold) != nullptr && release.activation != "relu"
                         ? SaeArchitecture::kJumpRelu
                         : SaeArchitecture::kRelu;
  cfg.skip = !release.cross_layer && header.Find("W_skip") != nullptr;
  const std::string implied = "W_enc" + suffix;
  RETURN_IF_ERROR(
      CheckFloatTensor(header, weights, "W_enc" + suffix, {cfg.d_sae, cfg.d_in}, true, implied));
  RETURN_IF_ERROR(CheckFloatTensor(header, weights, "b_enc" + suffix, {cfg.d_sae}, true, implied));
  RETURN_IF_ERROR(CheckFloatTensor(header, weights, "b_dec" + suffix, {cfg.d_out}, true, implied));
  RETURN_IF_ERROR(
      CheckFloatTensor(header, weights, threshold, {cfg.d_sae}, false, implied, {1, cfg.d_sae}));
  if (!release.cross_layer) {
    RETURN_IF_ERROR(
        CheckFloatTensor(header, weights, "W_dec", {cfg.d_sae, cfg.d_out}, true, implied));
    RETURN_IF_ERROR(
        CheckFloatTensor(header, weights, "W_skip", {cfg.d_out, cfg.d_in}, false, implied));
    return cfg;
  }
  const std::string decoder = CircuitTracerDecoderFile(dir, layer);
  ASSIGN_OR_RETURN(const StHeader dec_header, ReadStHeader(decoder));
  RETURN_IF_ERROR(CheckFloatTensor(dec_header, decoder, "W_dec" + suffix,
                                   {cfg.d_sae, release.n_layers - layer, cfg.d_out}, true,
                                   absl::StrCat(weights, " (of ", release.n_layers, " layers)")));
  return cfg;
}

// Gemma Scope 2 names its SAEs by where they sit too: .../resid_post/layer_22_width_16k_l0_medium
// (hook_resid_post; mlp_out: hook_mlp_out); a part starting with "transcoder" makes a transcoder
// writing to its block's hook_mlp_out, whose input hook the path does not say. The layer is -1
// when no part reads layer_<L>_...
struct GemmaScope2Place {
  int layer = -1;
  std::string hook;  // "" when the path does not say
  bool transcoder = false;
};
GemmaScope2Place GemmaScope2PlaceOf(const std::string& dir) {
  GemmaScope2Place place;
  std::string kind;
  for (const auto& part : std::filesystem::path(dir).lexically_normal()) {
    const std::string p = part.string();
    if (p == "resid_post" || p == "mlp_out") kind = p;
    if (absl::StartsWith(p, "transcoder")) place.transcoder = true;
    if (absl::StartsWith(p, "layer_")) {
      const std::string digits = p.substr(6, p.find('_', 6) - 6);
      int layer = -1;
      if (absl::SimpleAtoi(digits, &layer) && layer >= 0) place.layer = layer;
    }
  }
  if (place.layer >= 0 && !kind.empty() && !place.transcoder) {
    place.hook = absl::StrCat("blocks.", place.layer, ".hook_", kind);
  }
  return place;
}

// Gemma Scope 2's layout (kGemmaScope2Params): a JumpReLU SAE (or transcoder) read without
// subtracting b_dec first.
absl::StatusOr<SaeConfig> ReadGemmaScope2Sae(const std::string& dir, const std::string& path,
                                             const StHeader& header) {
  const StTensorInfo* w_enc = header.Find("w_enc");
  const StTensorInfo* w_dec = header.Find("w_dec");
  if (w_enc->shape.size() != 2 || w_dec == nullptr || w_dec->shape.size() != 2) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": no 2-D w_enc [d_in, d_sae] and w_dec [d_sae, d_out]"));
  }
  const GemmaScope2Place place = GemmaScope2PlaceOf(dir);
  SaeConfig cfg;
  cfg.d_in = w_enc->shape[0];
  cfg.d_sae = w_enc->shape[1];
  cfg.architecture = SaeArchitecture::kJumpRelu;
  cfg.apply_b_dec_to_input = false;
  cfg.hook_name = place.hook;
  cfg.skip = header.Find("affine_skip_connection") != nullptr;
  cfg.transcoder = place.transcoder || cfg.skip || w_dec->shape[1] != cfg.d_in;
  if (cfg.transcoder) {
    cfg.d_out = w_dec->shape[1];
    if (place.layer >= 0) cfg.hook_name_out = absl::StrCat("blocks.", place.layer, ".hook_mlp_out");
  }
  const std::string implied = "w_enc";
  RETURN_IF_ERROR(
      CheckFloatTensor(header, path, "w_enc", {cfg.d_in, cfg.d_sae}, true, implied));  // dtype
  RETURN_IF_ERROR(
      CheckFloatTensor(header, path, "w_dec", {cfg.d_sae, cfg.OutWidth()}, true, implied));
  RETURN_IF_ERROR(CheckFloatTensor(header, path, "b_enc", {cfg.d_sae}, true, implied));
  RETURN_IF_ERROR(CheckFloatTensor(header, path, "b_dec", {cfg.OutWidth()}, true, implied));
  RETURN_IF_ERROR(CheckFloatTensor(header, path, "threshold", {cfg.d_sae}, true, implied));
  RETURN_IF_ERROR(CheckFloatTensor(header, path, "affine_skip_connection",
                                   {cfg.d_in, cfg.OutWidth()}, false, implied));
  return cfg;
}

// A crosscoder (IsCrosscoderLayout): config.json's widths, checked against model.safetensors.
absl::StatusOr<SaeConfig> ReadCrosscoderSae(const std::string& dir) {
  const std::string config_path = dir + "/config.json";
  const std::string weights = dir + "/model.safetensors";
  std::ifstream in(config_path);
  const json config = json::parse(in, nullptr, /*allow_exceptions=*/false);
  auto positive = [&](const char* field) -> absl::StatusOr<int64_t> {
    if (!config.contains(field) || !config[field].is_number_integer() ||
        config[field].get<int64_t>() < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat(config_path, ": ", field, " must be a positive integer"));
    }
    return config[field].get<int64_t>();
  };
  ASSIGN_OR_RETURN(const int64_t n, positive("num_encoder_layers"));
  ASSIGN_OR_RETURN(const int64_t d, positive("activation_dim"));
  ASSIGN_OR_RETURN(const int64_t m, positive("dict_size"));
  if (n < 2 || n > 64) {
    return absl::InvalidArgumentError(absl::StrCat(config_path, ": num_encoder_layers ", n,
                                                   ": latentd reads crosscoders of 2..64 hooks"));
  }
  const json normalization = config.value("code_normalization", json("CROSSCODER"));
  if (normalization != "CROSSCODER") {
    return absl::InvalidArgumentError(absl::StrCat(
        config_path, ": code_normalization ", normalization.dump(),
        ": latentd reads CROSSCODER (a latent weighed by the sum of its decoder norms) only"));
  }
  for (const char* field : {"encoder_layers_indices", "num_decoder_output_layers"}) {
    if (config.contains(field) && !config[field].is_null()) {
      return absl::InvalidArgumentError(
          absl::StrCat(config_path, ": ", field,
                       " is set: latentd reads crosscoders that read and write "
                       "every hook they name"));
    }
  }
  SaeConfig cfg;
  cfg.crosscoder_sources = static_cast<int>(n);
  cfg.d_in = n * d;
  cfg.d_sae = m;
  cfg.apply_b_dec_to_input = false;
  ASSIGN_OR_RETURN(const StHeader header, ReadStHeader(weights));
  cfg.architecture =
      header.Find("threshold") != nullptr ? SaeArchitecture::kJumpRelu : SaeArchitecture::kRelu;
  const std::string implied = "config.json";
  RETURN_IF_ERROR(CheckFloatTensor(header, weights, "encoder.weight", {n, d, m}, true, implied));
  RETURN_IF_ERROR(CheckFloatTensor(header, weights, "encoder.bias", {m}, true, implied));
  RETURN_IF_ERROR(CheckFloatTensor(header, weights, "decoder.weight", {n, m, d}, true, implied));
  RETURN_IF_ERROR(CheckFloatTensor(header, weights, "decoder.bias", {n, d}, true, implied));
  RETURN_IF_ERROR(CheckFloatTensor(header, weights, "threshold", {}, false, implied));
  std::ifstream about_in(dir + "/latentd.json");
  const json about = json::parse(about_in, nullptr, /*allow_exceptions=*/false);
  if (about.is_object() && about.contains("sources") && about["sources"].is_array()) {
    for (const json& source : about["sources"]) {
      if (source.is_object() && source.contains("hook_name") && source["hook_name"].is_string()) {
        cfg.crosscoder_hooks.push_back(source["hook_name"].get<std::string>());
      }
      if (source.is_object() && source.contains("training_scale") &&
          source["training_scale"].is_number() && source["training_scale"].get<double>() > 0) {
        cfg.crosscoder_scales.push_back(source["training_scale"].get<double>());
      }
    }
    // All or none: a scale per source, or the file's own units for every one.
    if (static_cast<int64_t>(cfg.crosscoder_scales.size()) != n) cfg.crosscoder_scales.clear();
  }
  return cfg;
}

}  // namespace

absl::StatusOr<SaeConfig> ReadAndCheckSae(const std::string& dir,
                                          const std::optional<HookName>& hook) {
  if (IsCircuitTracerLayout(dir)) {
    if (!hook) {
      return absl::InvalidArgumentError(absl::StrCat(
          dir, " is a circuit-tracer release, a transcoder per layer: the hook picks the layer"));
    }
    return ReadCircuitTracerSae(dir, *hook);
  }
  if (IsDictionaryLearningLayout(dir)) return ReadDictionaryLearningSae(dir);
  if (std::string goodfire = GoodfireWeights(dir); !goodfire.empty()) {
    return ReadGoodfireSae(goodfire);
  }
  const bool lm_saes = IsLmSaesLayout(dir);
  std::ifstream in(dir + "/" + (lm_saes ? kLmSaesHyperparams : "cfg.json"));
  if (const std::string params = dir + "/" + kGemmaScope2Params; !in && Exists(params)) {
    ASSIGN_OR_RETURN(const StHeader header, ReadStHeader(params));
    if (header.Find("w_enc") != nullptr) return ReadGemmaScope2Sae(dir, params, header);
  }
  if (!in && Exists(dir + "/" + kGemmaScopeParams)) {
    return ReadGemmaScopeSae(dir, dir + "/" + kGemmaScopeParams);
  }
  if (!in && IsCrosscoderLayout(dir)) return ReadCrosscoderSae(dir);
  if (!in) {
    return absl::NotFoundError(absl::StrCat(dir, "/cfg.json not found (nor Gemma Scope's ",
                                            kGemmaScopeParams, ", nor lm-saes' ",
                                            kLmSaesHyperparams, ")"));
  }
  std::stringstream text;
  text << in.rdbuf();
  auto cfg = lm_saes ? ParseLmSaesHyperparams(text.str()) : ParseSaeConfigJson(text.str());
  if (!cfg.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(dir, "/", cfg.status().message()));
  }
  if (cfg->hook_name.empty()) {
    // sparsify writes no hook into cfg.json but names each SAE's directory after its module.
    std::filesystem::path path = std::filesystem::path(dir).lexically_normal();
    if (path.filename().empty()) path = path.parent_path();  // a trailing slash
    const std::string base = path.filename().string();
    if (ParseHookName(base).ok()) {
      // A transcoding one's directory names the MLP module (layers.6.mlp), whose output it
      // predicts; its input is that MLP's (the default input of a transcoder's output hook).
      (cfg->transcoder ? cfg->hook_name_out : cfg->hook_name) = base;
    }
  }
  ASSIGN_OR_RETURN(std::string weights, FindSaeWeightsFile(dir));
  ASSIGN_OR_RETURN(StHeader header, ReadStHeader(weights));
  auto check = [&](const std::vector<std::string>& names, std::vector<int64_t> shape,
                   bool transposed_ok, bool required) -> absl::Status {
    for (const auto& name : names) {
      if (header.Find(name) == nullptr) continue;
      std::vector<int64_t> want = shape;
      // nn.Linear's [out, in]: sparsify's and lm-saes' encoder, lm-saes' decoder.
      if (transposed_ok && (name == "encoder.weight" || name == "decoder.weight")) {
        std::swap(want[0], want[1]);
      }
      return CheckFloatTensor(header, weights, name, want, true,
                              lm_saes ? kLmSaesHyperparams : "cfg.json");
    }
    if (!required) return absl::OkStatus();
    return absl::InvalidArgumentError(absl::StrCat(weights, ": tensor ", names[0], " missing"));
  };
  if (lm_saes) {
    RETURN_IF_ERROR(check({"encoder.weight"}, {cfg->d_in, cfg->d_sae}, true, true));
    RETURN_IF_ERROR(check({"encoder.bias"}, {cfg->d_sae}, false, true));
    RETURN_IF_ERROR(check({"decoder.weight"}, {cfg->d_sae, cfg->OutWidth()}, true, true));
    RETURN_IF_ERROR(check({"decoder.bias"}, {cfg->OutWidth()}, false, cfg->lm_saes->decoder_bias));
    RETURN_IF_ERROR(check({"log_jumprelu_threshold"}, {cfg->d_sae}, false, false));
    if (cfg->architecture == SaeArchitecture::kJumpRelu && !cfg->lm_saes->threshold &&
        header.Find("log_jumprelu_threshold") == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat(dir, "/", kLmSaesHyperparams,
                       ": act_fn \"jumprelu\" needs jump_relu_threshold (or a "
                       "log_jumprelu_threshold tensor in the weights)"));
    }
    return *cfg;
  }
  RETURN_IF_ERROR(check({"W_enc", "encoder.weight"}, {cfg->d_in, cfg->d_sae}, true, true));
  const bool gated = cfg->architecture == SaeArchitecture::kGated;
  RETURN_IF_ERROR(check(gated ? std::vector<std::string>{"b_gate"}
                              : std::vector<std::string>{"b_enc", "encoder.bias"},
                        {cfg->d_sae}, false, true));
  RETURN_IF_ERROR(check({"r_mag"}, {cfg->d_sae}, false, gated));
  RETURN_IF_ERROR(check({"b_mag"}, {cfg->d_sae}, false, gated));
  RETURN_IF_ERROR(check({"W_dec"}, {cfg->d_sae, cfg->OutWidth()}, false, true));
  RETURN_IF_ERROR(check({"b_dec"}, {cfg->OutWidth()}, false, true));
  RETURN_IF_ERROR(check({"W_skip"}, {cfg->OutWidth(), cfg->d_in}, false, cfg->skip));
  RETURN_IF_ERROR(
      check({"threshold"}, {cfg->d_sae}, false, cfg->architecture == SaeArchitecture::kJumpRelu));
  RETURN_IF_ERROR(
      check({"finetuning_scaling_factor"}, {cfg->d_sae}, false, cfg->finetuning_scaling_factor));
  return *cfg;
}

}  // namespace latentd::engine
