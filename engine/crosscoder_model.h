// A trainable acausal crosscoder (Lindsey et al. 2024, "Sparse Crosscoders for Cross-Layer
// Features and Model Diffing"): one set of d_sae latents that reads n hooks together and
// reconstructs each of them, the hooks being the same place in two models (model diffing: which
// latents one model has and the other lacks) or several layers of one model.
//
//   f       = relu(sum over sources s of x_s W_enc_s + b_enc)       W_enc [n, d_in, d_sae]
//   x_hat_s = f W_dec_s + b_dec_s                                    W_dec [n, d_sae, d_in] saved
//   loss    = sum over s of mean over rows ||x_s - x_hat_s||^2       (+ sparsity)
//
// Each latent's decoder norm in each source, ||W_dec_s[j]||, is left free: how it splits between
// the sources is what model diffing reads (a latent whose norm is all in one model's decoder is
// that model's own). The code norm c_j = sum over s of ||W_dec_s[j]|| w_s weighs each latent's
// activation by what it writes: RELU's sparsity is l1 * sum_j f_j c_j (Anthropic's crosscoder
// loss); BATCHTOPK keeps the k * rows largest f_j c_j of the batch (dictionary_learning's
// BatchTopKCrossCoder with its CROSSCODER code normalisation), and its inference keeps the f_j
// whose f_j c_j exceeds one threshold, the mean cutoff that CalibrateBatchThreshold measures.
//
// Every source is trained at a common scale: InitFromData fixes a factor s_s per source that brings
// the first rows' mean norm to sqrt(d_in), so that neither model nor layer dominates the loss, and
// the factors are folded into the saved weights (W_enc_s s_s; W_dec_s and b_dec_s over s_s), which
// then read and reconstruct the hooks in their own units. The code norm's weights w_s =
// (1 / s_s) / mean over s of (1 / s_s) make c_j proportional to the saved decoders' norm sum, so
// the saved threshold (scaled by that mean) selects exactly the latents training selected; with
// sources of equal scale, w_s = 1.
//
// A row of the training data is [x_0 .. x_{n-1}] side by side (what SideBySideDenseRowSource or
// ModelRowSource give for the hooks in that order).
//
// Save writes dictionary_learning's layout, as PyTorchModelHubMixin.save_pretrained writes it, so
// that BatchTopKCrossCoder.from_pretrained (CrossCoder's for RELU) loads the directory:
// model.safetensors (encoder.weight [n, d_in, d_sae], encoder.bias [d_sae], decoder.weight
// [n, d_sae, d_in], decoder.bias [n, d_in], code_normalization_id; BATCHTOPK: k, threshold) and
// config.json (its constructor's arguments), plus latentd.json naming the sources.
#ifndef LATENTD_ENGINE_CROSSCODER_MODEL_H_
#define LATENTD_ENGINE_CROSSCODER_MODEL_H_

#include <torch/nn/module.h>
#include <torch/types.h>

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/sae_model.h"
#include "proto/latentd/v1/train.pb.h"

namespace latentd::engine {

struct CrosscoderModelOptions {
  latentd::v1::SaeArchitecture architecture = latentd::v1::BATCHTOPK;  // or RELU
  int64_t sources = 0;           // hooks read and reconstructed, >= 2
  int64_t d_in = 0;              // each source's width
  int64_t d_sae = 0;             // latents
  int64_t k = 32;                // BatchTopK: the mean per row
  double l1_coefficient = 1e-3;  // RELU: the weight of sum_j f_j c_j
  uint64_t seed = 0;             // weight initialisation (SaeInitStreamSeed)

