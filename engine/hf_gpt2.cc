#include "engine/hf_gpt2.h"

#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/fnv1a.h"
#include "common/status_macros.h"
#include "engine/safetensors.h"
#include "engine/safetensors_tensor.h"

namespace latentd::engine {
namespace {

using nlohmann::json;

constexpr char kPrefix[] = "transformer.";

absl::StatusOr<std::string> ReadText(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat(path, " not found"));
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// The tensors a GPT-2 of `c` has, by their Hugging Face names (without "transformer."), with
// their shapes.
std::vector<std::pair<std::string, std::vector<int64_t>>> ExpectedTensors(const Gpt2Config& c) {
  const int64_t d = c.d_model, f = c.d_mlp;
  std::vector<std::pair<std::string, std::vector<int64_t>>> out = {
      {"wte.weight", {c.vocab_size, d}}, {"wpe.weight", {c.context_length, d}}};
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
  return out;
}

std::string Unprefixed(const std::string& name) {
  return absl::StartsWith(name, kPrefix) ? name.substr(sizeof(kPrefix) - 1) : name;
}

// Where each tensor a GPT-2 needs lies: its file and its header entry.
struct TensorPlace {
  int file = 0;
  StTensorInfo info;
};

// Reads every weight file's header and checks the expected tensors against them.
absl::StatusOr<std::map<std::string, TensorPlace>> LocateTensors(
    const std::vector<std::string>& files, const Gpt2Config& config) {
  std::map<std::string, TensorPlace> found;
  for (size_t i = 0; i < files.size(); ++i) {
    ASSIGN_OR_RETURN(StHeader header, ReadStHeader(files[i]));
    for (const StTensorInfo& info : header.tensors) {
      const std::string name = Unprefixed(info.name);
      auto [it, inserted] = found.insert({name, TensorPlace{static_cast<int>(i), info}});
      if (!inserted) {
        return absl::InvalidArgumentError(absl::StrCat("tensor ", name, " is in both ",
                                                       files[it->second.file], " and ", files[i]));
      }
    }
  }
  for (const auto& [name, shape] : ExpectedTensors(config)) {
    auto it = found.find(name);
    if (it == found.end()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "the checkpoint has no tensor ", name, " (looked in ", absl::StrJoin(files, ", "), ")"));
    }
    const StTensorInfo& info = it->second.info;
    const std::string& file = files[it->second.file];
    if (info.shape != shape) {
      return absl::InvalidArgumentError(absl::StrCat(
          file, ": tensor ", info.name, " has shape [", absl::StrJoin(info.shape, ", "),
          "], config.json implies [", absl::StrJoin(shape, ", "), "]"));
    }
    if (info.dtype != StDtype::kF32 && info.dtype != StDtype::kF16 &&
        info.dtype != StDtype::kBF16 && info.dtype != StDtype::kF64) {
      return absl::InvalidArgumentError(absl::StrCat(file, ": tensor ", info.name, " has dtype ",
                                                     StDtypeName(info.dtype),
                                                     " (F32, F16, BF16 or F64 only)"));
    }
  }
  return found;
}

// The configuration the forward pass depends on, as text for the weight hash.
std::string ConfigFingerprint(const Gpt2Config& c) {
  return absl::StrFormat("gpt2 d%d l%d h%d f%d v%d c%d eps%.9g act%d scale%d inv%d", c.d_model,
                         c.n_layers, c.n_heads, c.d_mlp, c.vocab_size, c.context_length,
                         c.layer_norm_eps, static_cast<int>(c.activation), c.scale_attn_weights,
                         c.scale_attn_by_inverse_layer_idx);
}

}  // namespace

