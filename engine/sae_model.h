// A trainable sparse autoencoder (TopK, BatchTopK, ReLU + L1, JumpReLU; see
// shared/notes/sae.md) as a torch::nn::Module, with the losses and metrics a TRAIN job reports.
//
//   pre   = (x - b_dec) @ W_enc + b_enc     (b_dec subtracted when apply_b_dec_to_input)
//   TopK:     z = relu(topk_k(pre))          loss = mse
//   BatchTopK: z = the k * rows largest of relu(pre) over the whole batch, the rest 0;
//             loss = mse. Encode() and the exported SAE are a JumpReLU with one threshold theta
//             for every latent (Bussmann et al. 2024): CalibrateBatchThreshold sets theta, after
//             training, to the mean over batches of each batch's smallest kept value, so that
//             without a batch the SAE fires about k latents a row
//   ReLU:     z = relu(pre)                  loss = mse + l1 * sum_j |z_j| * ||W_dec[j]||
//   JumpReLU: z = pre * H(pre - theta)       loss = mse + l1 * L0, with the straight-through
//             rectangle-kernel gradient of width `bandwidth` for theta (Gemma Scope)
//   x_hat = z @ W_dec + b_dec,   mse = mean over rows of ||x - x_hat||^2
// TopK or BatchTopK with dead latents D (not fired for a window of steps; the trainer keeps the
// counters):
//   AuxK (Gao et al. 2024): a = relu(topk_{k_aux}(pre restricted to D)), k_aux = min(aux_k, |D|),
//   e_hat = a @ W_dec (no bias), aux = mean over rows of ||(x - x_hat).detach() - e_hat||^2,
//   loss += aux_k_coefficient * min(|D| / aux_k, 1) * aux: the dead latents closest to firing
//   learn to explain what the live ones miss (the scale damps the term while few are dead).
// Matryoshka (matryoshka_widths w_1 < ... < w_L = d_sae): z is chosen as above, over all
// latents; each level reconstructs from its prefix, x_hat_w = z[:, :w] @ W_dec[:w] + b_dec, and
//   loss = sum over levels of mean over rows ||x - x_hat_w||^2   (+ the sparsity / AuxK terms)
// computed with one pass over W_dec (each level adds its slice to the previous one's x_hat).
// A transcoder (d_out > 0) is the same model scored on a target y (d_out wide: another hook of
// the same rows) instead of x: every x - x_hat above is y - x_hat, b_dec is y's, pre never
// subtracts it, and a skip transcoder's x_hat adds x W_skip^T.
// Decoder rows are kept at unit norm (all but ReLU): after each optimizer step
// NormalizeDecoder() rescales them, and RemoveParallelDecoderGrad() before the step removes the
// gradient component that would only change their norm. Weights are float32.
#ifndef LATENTD_ENGINE_SAE_MODEL_H_
#define LATENTD_ENGINE_SAE_MODEL_H_

#include <torch/nn/module.h>
#include <torch/types.h>

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "proto/latentd/v1/train.pb.h"

namespace latentd::engine {

struct SaeModelOptions {
  latentd::v1::SaeArchitecture architecture = latentd::v1::TOPK;
  int64_t d_in = 0;
  int64_t d_sae = 0;
  int64_t k = 32;                    // TopK; BatchTopK: the mean per row
  double l1_coefficient = 1e-3;      // ReLU: L1 weight; JumpReLU: L0 weight
  double jumprelu_threshold = 1e-3;  // JumpReLU initial threshold
  double jumprelu_bandwidth = 1e-3;  // JumpReLU straight-through kernel width
  bool apply_b_dec_to_input = true;
  uint64_t seed = 0;  // weight initialisation
  // TopK, BatchTopK: AuxK over the latents Forward() is told are dead (SaeModelImpl::Forward).
  int64_t aux_k = 0;             // 0: d_in / 2
  double aux_k_coefficient = 0;  // 0 (default): no AuxK; the paper's value is 1/32
  // Matryoshka level widths, strictly increasing, the last d_sae; empty (default): a plain SAE.
  std::vector<int64_t> matryoshka_widths;
  // A transcoder: the width of the hook it learns to predict (Forward's target); 0 (default): an
  // SAE, which reconstructs its input. A transcoder never subtracts b_dec (its output-side bias)
  // from the input, and its W_enc is drawn apart from W_dec (they live in different spaces).
  int64_t d_out = 0;
  // A transcoder's skip connection: x_hat += x W_skip^T (W_skip [d_out, d_in], zero at the start).
  bool skip = false;

