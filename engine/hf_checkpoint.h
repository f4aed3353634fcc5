// What every natively read Hugging Face checkpoint shares: the directory layout (config.json,
// model.safetensors or the shards model.safetensors.index.json names), config.json fields read
// with Hugging Face's defaults and range checks, and the tensors an architecture expects, checked
// from the headers (cheap) and read as float32.
#ifndef LATENTD_ENGINE_HF_CHECKPOINT_H_
#define LATENTD_ENGINE_HF_CHECKPOINT_H_

#include <ATen/ATen.h>

#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace latentd::engine {

struct HfModelOptions {
  std::string dir;  // the checkpoint directory (already checked against the data roots)
  // TransformerLens' weight processing of that name (GPT-2 only; hf_gpt2.h).
  bool center_writing_weights = false;
  // Host memory the weights may take while they are read; 0: what the host has available now
  // (HostAvailableMemoryBytes). Reading more is RESOURCE_EXHAUSTED, not a process the kernel
  // kills.
  int64_t host_memory_limit_bytes = 0;
  // Weights held, and matrix products run, in bfloat16 (Llama-family and GPT-NeoX models):
  // half the memory, and faster where the hardware has bfloat16 units (GPUs; CPUs with
  // AVX512-BF16 or AMX). Default false: float32, exact.
  bool bfloat16 = false;

  // The dtype the weights are read into.
  at::ScalarType weight_dtype() const { return bfloat16 ? at::kBFloat16 : at::kFloat; }
};

// config.json of a checkpoint directory. Every accessor's error is INVALID_ARGUMENT
// "<dir>/config.json: <key> ...".
class HfConfig {
 public:
  // NOT_FOUND without config.json; INVALID_ARGUMENT when it is not a JSON object with a
  // model_type string.
  static absl::StatusOr<HfConfig> Read(const std::string& dir);

  const std::string& dir() const { return dir_; }
  const std::string& model_type() const { return model_type_; }
  bool Has(const char* key) const { return json_.contains(key) && !json_[key].is_null(); }
  const nlohmann::json& json() const { return json_; }

  // `key` as an integer in [lo, hi]; `fallback` when absent or null, and an error then when
  // `fallback` < 0 (required).
  absl::StatusOr<int64_t> Integer(const char* key, int64_t fallback, int64_t lo, int64_t hi) const;
  absl::StatusOr<bool> Boolean(const char* key, bool fallback) const;
  absl::StatusOr<double> PositiveNumber(const char* key, double fallback) const;
  absl::StatusOr<std::string> String(const char* key, const std::string& fallback) const;
  absl::Status Bad(const std::string& what) const;
  // The object under `key` (Gemma 3's text_config) read as a config of its own; its model_type is
  // its own or else `model_type`. INVALID_ARGUMENT when `key` is not an object.
  absl::StatusOr<HfConfig> Nested(const char* key, const std::string& model_type) const;

 private:
  std::string dir_, path_, model_type_;
  nlohmann::json json_;
};

// The weight files of `dir`: model.safetensors, else every shard model.safetensors.index.json
// names. NOT_FOUND when there is neither.
absl::StatusOr<std::vector<std::string>> HfWeightFiles(const std::string& dir);

struct HfTensorSpec {
  std::string name;  // as the architecture names it, without the optional prefixes
  std::vector<int64_t> shape;
  // Read when present, skipped when not, and left out of HfTensors' hash: a tensor after every
  // hook (the final norm), which only the downstream loss uses and which changes no stored row.
  bool optional = false;
};

// Checks from the headers of dir's weight files (HfWeightFiles) that every tensor of `expected`
// is present (named with or without one of `prefixes`: the first a stored name starts with is
// stripped), with its shape and a float dtype
// (F32/F16/BF16/F64); other tensors are ignored. INVALID_ARGUMENT naming the file and the tensor.
absl::Status CheckHfTensors(const std::string& dir, const std::vector<HfTensorSpec>& expected,
                            const std::vector<std::string>& prefixes);

struct HfTensors {
  std::map<std::string, at::Tensor> tensors;  // float32 on the CPU, by their names in `expected`
  // CRC32C of the stored bytes of every tensor read but the optional ones, in name order: the
  // same weights give the same value however they are sharded.
  uint32_t crc = 0;
  int64_t bytes = 0;
  // "crc32c:<crc, extended over `extra`>:<bytes>": the weight hash datasets record.
  std::string Hash(const std::string& extra) const;
};

// CheckHfTensors, then each expected tensor read from its file straight into its tensor (no
// copy of the whole file in memory) and converted to `dtype` (float32 or bfloat16) before the
// next is read. A NaN/Inf weight is INVALID_ARGUMENT naming it; a short read DATA_LOSS naming
// the file.
absl::StatusOr<HfTensors> ReadHfTensors(const std::string& dir,
                                        const std::vector<HfTensorSpec>& expected,
                                        const std::vector<std::string>& prefixes,
                                        at::ScalarType dtype = at::kFloat);

}  // namespace latentd::engine

#endif  // LATENTD_ENGINE_HF_CHECKPOINT_H_
