// A sparse autoencoder (or a transcoder: SaeConfig::transcoder) on a device: weights in float32,
// the ReLU / TopK / JumpReLU encoders of ../shared/notes/sae.md, and SAELens-layout load/save
// (Load also reads sparsify's, Gemma Scope's and lm-saes' / Llama Scope's layouts, see
// sae_config.h).
//
//   pre = (x' - b_dec) W_enc + b_enc  (b_dec subtracted only when apply_b_dec_to_input; x' is
//                                      x, or x normalized per row: SaeConfig::input_normalization)
//   ReLU:     z = relu(pre)
//   TopK:     z = relu(topk_k(pre))   -- SAELens/OpenAI order: the k largest pre, then ReLU.
//             Because sparse codes keep only non-zero entries, sparsify's relu-then-topk order
//             gives the same stored set: {j in top-k of pre : pre_j > 0}. Ties at the k-th value
//             are broken by at::topk (unspecified but deterministic on one device).
//   JumpReLU: z = pre * (pre > threshold)
//   Gated (SAELens' GatedSAE; b_enc holds b_gate): with m = (x - b_dec) W_enc,
//             z = (m + b_gate > 0) * relu(m * exp(r_mag) + b_mag)   -- the gate and the magnitude
//             share W_enc, the magnitude path rescaled per latent
// Sparse codes hold exactly the non-zero entries of z, column indices ascending within a row.
#ifndef LATENTD_ENGINE_SAE_H_
#define LATENTD_ENGINE_SAE_H_

#include <ATen/ATen.h>

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/hook_name.h"
#include "engine/sae_config.h"
#include "engine/sparse_codes.h"

namespace latentd::engine {

// Device memory the sparse encoder's scratch (pre-activations and a working copy, float32) may
// take at once: 512 MiB, one pass of 4096 rows up to d_sae = 16384, 64 rows at 1M latents.
inline constexpr int64_t kEncodeScratchBytes = int64_t{512} << 20;
// Rows per pass of Sae::EncodeSparse: kEncodeScratchBytes / (8 * d_sae), at least 1.
inline int64_t EncodeRowsPerPass(int64_t d_sae) {
  return d_sae > 0 ? std::max<int64_t>(1, kEncodeScratchBytes / (8 * d_sae)) : 1;
}

struct SaeWeights {
  at::Tensor W_enc;      // [d_in, d_sae]
  at::Tensor b_enc;      // [d_sae]; Gated: b_gate
  at::Tensor W_dec;      // [d_sae, d_in]; a transcoder's [d_sae, d_out]
  at::Tensor b_dec;      // [d_in]; a transcoder's [d_out]
  at::Tensor threshold;  // [d_sae], JumpReLU only (undefined otherwise)
  at::Tensor r_mag;      // [d_sae], Gated only: log of the magnitude path's scale per latent
  at::Tensor b_mag;      // [d_sae], Gated only: the magnitude path's bias
  at::Tensor W_skip;     // [d_out, d_in], skip transcoders only

  // Every tensor through f (undefined ones stay undefined), in declaration order.
  template <typename F>
  SaeWeights Map(F f) const {
    auto g = [&](const at::Tensor& t) { return t.defined() ? f(t) : t; };
    return {g(W_enc), g(b_enc), g(W_dec), g(b_dec), g(threshold), g(r_mag), g(b_mag), g(W_skip)};
  }
  // The tensors with their SAELens names (b_enc as "b_gate" for Gated), defined ones only.
  std::vector<std::pair<const char*, const at::Tensor*>> Named(bool gated) const;
};

class Sae {
 public:
  // Checks shapes against cfg and that every weight is finite (INVALID_ARGUMENT otherwise).
  static absl::StatusOr<Sae> Create(const SaeConfig& cfg, SaeWeights weights);
  // Loads dir/cfg.json + the weights file (or another layout of sae_config.h), converting to
  // float32 on the CPU; lm-saes' encoder is folded into the form above (LmSaesFold). `hook`
  // picks the layer of a circuit-tracer release (ReadAndCheckSae); a cross-layer transcoder's
  // layer L loads with its decoder into layer L (the others: LoadCrossLayerDecoder).
  static absl::StatusOr<Sae> Load(const std::string& dir,
                                  const std::optional<HookName>& hook = std::nullopt);

