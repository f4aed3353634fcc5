// A trainable cross-layer transcoder (CLT; Ameisen et al. 2025, "Circuit Tracing"): for each of
// `layers` blocks L, d_sae latents that read block L's input hook and write to the output hook of
// every block from L on,
//
//   z_L     = act(x_L W_enc_L + b_enc_L)                      W_enc_L [d_in, d_sae]
//   y_hat_L = b_dec_L + sum over l <= L of z_l W_dec_l[:, L - l, :]    W_dec_l [d_sae, layers - l,
//   d_out] loss    = sum over L of mean over rows ||y_L - y_hat_L||^2   (+ sparsity)
//
// with act ReLU (sparsity: l1 * sum_j z_lj ||W_dec_l[j]||, the norm over everything latent j
// writes), JumpReLU (l1 * L0 of every layer, straight-through thresholds as SaeModel's) or
// BatchTopK (the k * rows largest of each layer's batch; inference is a JumpReLU whose threshold
// CalibrateBatchThresholds sets per layer). JumpReLU and BatchTopK keep every W_dec_l[j] (all it
// writes, flattened) at unit norm. A row of the training data is [x_0 .. x_{layers-1}, y_0 ..
// y_{layers-1}] side by side (what ModelRowSource gives for the hooks in that order).
//
// Every hook is trained at a common scale: InitFromData fixes per-layer factors s_in_L, s_out_L
// that bring the first rows' mean norm to sqrt(width), and the model above runs on x_L s_in_L
// and y_L s_out_L. The loss thus weighs every block alike (an MLP output 10x larger than another
// would otherwise take 100x the weight), and one learning rate suits models whose MLP outputs
// have a norm of 0.03 or of 300. The factors are folded into the saved weights (W_enc_L s_in_L;
// W_dec_l[:, L - l] and b_dec_L divided by s_out_L), so the release reads and predicts the hooks
// in their own units.
//
// Save writes circuit-tracer's release layout (engine/circuit_tracer.h), which EXTRACT reads:
// config.yaml, W_enc_L.safetensors (W_enc_L [d_sae, d_in] in nn.Linear's orientation, b_enc_L,
// b_dec_L, threshold_L) and W_dec_L.safetensors, float32.
#ifndef LATENTD_ENGINE_CLT_MODEL_H_
#define LATENTD_ENGINE_CLT_MODEL_H_

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

struct CltModelOptions {
  latentd::v1::SaeArchitecture architecture = latentd::v1::BATCHTOPK;
  int64_t layers = 0;
  int64_t d_in = 0;                  // each layer's input hook
  int64_t d_sae = 0;                 // latents per layer
  int64_t d_out = 0;                 // each layer's output hook
  int64_t k = 32;                    // BatchTopK: the mean per row and layer
  double l1_coefficient = 1e-3;      // ReLU: L1 weight; JumpReLU: L0 weight
  double jumprelu_threshold = 1e-3;  // JumpReLU initial threshold
  double jumprelu_bandwidth = 1e-3;  // JumpReLU straight-through kernel width
  uint64_t seed = 0;                 // weight initialisation (SaeInitStreamSeed)

  int64_t RowWidth() const { return layers * (d_in + d_out); }
};

// `config` (fields named "train.sae.*") for a CLT of config.cross_layers() layers between hooks
// d_in and d_out wide. Unset architecture: BATCHTOPK. INVALID_ARGUMENT naming the field for TOPK
// (circuit-tracer's TopK keeps negative pre-activations, so EXTRACT could not run it),
// matryoshka_widths, skip_connection and aux_k_coefficient (not defined for CLTs here).
absl::StatusOr<CltModelOptions> CltModelOptionsFromProto(const latentd::v1::SaeTrainConfig& config,
                                                         int64_t d_in, int64_t d_out,
                                                         uint64_t seed);

// Every parameter's shape, in ordered_parameters()' order, from the options alone (admission).
std::vector<std::vector<int64_t>> CltParameterShapes(const CltModelOptions& options);

// Where a saved CLT sits in a model: the hooks within a block it reads and predicts
// ("ln2.hook_normalized", "hook_mlp_out") and the model, for config.yaml.
struct CltProvenance {
  std::string input_hook;
  std::string output_hook;
  std::string model_name;
};

class CltModelImpl : public torch::nn::Module {
 public:
  explicit CltModelImpl(const CltModelOptions& options);

  // Unit-norm decoder rows and unit encoder columns, drawn from SaeInitStreamSeed(seed); biases 0.
  void InitWeights();
  // From the first rows of the data: the scales s_in_L, s_out_L; b_dec_L := mean of y_L s_out_L,
  // and W_enc_L scaled by mean ||y_L - mean(y_L)|| / mean ||x_L|| (both scaled) so that the first
  // predictions have the targets' spread (SaeModelImpl::ScaleEncoderToTarget's reason).
  void InitFromData(const torch::Tensor& rows);

  // Layer l's input x_l and target y_l of a [rows, RowWidth()] batch, at the training scale.
  torch::Tensor Input(const torch::Tensor& rows, int64_t layer) const;
  torch::Tensor Target(const torch::Tensor& rows, int64_t layer) const;

  // Inference (what the saved release computes): each layer's latents [rows, d_sae].
  std::vector<torch::Tensor> Encode(const torch::Tensor& rows);
  // y_hat of every layer side by side, [rows, layers * d_out], from each layer's latents, in the
  // hooks' own units (what the saved release predicts).
  torch::Tensor Decode(const std::vector<torch::Tensor>& latents) const;
  // Training: the loss and metrics of a batch. The FVU is about every layer's target together
  // (sum of squared errors over sum of spreads), block_squared_error / block_centred_squares
  // are each layer's; l0 is the mean per row and layer.
  SaeForward Forward(const torch::Tensor& rows);

  // BatchTopK: each layer's threshold := the mean over `batches` of its BatchTopKCutoff.
  void CalibrateBatchThresholds(const std::vector<torch::Tensor>& batches);

  void RemoveParallelDecoderGrad();
  void NormalizeDecoder();

  // config.yaml and the layer files into `dir` (created when missing), each file written
  // atomically.
  absl::Status Save(const std::string& dir, const CltProvenance& provenance) const;

  const CltModelOptions& options() const { return options_; }
  // Layer by layer: W_enc, b_enc, W_dec, b_dec (+ log_threshold for JumpReLU).
  std::vector<torch::Tensor> ordered_parameters() const;
  // The scales, then BatchTopK's thresholds.
  std::vector<torch::Tensor> ordered_buffers() const;

  // The weights at the training scale (Save folds the scales in).
  std::vector<torch::Tensor> W_enc, b_enc, W_dec, b_dec, log_threshold;
  torch::Tensor input_scale, output_scale;  // [layers] float32, 1 until InitFromData
  torch::Tensor batch_threshold;            // BatchTopK: [layers] float32, 0 until calibrated

 private:
  torch::Tensor PreActivation(const torch::Tensor& rows, int64_t layer) const;
  // Every layer's prediction side by side at the training scale.
  torch::Tensor ScaledPrediction(const std::vector<torch::Tensor>& latents) const;
  // s_out_L repeated d_out times per layer: [layers * d_out].
  torch::Tensor OutputScales() const;
  // The training activation of layer `layer` (BatchTopK over the batch) and, for JumpReLU, its
  // step (for the L0 term).
  torch::Tensor TrainingLatents(const torch::Tensor& pre, int64_t layer, torch::Tensor* step);

  CltModelOptions options_;
};
TORCH_MODULE(CltModel);

}  // namespace latentd::engine

#endif  // LATENTD_ENGINE_CLT_MODEL_H_
