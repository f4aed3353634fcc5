#include "engine/train_models.h"

#include <torch/script.h>

#include <filesystem>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "engine/sae.h"

namespace latentd::engine {

SaeTrainable::SaeTrainable(const SaeModelOptions& options, c10::Device device) : sae_(options) {
  sae_->to(device);
}

torch::Tensor SaeTrainable::Input(const torch::Tensor& rows) const {
  const SaeModelOptions& o = sae_->options();
  return o.d_out > 0 ? rows.narrow(1, 0, o.d_in) : rows;
}

torch::Tensor SaeTrainable::Target(const torch::Tensor& rows) const {
  const SaeModelOptions& o = sae_->options();
  return o.d_out > 0 ? rows.narrow(1, o.d_in, o.d_out) : rows;
}

namespace {

// What the loop takes from a forward pass of an SAE, a transcoder or a CLT.
TrainableModel::Output LoopOutput(SaeForward forward) {
  TrainableModel::Output out;
  out.loss = forward.loss;
  out.aux_k_loss = forward.aux_k_loss;
  out.squared_error = forward.squared_error;
  out.prefix_squared_error = std::move(forward.prefix_squared_error);
  out.block_squared_error = std::move(forward.block_squared_error);
  out.block_centred_squares = std::move(forward.block_centred_squares);
  out.centred_squares = forward.centred_squares;
  out.centred_sum = forward.centred_sum.to(torch::kCPU, torch::kFloat32);
  out.l0 = forward.l0;
  out.fired = (forward.latents.detach() != 0).any(0).to(torch::kFloat32);
  return out;
}

}  // namespace

absl::StatusOr<TrainableModel::Output> SaeTrainable::Forward(const torch::Tensor& batch) {
  return LoopOutput(sae_->Forward(Input(batch), dead_, Target(batch)));
}

CltTrainable::CltTrainable(const CltModelOptions& options, c10::Device device,
                           CltProvenance provenance)
    : clt_(options), provenance_(std::move(provenance)) {
  clt_->to(device);
}

absl::StatusOr<TrainableModel::Output> CltTrainable::Forward(const torch::Tensor& batch) {
  return LoopOutput(clt_->Forward(batch));
}

std::string CltTrainable::Calibrate(const std::vector<torch::Tensor>& batches) {
  clt_->CalibrateBatchThresholds(batches);
  torch::NoGradGuard no_grad;
  const CltModelOptions& o = clt_->options();
  std::vector<double> fired(o.layers, 0.0);
  int64_t rows = 0;
  for (const torch::Tensor& batch : batches) {
    const std::vector<torch::Tensor> latents = clt_->Encode(batch);
    for (int64_t l = 0; l < o.layers; ++l) fired[l] += (latents[l] != 0).sum().item<double>();
    rows += batch.size(0);
  }
  std::vector<std::string> layers;
  for (int64_t l = 0; l < o.layers; ++l) {
    layers.push_back(absl::StrFormat("layer %d: threshold %.6g, %.2f latents a row", l,
                                     clt_->batch_threshold[l].item<double>(),
                                     rows > 0 ? fired[l] / static_cast<double>(rows) : 0.0));
  }
  return absl::StrFormat("BatchTopK thresholds from %d batches (k %d): %s", batches.size(), o.k,
                         absl::StrJoin(layers, "; "));
}

CrosscoderTrainable::CrosscoderTrainable(const CrosscoderModelOptions& options, c10::Device device,
                                         std::vector<CrosscoderSource> sources)
    : crosscoder_(options), sources_(std::move(sources)) {
  crosscoder_->to(device);
}

absl::StatusOr<TrainableModel::Output> CrosscoderTrainable::Forward(const torch::Tensor& batch) {
  return LoopOutput(crosscoder_->Forward(batch));
}

std::string CrosscoderTrainable::Calibrate(const std::vector<torch::Tensor>& batches) {
  const std::string per_row =
      absl::StrFormat("%.2f latents a row", crosscoder_->CalibrateBatchThreshold(batches));
  const CrosscoderModelOptions& o = crosscoder_->options();
  const int64_t live = crosscoder_->fired.sum().item<int64_t>();
  if (o.architecture != latentd::v1::BATCHTOPK) {
    return absl::StrFormat("crosscoder on %d calibration batches: %s, %d of %d latents fired",
                           batches.size(), per_row, live, o.d_sae);
  }
  return absl::StrFormat(
      "BatchTopK threshold from %d batches (k %d): %.6g on f * code norm, %s, %d of %d latents "
      "fired",
      batches.size(), o.k, crosscoder_->batch_threshold.item<double>(), per_row, live, o.d_sae);
}

std::string SaeTrainable::Calibrate(const std::vector<torch::Tensor>& batches) {
  std::vector<torch::Tensor> inputs;
  for (const torch::Tensor& b : batches) inputs.push_back(Input(b));
  sae_->CalibrateBatchThreshold(inputs);
  torch::NoGradGuard no_grad;
  double fired = 0;
  int64_t rows = 0;
  for (const torch::Tensor& x : inputs) {
    fired += (sae_->Encode(x) != 0).sum().item<double>();
    rows += x.size(0);
  }
  return absl::StrFormat(
      "BatchTopK threshold %.6g, the mean cutoff of %d batches of %d rows; at it the SAE fires "
      "%.2f latents a row on those rows (k %d)",
      sae_->batch_threshold.item<double>(), batches.size(),
      batches.empty() ? 0 : batches[0].size(0), rows > 0 ? fired / static_cast<double>(rows) : 0.0,
      sae_->options().k);
}

absl::Status SaeTrainable::Save(const std::string& dir) {
  const SaeModelOptions& options = sae_->options();
  std::map<std::string, torch::Tensor> exported = sae_->ExportWeights();
  SaeWeights weights;
  weights.W_enc = exported["W_enc"];
  weights.b_enc = exported["b_enc"];
  weights.W_dec = exported["W_dec"];
  weights.b_dec = exported["b_dec"];
  if (exported.count("threshold")) weights.threshold = exported["threshold"];
  if (exported.count("W_skip")) weights.W_skip = exported["W_skip"];
  SaeConfig config;
  config.d_in = options.d_in;
  config.d_sae = options.d_sae;
  switch (options.architecture) {
    case latentd::v1::RELU:
      config.architecture = SaeArchitecture::kRelu;
      break;
    case latentd::v1::JUMPRELU:
    case latentd::v1::BATCHTOPK:  // what it computes without a batch: a JumpReLU
      config.architecture = SaeArchitecture::kJumpRelu;
      break;
    default:
      config.architecture = SaeArchitecture::kTopK;
  }
  config.k = options.architecture == latentd::v1::TOPK ? static_cast<int32_t>(options.k) : 0;
  config.apply_b_dec_to_input = options.apply_b_dec_to_input;
  config.hook_name = hook_name_;
  config.model_name = model_name_;
  if (options.d_out > 0) {
    config.transcoder = true;
    config.d_out = options.d_out;
    config.hook_name_out = hook_name_out_;
    config.skip = options.skip;
  }
  config.matryoshka_widths = options.matryoshka_widths;
  return SaveSae(dir, weights, config);
}

namespace {

class TorchScriptTrainable : public TrainableModel {
 public:
  TorchScriptTrainable(torch::jit::script::Module module, bool token_batches)
      : module_(std::move(module)), token_batches_(token_batches) {
    for (const auto& p : module_.parameters()) params_.push_back(p);
  }

