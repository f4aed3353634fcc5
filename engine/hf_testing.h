// Test helpers: Hugging Face checkpoint directories (GPT-2 from a Gpt2Weights, Llama with random
// weights).
#ifndef LATENTD_ENGINE_HF_TESTING_H_
#define LATENTD_ENGINE_HF_TESTING_H_

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

// A small Llama checkpoint with random weights: hidden 32, 2 layers, 4 heads over 2 key/value
// heads of 8, intermediate 48, vocab 50, 32 positions; lm_head unless `tied`; `changes` applied
// to config.json (a model_type of "gemma3_text" gets Gemma 3's extra norms). Returns the tensors
// written (by their names in the file).
std::map<std::string, at::Tensor> WriteRandomLlamaCheckpoint(
    const std::string& dir, bool tied = false,
    const std::map<std::string, std::string>& config_changes = {});

}  // namespace latentd::engine

#endif  // LATENTD_ENGINE_HF_TESTING_H_