absl::StatusOr<Gpt2Config> ReadHfGpt2Config(const std::string& dir) {
  const std::string path = dir + "/config.json";
  ASSIGN_OR_RETURN(std::string text, ReadText(path));
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  auto bad = [&](const std::string& what) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": ", what));
  };
  if (!j.is_object()) return bad("not a JSON object");
  if (!j.contains("model_type") || !j["model_type"].is_string()) {
    return bad("no model_type (a Hugging Face config.json names its architecture)");
  }
  const std::string type = j["model_type"].get<std::string>();
  if (type != "gpt2") {
    return bad(absl::StrCat("model_type \"", type,
                            "\": only gpt2 runs natively; export other models to TorchScript "
                            "(docs/EXTRACT.md)"));
  }
  // An integer field, `fallback` when absent (Hugging Face's default; -1: required).
  auto integer = [&](const char* key, int64_t fallback, int64_t lo,
                     int64_t hi) -> absl::StatusOr<int64_t> {
    if (!j.contains(key) || j[key].is_null()) {
      if (fallback < 0) return bad(absl::StrCat(key, " is missing"));
      return fallback;
    }
    if (!j[key].is_number_integer()) return bad(absl::StrCat(key, " is not an integer"));
    const int64_t v = j[key].get<int64_t>();
    if (v < lo || v > hi)
      return bad(absl::StrCat(key, " = ", v, " is outside [", lo, ", ", hi, "]"));
    return v;
  };
  auto boolean = [&](const char* key, bool fallback) -> absl::StatusOr<bool> {
    if (!j.contains(key) || j[key].is_null()) return fallback;
    if (!j[key].is_boolean()) return bad(absl::StrCat(key, " is not a boolean"));
    return j[key].get<bool>();
  };
  Gpt2Config c;
  c.what = absl::StrCat("the GPT-2 model in ", dir);
  ASSIGN_OR_RETURN(c.d_model, integer("n_embd", 768, 1, 1 << 16));
  ASSIGN_OR_RETURN(c.n_layers, integer("n_layer", 12, 1, 1024));
  ASSIGN_OR_RETURN(c.n_heads, integer("n_head", 12, 1, 1 << 16));
  ASSIGN_OR_RETURN(c.d_mlp, integer("n_inner", 4 * c.d_model, 1, 1 << 20));
  ASSIGN_OR_RETURN(c.vocab_size, integer("vocab_size", 50257, 1, 1 << 24));
  ASSIGN_OR_RETURN(c.context_length, integer("n_positions", 1024, 1, 1 << 20));
  if (c.d_model % c.n_heads != 0) {
    return bad(absl::StrCat("n_head = ", c.n_heads, " does not divide n_embd = ", c.d_model));
  }
  if (j.contains("layer_norm_epsilon") && !j["layer_norm_epsilon"].is_null()) {
    if (!j["layer_norm_epsilon"].is_number() || !(j["layer_norm_epsilon"].get<double>() > 0)) {
      return bad("layer_norm_epsilon must be a positive number");
    }
    c.layer_norm_eps = j["layer_norm_epsilon"].get<double>();
  }
  std::string act = "gelu_new";
  if (j.contains("activation_function") && !j["activation_function"].is_null()) {
    if (!j["activation_function"].is_string()) return bad("activation_function is not a string");
    act = j["activation_function"].get<std::string>();
  }
  if (act == "gelu_new" || act == "gelu_pytorch_tanh" || act == "gelu_fast") {
    c.activation = Gpt2Activation::kGeluTanh;
  } else if (act == "gelu") {
    c.activation = Gpt2Activation::kGeluErf;
  } else if (act == "relu") {
    c.activation = Gpt2Activation::kRelu;
  } else {
    return bad(absl::StrCat("activation_function \"", act,
                            "\" is not one of gelu_new, gelu_pytorch_tanh, gelu_fast, gelu, relu"));
  }
  ASSIGN_OR_RETURN(c.scale_attn_weights, boolean("scale_attn_weights", true));
  ASSIGN_OR_RETURN(c.scale_attn_by_inverse_layer_idx,
                   boolean("scale_attn_by_inverse_layer_idx", false));
  return c;
}