  std::vector<torch::Tensor> parameters() override { return params_; }

  absl::Status Save(const std::string& dir) override {
    std::error_code error;
    std::filesystem::create_directories(dir, error);
    if (error) return absl::InternalError(absl::StrCat("creating ", dir, ": ", error.message()));
    try {
      module_.save(dir + "/model.pt.tmp");
    } catch (const c10::Error& e) {
      return absl::InternalError(absl::StrCat("saving the module: ", e.what_without_backtrace()));
    }
    std::filesystem::rename(dir + "/model.pt.tmp", dir + "/model.pt", error);
    if (error) return absl::InternalError(absl::StrCat("renaming model.pt: ", error.message()));
    return absl::OkStatus();
  }

  absl::StatusOr<Output> Forward(const torch::Tensor& batch) override {
    torch::jit::IValue value = module_.forward({token_batches_ ? batch.to(torch::kInt64) : batch});
    if (!value.isTensor() || value.toTensor().numel() != 1) {
      return absl::InvalidArgumentError(
          "train.torchscript_path: forward(batch) must return a scalar loss tensor");
    }
    Output out;
    out.loss = value.toTensor().reshape({});
    return out;
  }

 private:
  torch::jit::script::Module module_;
  bool token_batches_;
  std::vector<torch::Tensor> params_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<TrainableModel>> LoadTorchScriptTrainable(const std::string& path,
                                                                         c10::Device device,
                                                                         bool token_batches) {
  std::error_code error;
  if (!std::filesystem::is_regular_file(path, error)) {
    return absl::NotFoundError(absl::StrCat("train.torchscript_path: no file at ", path));
  }
  try {
    torch::jit::script::Module module = torch::jit::load(path, device);
    module.train();
    auto model = std::make_unique<TorchScriptTrainable>(std::move(module), token_batches);
    if (model->parameters().empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("train.torchscript_path: ", path, " has no parameters to train"));
    }
    return std::unique_ptr<TrainableModel>(std::move(model));
  } catch (const c10::Error& e) {
    return absl::InvalidArgumentError(
        absl::StrCat("train.torchscript_path: ", path,
                     " is not a TorchScript module: ", e.what_without_backtrace()));
  }
}

}  // namespace latentd::engine
