#include "engine/hf_model.h"

#include <algorithm>
#include <filesystem>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/process_memory.h"
#include "common/status_macros.h"
#include "engine/hf_gpt2.h"
#include "engine/hf_llama.h"
#include "engine/hf_neox.h"

namespace latentd::engine {
namespace {

struct Architecture {
  enum Kind { kGpt2, kLlama, kNeox } kind = kGpt2;
  TransformerShape shape;
};

// The architecture from config.json alone, with the options checked against it; another
// model_type is refused.
absl::StatusOr<Architecture> ReadArchitecture(const HfModelOptions& options) {
  ASSIGN_OR_RETURN(HfConfig json, HfConfig::Read(options.dir));
  Architecture arch;
  if (json.model_type() == "gpt2") {
    if (options.bfloat16) {
      return absl::InvalidArgumentError(
          "extract.model.huggingface.dtype: BFLOAT16 runs the Llama-family and GPT-NeoX models; "
          "GPT-2 runs in FLOAT32");
    }
    ASSIGN_OR_RETURN(Gpt2Config config, ReadHfGpt2Config(json));
    arch.kind = Architecture::kGpt2;
    arch.shape = Gpt2Shape(config);
    return arch;
  }
  if (IsHfLlamaType(json.model_type())) {
    ASSIGN_OR_RETURN(LlamaConfig config, ReadHfLlamaConfig(json));
    RETURN_IF_ERROR(CheckHfLlamaOptions(config, options));
    config.bfloat16 = options.bfloat16;
    arch.kind = Architecture::kLlama;
    arch.shape = LlamaShape(config);
    return arch;
  }
  if (json.model_type() == "gpt_neox") {
    ASSIGN_OR_RETURN(LlamaConfig config, ReadHfNeoxConfig(json));
    config.bfloat16 = options.bfloat16;
    arch.kind = Architecture::kNeox;
    arch.shape = LlamaShape(config);
    return arch;
  }
  return json.Bad(absl::StrCat(
      "model_type \"", json.model_type(),
      "\": gpt2, gpt_neox, llama, mistral, qwen2, qwen3, gemma, gemma2, gemma3, phi3 and "
      "olmo2 run "
      "natively; export other models to TorchScript (docs/EXTRACT.md)"));
}

}  // namespace

absl::StatusOr<TransformerShape> CheckHfModel(const HfModelOptions& options) {
  ASSIGN_OR_RETURN(Architecture arch, ReadArchitecture(options));
  switch (arch.kind) {
    case Architecture::kGpt2:
      RETURN_IF_ERROR(CheckHfGpt2(options.dir).status());
      break;
    case Architecture::kLlama:
      RETURN_IF_ERROR(CheckHfLlama(options.dir).status());
      break;
    case Architecture::kNeox:
      RETURN_IF_ERROR(CheckHfNeox(options.dir).status());
      break;
  }
  return arch.shape;
}

absl::StatusOr<HfModelWeights> LoadHfModelWeights(const HfModelOptions& options) {
  ASSIGN_OR_RETURN(Architecture arch, ReadArchitecture(options));
  const TransformerShape& shape = arch.shape;
  ASSIGN_OR_RETURN(std::vector<std::string> files, HfWeightFiles(options.dir));
  int64_t largest_file = 0;
  for (const std::string& file : files) {
    std::error_code ec;
    const auto size = std::filesystem::file_size(file, ec);
    if (ec) return absl::NotFoundError(absl::StrCat(file, ": ", ec.message()));
    largest_file = std::max<int64_t>(largest_file, static_cast<int64_t>(size));
  }
  const int64_t limit = options.host_memory_limit_bytes > 0 ? options.host_memory_limit_bytes
                                                            : HostAvailableMemoryBytes();
  const int64_t need = shape.parameter_bytes + largest_file;
  if (limit > 0 && need > limit) {
    return absl::ResourceExhaustedError(absl::StrFormat(
        "reading %s takes about %.3g GB of host memory (%.3g GB of %s weights and the "
        "largest weight file, %.3g GB, while it is converted); %.3g GB are available",
        shape.what, need / 1e9, shape.parameter_bytes / 1e9,
        options.bfloat16 ? "bfloat16" : "float32", largest_file / 1e9, limit / 1e9));
  }
  HfModelWeights weights;
  switch (arch.kind) {
    case Architecture::kGpt2: {
      ASSIGN_OR_RETURN(weights.gpt2, LoadHfGpt2Weights(options));
      break;
    }
    case Architecture::kLlama: {
      ASSIGN_OR_RETURN(weights.llama, LoadHfLlamaWeights(options));
      break;
    }
    case Architecture::kNeox: {
      ASSIGN_OR_RETURN(weights.llama, LoadHfNeoxWeights(options));
      break;
    }
  }
  return weights;
}

absl::StatusOr<std::unique_ptr<ActivationModel>> CreateHfModel(const HfModelWeights& weights,
                                                               const std::vector<HookName>& hooks,
                                                               const at::Device& device) {
  if (weights.gpt2) {
    ASSIGN_OR_RETURN(std::unique_ptr<Gpt2Model> model,
                     Gpt2Model::Create(*weights.gpt2, hooks, device));
    return std::unique_ptr<ActivationModel>(std::move(model));
  }
  if (weights.llama) {
    ASSIGN_OR_RETURN(std::unique_ptr<LlamaModel> model,
                     LlamaModel::Create(*weights.llama, hooks, device));
    return std::unique_ptr<ActivationModel>(std::move(model));
  }
  return absl::InternalError("CreateHfModel: no weights");
}

absl::StatusOr<std::unique_ptr<ActivationModel>> LoadHfModel(const HfModelOptions& options,
                                                             const std::vector<HookName>& hooks,
                                                             const at::Device& device) {
  ASSIGN_OR_RETURN(Architecture arch, ReadArchitecture(options));
  RETURN_IF_ERROR(TransformerHookWidths(arch.shape, hooks).status());
  ASSIGN_OR_RETURN(HfModelWeights weights, LoadHfModelWeights(options));
  return CreateHfModel(weights, hooks, device);
}

}  // namespace latentd::engine