absl::StatusOr<std::vector<std::string>> HfWeightFiles(const std::string& dir) {
  const std::string single = dir + "/model.safetensors";
  if (std::ifstream(single).good()) return std::vector<std::string>{single};
  const std::string index_path = dir + "/model.safetensors.index.json";
  auto text = ReadText(index_path);
  if (!text.ok()) {
    return absl::NotFoundError(absl::StrCat(
        dir,
        " has neither model.safetensors nor model.safetensors.index.json (PyTorch .bin "
        "checkpoints are not read: save with safe_serialization=True)"));
  }
  json j = json::parse(*text, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object() || !j.contains("weight_map") || !j["weight_map"].is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(index_path, ": no weight_map object"));
  }
  std::set<std::string> shards;
  for (const auto& [name, file] : j["weight_map"].items()) {
    if (!file.is_string()) {
      return absl::InvalidArgumentError(
          absl::StrCat(index_path, ": weight_map[\"", name, "\"] is not a file name"));
    }
    const std::string shard = file.get<std::string>();
    if (shard.empty() || absl::StrContains(shard, "/")) {
      return absl::InvalidArgumentError(absl::StrCat(index_path, ": weight_map[\"", name,
                                                     "\"] = \"", shard,
                                                     "\" is not a file in the directory"));
    }
    shards.insert(shard);
  }
  std::vector<std::string> files;
  for (const std::string& shard : shards) files.push_back(dir + "/" + shard);
  return files;
}

absl::StatusOr<Gpt2Config> CheckHfGpt2(const std::string& dir) {
  ASSIGN_OR_RETURN(Gpt2Config config, ReadHfGpt2Config(dir));
  ASSIGN_OR_RETURN(std::vector<std::string> files, HfWeightFiles(dir));
  RETURN_IF_ERROR(LocateTensors(files, config).status());
  return config;
}

absl::StatusOr<Gpt2Weights> LoadHfGpt2Weights(const HfGpt2Options& options) {
  ASSIGN_OR_RETURN(Gpt2Config config, ReadHfGpt2Config(options.dir));
  ASSIGN_OR_RETURN(std::vector<std::string> files, HfWeightFiles(options.dir));
  ASSIGN_OR_RETURN(auto places, LocateTensors(files, config));
  const auto expected = ExpectedTensors(config);
  std::map<std::string, at::Tensor> tensors;
  Fnv1a64 hash;
  // One file in memory at a time: a sharded checkpoint peaks at its largest shard plus the
  // float32 weights.
  for (size_t i = 0; i < files.size(); ++i) {
    ASSIGN_OR_RETURN(SafetensorsFile file, SafetensorsFile::Read(files[i]));
    hash.Add(file.bytes());
    for (const auto& [name, shape] : expected) {
      const TensorPlace& place = places.at(name);
      if (place.file != static_cast<int>(i)) continue;
      const StTensorInfo* info = file.header().Find(place.info.name);
      if (info == nullptr) {
        return absl::DataLossError(absl::StrCat(files[i], " changed while it was read"));
      }
      ASSIGN_OR_RETURN(at::Tensor t, ReadFloatTensor(file, *info, files[i].c_str()));
      if (!at::isfinite(t).all().item<bool>()) {
        return absl::InvalidArgumentError(
            absl::StrCat(files[i], ": tensor ", info->name, " has NaN or Inf entries"));
      }
      tensors[name] = std::move(t);
    }
  }
  hash.Add(ConfigFingerprint(config));
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
  if (options.center_writing_weights) {
    // What writes into the residual stream is the last dimension of these (x @ W layout).
    auto center = [](at::Tensor& t) { t = t - t.mean(-1, /*keepdim=*/true); };
    center(w.W_E);
    center(w.W_pos);
    for (Gpt2Block& b : w.blocks) {
      for (at::Tensor* t : {&b.W_O, &b.b_O, &b.W_out, &b.b_out}) center(*t);
    }
    hash.Add(std::string("center_writing_weights"));
  }
  w.weight_hash = hash.ToString();
  w.model_id = absl::StrCat("huggingface:gpt2:", options.dir);
  return w;
}

absl::StatusOr<std::unique_ptr<Gpt2Model>> LoadHfGpt2Model(const HfGpt2Options& options,
                                                           const std::vector<HookName>& hooks,
                                                           const at::Device& device) {
  ASSIGN_OR_RETURN(Gpt2Config config, ReadHfGpt2Config(options.dir));
  if (hooks.empty()) return absl::InvalidArgumentError("extract.hook_name: no hook");
  for (const HookName& hook : hooks) RETURN_IF_ERROR(CheckGpt2Hook(config, hook));
  ASSIGN_OR_RETURN(Gpt2Weights weights, LoadHfGpt2Weights(options));
  return Gpt2Model::Create(std::move(weights), hooks, device);
}

}  // namespace latentd::engine
