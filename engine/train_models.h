// The models a TRAIN job trains, behind TrainableModel: an SAE (engine/sae_model.h) or a
// user's TorchScript module whose forward(batch) returns a scalar loss.
#ifndef LATENTD_ENGINE_TRAIN_MODELS_H_
#define LATENTD_ENGINE_TRAIN_MODELS_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/clt_model.h"
#include "engine/crosscoder_model.h"
#include "engine/sae_model.h"
#include "engine/train_loop.h"

namespace latentd::engine {

class SaeTrainable : public TrainableModel {
 public:
  SaeTrainable(const SaeModelOptions& options, c10::Device device);

  std::vector<torch::Tensor> parameters() override { return sae_->ordered_parameters(); }
  std::vector<torch::Tensor> buffers() override { return sae_->ordered_buffers(); }
  absl::StatusOr<Output> Forward(const torch::Tensor& batch) override;
  void InitFromData(const torch::Tensor& rows) override {
    sae_->InitDecoderBiasFromData(Target(rows));
    if (sae_->options().d_out > 0) sae_->ScaleEncoderToTarget(Input(rows), Target(rows));
  }
  void BeforeOptimizerStep() override { sae_->RemoveParallelDecoderGrad(); }
  void AfterOptimizerStep() override { sae_->NormalizeDecoder(); }
  int64_t num_latents() const override { return sae_->options().d_sae; }
  std::vector<int64_t> prefix_widths() const override {
    const std::vector<int64_t>& widths = sae_->options().matryoshka_widths;
    return widths.empty() ? widths : std::vector<int64_t>(widths.begin(), widths.end() - 1);
  }
  void SetDeadLatents(const torch::Tensor& dead) override { dead_ = dead; }
  bool wants_calibration() const override {
    return sae_->options().architecture == latentd::v1::BATCHTOPK;
  }
  // BatchTopK: sets the threshold (SaeModelImpl::CalibrateBatchThreshold) and says how many
  // latents fire at it on the batches.
  std::string Calibrate(const std::vector<torch::Tensor>& batches) override;
  bool uses_dead_latents() const override {
    const auto architecture = sae_->options().architecture;
    return (architecture == latentd::v1::TOPK || architecture == latentd::v1::BATCHTOPK) &&
           sae_->options().aux_k_coefficient > 0;
  }
  // SAELens layout through engine/sae.h's SaveSae: sae_weights.safetensors + cfg.json
  // (BatchTopK as a JumpReLU SAE with its threshold on every latent).
  absl::Status Save(const std::string& dir) override;
  // Recorded in cfg.json; hook_name_out: a transcoder's (the hook it predicts).
  void set_provenance(std::string hook_name, std::string model_name,
                      std::string hook_name_out = "") {
    hook_name_ = std::move(hook_name);
    model_name_ = std::move(model_name);
    hook_name_out_ = std::move(hook_name_out);
  }

  SaeModel& sae() { return sae_; }

 private:
  // A transcoder's rows hold its input (d_in values) then its target (d_out values):
  // SideBySideDenseRowSource. An SAE's rows are both.
  torch::Tensor Input(const torch::Tensor& rows) const;
  torch::Tensor Target(const torch::Tensor& rows) const;

  SaeModel sae_;
  torch::Tensor dead_;  // from SetDeadLatents
  std::string hook_name_;
  std::string model_name_;
  std::string hook_name_out_;
};

// A cross-layer transcoder (engine/clt_model.h); its rows are every layer's input then every
// layer's target side by side.
class CltTrainable : public TrainableModel {
 public:
  CltTrainable(const CltModelOptions& options, c10::Device device, CltProvenance provenance);

  std::vector<torch::Tensor> parameters() override { return clt_->ordered_parameters(); }
  std::vector<torch::Tensor> buffers() override { return clt_->ordered_buffers(); }
  absl::StatusOr<Output> Forward(const torch::Tensor& batch) override;
  void InitFromData(const torch::Tensor& rows) override { clt_->InitFromData(rows); }
  void BeforeOptimizerStep() override { clt_->RemoveParallelDecoderGrad(); }
  void AfterOptimizerStep() override { clt_->NormalizeDecoder(); }
  int64_t num_latents() const override { return clt_->options().layers * clt_->options().d_sae; }
  std::vector<int64_t> fvu_blocks() const override {
    return std::vector<int64_t>(clt_->options().layers, clt_->options().d_out);
  }
  bool wants_calibration() const override {
    return clt_->options().architecture == latentd::v1::BATCHTOPK;
  }
  std::string Calibrate(const std::vector<torch::Tensor>& batches) override;
  // circuit-tracer's release layout (CltModelImpl::Save).
  absl::Status Save(const std::string& dir) override { return clt_->Save(dir, provenance_); }

  CltModel& clt() { return clt_; }

 private:
  CltModel clt_;
  CltProvenance provenance_;
};

// A crosscoder (engine/crosscoder_model.h); its rows are every source's hook side by side.
class CrosscoderTrainable : public TrainableModel {
 public:
  CrosscoderTrainable(const CrosscoderModelOptions& options, c10::Device device,
                      std::vector<CrosscoderSource> sources);

  std::vector<torch::Tensor> parameters() override { return crosscoder_->ordered_parameters(); }
  std::vector<torch::Tensor> buffers() override { return crosscoder_->ordered_buffers(); }
  absl::StatusOr<Output> Forward(const torch::Tensor& batch) override;
  void InitFromData(const torch::Tensor& rows) override { crosscoder_->InitFromData(rows); }
  int64_t num_latents() const override { return crosscoder_->options().d_sae; }
  std::vector<int64_t> fvu_blocks() const override {
    return std::vector<int64_t>(crosscoder_->options().sources, crosscoder_->options().d_in);
  }
  // Every architecture: the summary counts the latents that fire on the calibration rows.
  bool wants_calibration() const override { return true; }
  std::string Calibrate(const std::vector<torch::Tensor>& batches) override;
  // dictionary_learning's layout (CrosscoderModelImpl::Save).
  absl::Status Save(const std::string& dir) override { return crosscoder_->Save(dir, sources_); }
  void AddToResult(latentd::v1::TrainResult* result) override {
    *result->mutable_crosscoder() = crosscoder_->Summary();
  }

 private:
  CrosscoderModel crosscoder_;
  std::vector<CrosscoderSource> sources_;
};

// Loads a TorchScript module from `path`; Save writes dir/model.pt (torch.jit.load-able).
// (torch.jit.save of a scripted module). Its forward takes one float32 tensor (rows x width) and
// returns a scalar loss. NOT_FOUND / INVALID_ARGUMENT naming "train.torchscript_path" when the file
// is missing or not TorchScript.
// With `token_batches` the float rows of a TokenRowSource are handed to forward as int64 ids.
absl::StatusOr<std::unique_ptr<TrainableModel>> LoadTorchScriptTrainable(
    const std::string& path, c10::Device device, bool token_batches = false);

}  // namespace latentd::engine

#endif  // LATENTD_ENGINE_TRAIN_MODELS_H_