  int64_t OutWidth() const { return d_out > 0 ? d_out : d_in; }
};

// The seed of the generator InitWeights draws from: `seed` mixed with a constant. Drawn from
// `seed` itself, an SAE trained on the reference model with the same seed (0 for both by default)
// started with decoder row i parallel to the model's token embedding i, and the latents of the
// most frequent token ids fired most from then on.
uint64_t SaeInitStreamSeed(uint64_t seed);

// Checks `config` (fields named "train.sae.*") against `d_in` and fills in the defaults; `d_out`
// > 0 makes a transcoder predicting d_out values a row.
absl::StatusOr<SaeModelOptions> SaeModelOptionsFromProto(const latentd::v1::SaeTrainConfig& config,
                                                         int64_t d_in, uint64_t seed,
                                                         int64_t d_out = 0);

struct SaeForward {
  torch::Tensor loss;     // scalar, with graph
  torch::Tensor x_hat;    // rows x OutWidth()
  torch::Tensor latents;  // rows x d_sae (dense, mostly zeros)
  double mse = 0;
  double squared_error = 0;  // sum ||x - x_hat||^2 over the batch
  double fvu = 0;            // squared_error / sum ||x - mean(x)||^2
  // The rows about b_dec: sum ||x - b_dec||^2 and sum (x - b_dec) [d_in] (on the model's
  // device), from which sum ||x - mean(x)||^2 = centred_squares - ||centred_sum||^2 / rows.
  double centred_squares = 0;
  torch::Tensor centred_sum;
  double l0 = 0;          // mean nonzero latents per row
  double aux_k_loss = 0;  // the AuxK term before its weights; 0 without dead latents
  // Matryoshka: each inner level's squared_error and FVU, narrowest first.
  std::vector<double> prefix_squared_error;
  std::vector<double> prefix_fvu;
  // Cross-layer transcoders: each block's squared_error and centred_squares, blocks in order.
  std::vector<double> block_squared_error;
  std::vector<double> block_centred_squares;
};

// The building blocks SaeModel and the cross-layer transcoder (engine/clt_model.h) share.
//
// JumpReLU's step H(pre - theta), theta = exp(log_threshold): the forward value is the step; the
// gradient for theta is the straight-through -K((pre - theta) / bandwidth) / bandwidth with the
// rectangle kernel K (Gemma Scope), so theta learns while pre's gradient passes where a latent
// fires.
torch::Tensor JumpReluStep(const torch::Tensor& pre, const torch::Tensor& log_threshold,
                           double bandwidth);
// BatchTopK's training activation: the k * rows largest of relu(pre) over the whole batch, the
// rest 0.
torch::Tensor BatchTopKActivation(const torch::Tensor& pre, int64_t k);
// The smallest positive value among those BatchTopKActivation keeps; nullopt when none is
// positive. Its mean over batches is the inference threshold (CalibrateBatchThreshold).
std::optional<double> BatchTopKCutoff(const torch::Tensor& pre, int64_t k);
// `rows` random unit vectors of `width` values, [rows, width] float32, drawn from `generator`.
torch::Tensor RandomUnitRows(at::Generator& generator, int64_t rows, int64_t width);
// Decoders kept at unit row norm (row: a latent's slice along dimension 0, the rest flattened):
// RemoveRadialGradient takes from weight's gradient (when it has one) the part that would only
// change the rows' norms, before the optimizer step; NormalizeRows rescales the rows after it.
void RemoveRadialGradient(const torch::Tensor& weight);
void NormalizeRows(const torch::Tensor& weight);
// Fills out's squared_error, centred_squares, centred_sum and fvu for a prediction of rows y
// whose per-row squared errors are `row_squared_error`, from `centred` = y - b_dec (the rows
// about a point every rank shares); returns the batch's spread sum ||y - mean(y)||^2, which the
// FVU divides by.
double SetFitStatistics(const torch::Tensor& centred, const torch::Tensor& row_squared_error,
                        SaeForward* out);
// Fills out's block_squared_error and block_centred_squares for a prediction whose columns are
// `blocks` blocks of equal width side by side (a CLT's blocks, a crosscoder's sources), from its
// per-value squared errors and `centred` as above, in one copy to the host.
void SetBlockStatistics(const torch::Tensor& squared_errors, const torch::Tensor& centred,
                        int64_t blocks, SaeForward* out);

class SaeModelImpl : public torch::nn::Module {
 public:
  explicit SaeModelImpl(const SaeModelOptions& options);

