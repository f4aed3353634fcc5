// The release layout of circuit-tracer (safety-research/circuit-tracer), the library that builds
// attribution graphs from transcoders, read without torch: a directory with config.yaml and one
// file set per layer of the model.
//
//   config.yaml: model_kind (transcoder_set | cross_layer_transcoder), feature_input_hook and
//     feature_output_hook (TransformerLens names within a block: hook_resid_mid, mlp.hook_in,
//     ln2.hook_normalized, hook_mlp_out, mlp.hook_out), activation (relu | jumprelu | topk) and
//     k for transcoder sets; other keys (scan, transcoders, ...) are ignored.
//   transcoder_set (per-layer transcoders, PLTs): layer_{L}.safetensors holding W_enc [d_sae,
//     d_in] (nn.Linear's orientation), b_enc [d_sae], W_dec [d_sae, d_out], b_dec [d_out], and
//     optionally activation_function.threshold [d_sae] (JumpReLU) and W_skip [d_out, d_in].
//   cross_layer_transcoder (CLT): W_enc_{L}.safetensors holding W_enc_{L} [d_sae, d_in],
//     b_enc_{L}, b_dec_{L} [d_out] and optionally threshold_{L} (JumpReLU), and
//     W_dec_{L}.safetensors holding W_dec_{L} [d_sae, n_layers - L, d_out]: the latents of layer
//     L read layer L's input hook and write to the output hook of every layer from L on, so
//     layer L's prediction sums the decoders of layers 0..L.
// Without config.yaml the kind comes from the file names and the hooks from the job.
#ifndef LATENTD_ENGINE_CIRCUIT_TRACER_H_
#define LATENTD_ENGINE_CIRCUIT_TRACER_H_

#include <map>
#include <string>

#include "absl/status/statusor.h"

namespace latentd::engine {

inline constexpr char kCircuitTracerConfig[] = "config.yaml";

struct CircuitTracerRelease {
  bool cross_layer = false;         // model_kind cross_layer_transcoder
  std::string feature_input_hook;   // within a block ("hook_resid_mid"); "" when unsaid
  std::string feature_output_hook;  // within a block ("hook_mlp_out"); "" when unsaid
  std::string activation;           // config.yaml's activation; "" when unsaid
  int n_layers = 0;  // layer_{L} / W_enc_{L} files present, L = 0, 1, ... without a gap
  // config.yaml lists its transcoders as files elsewhere (transcoders: hf://...), with none
  // of them in the directory.
  bool transcoders_elsewhere = false;
};

// Whether `dir` is in circuit-tracer's layout: a config.yaml with a model_kind, or (without a
// cfg.json) a layer_0.safetensors or W_enc_0.safetensors.
bool IsCircuitTracerLayout(const std::string& dir);

// Reads config.yaml (when present) and counts the layer files. INVALID_ARGUMENT naming the
// field for an unknown model_kind or a malformed line.
absl::StatusOr<CircuitTracerRelease> ReadCircuitTracerRelease(const std::string& dir);

// The top-level `key: value` pairs of a YAML document, quotes stripped, comments and nested or
// listed values left out: what config.yaml's keys need (no YAML library is packaged).
// INVALID_ARGUMENT naming the line for a top-level line without "key:".
absl::StatusOr<std::map<std::string, std::string>> ParseTopLevelYaml(const std::string& text);

// The file of layer `layer` holding its encoder: layer_{L}.safetensors (a set's), or
// W_enc_{L}.safetensors (a CLT's, whose decoder is in CircuitTracerDecoderFile).
std::string CircuitTracerEncoderFile(const std::string& dir, bool cross_layer, int layer);
std::string CircuitTracerDecoderFile(const std::string& dir, int layer);  // W_dec_{L}.safetensors

}  // namespace latentd::engine

#endif  // LATENTD_ENGINE_CIRCUIT_TRACER_H_