  int64_t RowWidth() const { return sources * d_in; }
};

// `config` (fields named "train.sae.*") for a crosscoder over `sources` hooks of d_in values.
// Unset architecture: BATCHTOPK. INVALID_ARGUMENT naming the field for TOPK and JUMPRELU
// (dictionary_learning's crosscoders are BatchTopK or ReLU), matryoshka_widths,
// skip_connection, aux_k_coefficient, cross_layers and apply_b_dec_to_input (a crosscoder's
// encoder reads the hooks as they are).
absl::StatusOr<CrosscoderModelOptions> CrosscoderModelOptionsFromProto(
    const latentd::v1::SaeTrainConfig& config, int64_t sources, int64_t d_in, uint64_t seed);

// Every parameter's shape, in ordered_parameters()' order, from the options alone (admission).
std::vector<std::vector<int64_t>> CrosscoderParameterShapes(const CrosscoderModelOptions& options);

// What latentd.json records beside the weights: each source's hook and model, and where its
// rows came from ("dataset 7" or "live").
struct CrosscoderSource {
  std::string hook_name;
  std::string model_name;
  std::string rows_from;
};

class CrosscoderModelImpl : public torch::nn::Module {
 public:
  explicit CrosscoderModelImpl(const CrosscoderModelOptions& options);

  // Each latent's whole decoder (all sources) a random unit vector drawn from
  // SaeInitStreamSeed(seed), so about 1 / sqrt(n) in each source; W_enc_s = W_dec_s^T
  // (dictionary_learning's init_with_transpose); biases 0.
  void InitWeights();
  // From the first rows: the scales s_s, and b_dec_s := the mean of x_s s_s.
  void InitFromData(const torch::Tensor& rows);

  // Inference (what the saved model computes): the latents [rows, d_sae] of rows in the hooks'
  // own units.
  torch::Tensor Encode(const torch::Tensor& rows);
  // Every source's reconstruction side by side, [rows, n * d_in], in the hooks' own units.
  torch::Tensor Decode(const torch::Tensor& latents) const;
  // Training: the loss and metrics of a batch. The FVU is every source's together;
  // block_squared_error / block_centred_squares are each source's.
  SaeForward Forward(const torch::Tensor& rows);

  // BATCHTOPK: the threshold := the mean over `batches` of each batch's smallest kept f_j c_j.
  // Every architecture: `fired` := 1 for the latents that fire on the batches at inference.
  // Returns the latents a row fire there at inference (what the job's log reports).
  double CalibrateBatchThreshold(const std::vector<torch::Tensor>& batches);

  // Each latent's decoder norm in each source at the training scale, [n, d_sae] float64 on the
  // CPU: what model diffing compares.
  torch::Tensor DecoderNorms() const;
  // How the latents that fired at calibration split between the sources (the proto says how
  // each figure is counted).
  latentd::v1::CrosscoderSummary Summary() const;

  // model.safetensors, config.json and latentd.json into `dir` (created when missing), each
  // written atomically. `sources` has one entry per source.
  absl::Status Save(const std::string& dir, const std::vector<CrosscoderSource>& sources) const;

  const CrosscoderModelOptions& options() const { return options_; }
  // W_enc, b_enc, W_dec, b_dec.
  std::vector<torch::Tensor> ordered_parameters() const;
  // The scales, `fired`, then BatchTopK's threshold.
  std::vector<torch::Tensor> ordered_buffers() const;

  // At the training scale. W_enc [n * d_in, d_sae] (dictionary_learning's [n, d_in, d_sae]
  // flattened), W_dec [d_sae, n * d_in] (saved as [n, d_sae, d_in]), b_dec [n * d_in].
  torch::Tensor W_enc, b_enc, W_dec, b_dec;
  torch::Tensor scale;            // [n] float32, 1 until InitFromData
  torch::Tensor fired;            // [d_sae] float32: 1 where a latent fired at calibration
  torch::Tensor batch_threshold;  // BatchTopK: [1] float32, 0 until calibrated

 private:
  torch::Tensor Scaled(const torch::Tensor& rows) const;
  torch::Tensor PreActivation(const torch::Tensor& rows) const;
  // c_j: [d_sae], with the decoder's graph.
  torch::Tensor CodeNorm() const;
  // w_s, [n].
  torch::Tensor SourceWeights() const;
  // s_s repeated d_in times: [n * d_in].
  torch::Tensor ColumnScales() const;

  CrosscoderModelOptions options_;
};
TORCH_MODULE(CrosscoderModel);

}  // namespace latentd::engine

#endif  // LATENTD_ENGINE_CROSSCODER_MODEL_H_