  const SaeConfig& config() const { return cfg_; }
  // "crc32c:<8 hex>:<bytes>" of the weights file an SAE was loaded from (Load only; "" for one
  // made by Create): what a dataset records so that a resumed job cannot switch SAEs midway.
  const std::string& weight_hash() const { return weight_hash_; }
  const SaeWeights& weights() const { return w_; }
  // A copy on `device` (a replica per device in multi-device jobs).
  Sae To(const at::Device& device) const;

  at::Tensor PreActivations(const at::Tensor& x) const;  // x: [n, d_in] float32
  at::Tensor EncodeDense(const at::Tensor& x) const;     // z: [n, d_sae]
  // The codes of x, encoded rows_per_pass rows at a time (0: EncodeRowsPerPass(d_sae)), so that
  // the [rows, d_sae] pre-activations and the encoder's working copy stay within
  // kEncodeScratchBytes however wide the SAE (1M latents x 4096 rows would be 32 GiB at once).
  // The default pass size depends on d_sae alone, so a resumed job encodes every row as the
  // uninterrupted one did.
  SparseCodes EncodeSparse(const at::Tensor& x, int64_t rows_per_pass = 0) const;
  // x_hat' = z W_dec + b_dec: in the units of x' (x itself unless the SAE normalizes its input).
  at::Tensor Decode(const at::Tensor& z) const;
  // x_hat' of `rows` rows from their codes (EncodeSparse's layout) without forming z
  // (DecodeSparseCodes: k x d_in multiply-adds a row, against the encoder's d_in x d_sae).
  at::Tensor DecodeSparse(const SparseCodes& codes, int64_t rows) const {
    return DecodeSparseCodes(w_.W_dec, w_.b_dec, codes, rows);
  }
  // What the SAE predicts from x [rows, d_in] and its codes, in the hook's own units:
  // DecodeSparse with x's normalization undone, plus x W_skip^T for a skip transcoder.
  // [rows, OutWidth()]; the hook it predicts is x's own for an SAE, the output hook for a
  // transcoder.
  at::Tensor Predict(const at::Tensor& x, const SparseCodes& codes) const;

  // Per row of x [rows, d_in], the factor the decoder's output is multiplied by in the hook's
  // units (x's input normalization undone; ones without one): [rows, 1].
  at::Tensor DecoderOutputScale(const at::Tensor& x) const;

  // Latent `latent`'s value on each row of x [rows, d_in], EncodeDense's column, computed out
  // of place so that autograd differentiates it in x (the target of latent-to-latent
  // attribution). [rows].
  at::Tensor LatentValue(const at::Tensor& x, int64_t latent) const;

  // Bytes of the weights (for memory estimates).
  int64_t weight_bytes() const;

 private:
  // The codes of one pass of rows (EncodeSparse).
  SparseCodes EncodePass(const at::Tensor& x) const;
  // Gated: the codes' dense z.
  at::Tensor GatedActivations(const at::Tensor& x) const;
  // x' (x itself without input normalization), b_dec subtracted when apply_b_dec_to_input.
  at::Tensor EncoderInput(const at::Tensor& x) const;

  SaeConfig cfg_;
  std::string weight_hash_;
  SaeWeights w_;
};

// The decoder that carries the latents of layer `from_layer` of the circuit-tracer cross-layer
// transcoder in `dir` into layer `to_layer`'s output (from_layer <= to_layer): W_dec_{from}[:,
// to - from, :], [d_sae, d_out] float32 on the CPU, read without loading the whole file.
// INVALID_ARGUMENT for layers out of order or range, a shape other than the release's, NaN/Inf.
absl::StatusOr<at::Tensor> LoadCrossLayerDecoder(const std::string& dir, int from_layer,
                                                 int to_layer);

// Everything `latents` of layer `layer` of that cross-layer transcoder write: each one's decoder
// rows into layers layer, layer + 1, ..., [latents, layers - layer, d_out] float32 (one read a
// latent).
absl::StatusOr<at::Tensor> LoadCrossLayerDecoderRows(const std::string& dir, int layer,
                                                     const std::vector<int64_t>& latents);

// Writes dir/sae_weights.safetensors (F32) and dir/cfg.json, creating dir when needed.
absl::Status SaveSae(const std::string& dir, const SaeWeights& weights, const SaeConfig& cfg);

}  // namespace latentd::engine

#endif  // LATENTD_ENGINE_SAE_H_
