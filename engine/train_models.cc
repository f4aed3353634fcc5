#include "engine/train_models.h"

#include <torch/script.h>

#include <filesystem>

#include "absl/strings/str_cat.h"

namespace latentd::engine {

SaeTrainable::SaeTrainable(const SaeModelOptions& options, c10::Device device)
    : sae_(options) {
  sae_->to(device);
}

absl::StatusOr<TrainableModel::Output> SaeTrainable::Forward(const torch::Tensor& batch) {
  SaeForward forward = sae_->Forward(batch);
  Output out;
  out.loss = forward.loss;
  out.fvu = forward.fvu;
  out.l0 = forward.l0;
  out.fired = (forward.latents.detach() != 0).any(0).to(torch::kFloat32);
  return out;
}

namespace {

class TorchScriptTrainable : public TrainableModel {
 public:
  explicit TorchScriptTrainable(torch::jit::script::Module module) : module_(std::move(module)) {
    for (const auto& p : module_.parameters()) params_.push_back(p);
  }

  std::vector<torch::Tensor> parameters() override { return params_; }

  absl::StatusOr<Output> Forward(const torch::Tensor& batch) override {
    torch::jit::IValue value = module_.forward({batch});
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
  std::vector<torch::Tensor> params_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<TrainableModel>> LoadTorchScriptTrainable(const std::string& path,
                                                                         c10::Device device) {
  std::error_code error;
  if (!std::filesystem::is_regular_file(path, error)) {
    return absl::NotFoundError(absl::StrCat("train.torchscript_path: no file at ", path));
  }
  try {
    torch::jit::script::Module module = torch::jit::load(path, device);
    module.train();
    auto model = std::make_unique<TorchScriptTrainable>(std::move(module));
    if (model->parameters().empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("train.torchscript_path: ", path, " has no parameters to train"));
    }
    return std::unique_ptr<TrainableModel>(std::move(model));
  } catch (const c10::Error& e) {
    return absl::InvalidArgumentError(absl::StrCat("train.torchscript_path: ", path,
                                                   " is not a TorchScript module: ",
                                                   e.what_without_backtrace()));
  }
}

}  // namespace latentd::engine