  // W_enc = W_dec^T with unit-norm decoder rows drawn from the generator seeded with
  // SaeInitStreamSeed(seed) (a transcoder: W_enc's unit columns drawn next, from the same
  // generator); b_enc = 0, b_dec = 0.
  void InitWeights();
  // b_dec := mean of `rows` (rows x OutWidth(): what the SAE reconstructs), the usual data
  // initialisation (SAELens' "mean").
  void InitDecoderBiasFromData(const torch::Tensor& rows);
  // A transcoder: W_enc *= mean ‖y - mean(y)‖ / mean ‖x‖ over the rows, so that its first
  // predictions have the target's scale, as an SAE's tied start has its input's. Without it a
  // transcoder from a normed hook (‖x‖ = sqrt(d_in)) to a small MLP output started at FVU 350
  // and an optimizer at an SAE's learning rate had not left it after 300 steps.
  void ScaleEncoderToTarget(const torch::Tensor& x, const torch::Tensor& y);

  // Inference: what the exported SAE computes (BatchTopK: the JumpReLU of its threshold).
  torch::Tensor Encode(const torch::Tensor& x);
  // z W_dec + b_dec: the prediction of an SAE or of a transcoder without a skip connection (a
  // skip transcoder's adds x W_skip^T, which Forward does).
  torch::Tensor Decode(const torch::Tensor& z) { return torch::addmm(b_dec, z, W_dec); }
  // Training: the loss and metrics of a batch. dead: optional bool [d_sae] on the model's
  // device, true for dead latents (AuxK). target: a transcoder's rows x d_out to predict (the
  // errors, FVU and b_dec's statistics are then about it); undefined: x itself.
  SaeForward Forward(const torch::Tensor& x, const torch::Tensor& dead = torch::Tensor(),
                     const torch::Tensor& target = torch::Tensor());

  // BatchTopK: theta := the mean over `batches` (rows x d_in each, on the model's device) of the
  // smallest of each batch's k * rows largest activations that is positive (batches without one
  // are skipped). Deterministic: ranks holding the same weights and batches agree.
  void CalibrateBatchThreshold(const std::vector<torch::Tensor>& batches);

  void RemoveParallelDecoderGrad();
  void NormalizeDecoder();

  // The tensors an SAELens-layout safetensors file holds: W_enc, b_enc, W_dec, b_dec (+ threshold
  // for JumpReLU and BatchTopK), detached float32 CPU copies.
  std::map<std::string, torch::Tensor> ExportWeights() const;

  const SaeModelOptions& options() const { return options_; }
  // Parameters in the fixed order the optimizer and checkpoints use.
  std::vector<torch::Tensor> ordered_parameters() const;
  // State that is not trained by the optimizer but belongs in checkpoints (BatchTopK's
  // threshold), in a fixed order.
  std::vector<torch::Tensor> ordered_buffers() const;

  torch::Tensor W_enc, b_enc, W_dec, b_dec, log_threshold;
  torch::Tensor W_skip;           // skip transcoders: [d_out, d_in]
  torch::Tensor batch_threshold;  // BatchTopK: scalar float32; 0 until calibrated

 private:
  torch::Tensor PreActivation(const torch::Tensor& x);
  torch::Tensor Activate(const torch::Tensor& pre);
  torch::Tensor JumpStep(const torch::Tensor& pre);
  // BatchTopK's training activation.
  torch::Tensor BatchTopK(const torch::Tensor& pre) const;
  bool has_aux_k() const {
    return options_.architecture == latentd::v1::TOPK ||
           options_.architecture == latentd::v1::BATCHTOPK;
  }

  SaeModelOptions options_;
};
TORCH_MODULE(SaeModel);

}  // namespace latentd::engine

#endif  // LATENTD_ENGINE_SAE_MODEL_H_
