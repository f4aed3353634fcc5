// Test helper: a Gpt2Weights written as a Hugging Face GPT-2 checkpoint directory.
#ifndef LATENTD_ENGINE_HF_GPT2_TESTING_H_
#define LATENTD_ENGINE_HF_GPT2_TESTING_H_

#include <ATen/ATen.h>

#include <map>
#include <string>

#include "engine/gpt2_model.h"

namespace latentd::engine {

// `w` by Hugging Face GPT-2 names, each with `prefix` ("" or "transformer."), plus ln_f and the
// causal-mask buffers older checkpoints carry (h.L.attn.bias), which are not weights.
std::map<std::string, at::Tensor> HfGpt2Tensors(const Gpt2Weights& w, const std::string& prefix);

// config.json for w.config (gelu_new, eps 1e-5), `changes` (JSON values by key) applied.
std::string HfGpt2ConfigJson(const Gpt2Config& config,
                             const std::map<std::string, std::string>& changes = {});

void WriteTextFile(const std::string& path, const std::string& text);
// float32 safetensors of `tensors`; false when writing failed.
bool WriteF32Safetensors(const std::string& path, const std::map<std::string, at::Tensor>& tensors);

// `dir` (created) holding config.json and model.safetensors of `w`.
bool WriteHfGpt2Checkpoint(const std::string& dir, const Gpt2Weights& w,
                           const std::string& prefix = "",
                           const std::map<std::string, std::string>& config_changes = {});

}  // namespace latentd::engine

#endif  // LATENTD_ENGINE_HF_GPT2_TESTING_H_
