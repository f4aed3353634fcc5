#include "engine/optimizer_factory.h"

#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "efcp/accounted_optimizer.h"
#include "efcp/ggt.h"
#include "efcp/low_rank_mfac.h"
#include "efcp/mfac.h"
#include "efcp/sparse_mfac.h"
#include "engine/torch_status.h"

namespace latentd::engine {
namespace {

const std::vector<std::string>& KnownNames() {
  static const auto* names =
      new std::vector<std::string>{"sgd", "adam", "adamw", "mfac", "smfac", "lrmfac", "ggt"};
  return *names;
}

int64_t TensorBytes(const torch::Tensor& t) {
  return t.defined() ? static_cast<int64_t>(t.numel() * t.element_size()) : 0;
}

int64_t Numel(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  return n;
}

absl::Status Invalid(const std::string& field, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat("train.optimizer.", field, ": ", what));
}

// LibTorch's optimizers: the state is the per-parameter state objects, counted tensor by tensor.
class TorchOptimizer : public TrainOptimizer {
 public:
  explicit TorchOptimizer(std::unique_ptr<torch::optim::Optimizer> optimizer)
      : optimizer_(std::move(optimizer)) {}
  torch::optim::Optimizer& optimizer() override { return *optimizer_; }

  OptimizerMemory Memory() const override {
    int64_t momentum = 0, exp_avg = 0, exp_avg_sq = 0, max_exp_avg_sq = 0;
    for (const auto& [key, state] : optimizer_->state()) {
      if (auto* s = dynamic_cast<torch::optim::SGDParamState*>(state.get())) {
        momentum += TensorBytes(s->momentum_buffer());
      } else if (auto* a = dynamic_cast<torch::optim::AdamParamState*>(state.get())) {
        exp_avg += TensorBytes(a->exp_avg());
        exp_avg_sq += TensorBytes(a->exp_avg_sq());
        max_exp_avg_sq += TensorBytes(a->max_exp_avg_sq());
      } else if (auto* w = dynamic_cast<torch::optim::AdamWParamState*>(state.get())) {
        exp_avg += TensorBytes(w->exp_avg());
        exp_avg_sq += TensorBytes(w->exp_avg_sq());
        max_exp_avg_sq += TensorBytes(w->max_exp_avg_sq());
      }
    }
    OptimizerMemory memory;
    if (dynamic_cast<torch::optim::SGD*>(optimizer_.get()) != nullptr) {
      memory.components.emplace_back("momentum", momentum);
    } else {
      memory.components.emplace_back("exp_avg", exp_avg);
      memory.components.emplace_back("exp_avg_sq", exp_avg_sq);
      if (max_exp_avg_sq > 0) memory.components.emplace_back("max_exp_avg_sq", max_exp_avg_sq);
    }
    return memory;
  }

 private:
  std::unique_ptr<torch::optim::Optimizer> optimizer_;
};

// The efcp optimizers: the state is what their own accounting reports.
class EfcpOptimizer : public TrainOptimizer {
 public:
  explicit EfcpOptimizer(std::unique_ptr<efcp::AccountedOptimizer> optimizer)
      : optimizer_(std::move(optimizer)) {}
  torch::optim::Optimizer& optimizer() override { return *optimizer_; }
  OptimizerMemory Memory() const override {
    return OptimizerMemory{optimizer_->memory_breakdown().components};
  }

 private:
  std::unique_ptr<efcp::AccountedOptimizer> optimizer_;
};

// The options every M-FAC-family optimizer shares, set from the config.
template <typename Options>
Options MfacFamilyOptions(const OptimizerConfig& config) {
  Options options(config.lr);
  options.damp(config.damp)
      .window(config.window)
      .momentum(config.momentum)
      .weight_decay(config.weight_decay);
  return options;
}

efcp::MFACOptions MfacOptions(const OptimizerConfig& config) {
  return MfacFamilyOptions<efcp::MFACOptions>(config);
}

efcp::SparseMFACOptions SmfacOptions(const OptimizerConfig& config) {
  efcp::SparseMFACOptions options = MfacFamilyOptions<efcp::SparseMFACOptions>(config);
  options.density(config.density).error_feedback(config.error_feedback);
  return options;
}

efcp::LowRankMFACOptions LrmfacOptions(const OptimizerConfig& config) {
  efcp::LowRankMFACOptions options = MfacFamilyOptions<efcp::LowRankMFACOptions>(config);
  options.rank(config.rank).error_feedback(config.error_feedback).seed(config.seed);
  return options;
}

efcp::GGTOptions GgtOptions(const OptimizerConfig& config) {
  return efcp::GGTOptions(config.lr)
      .window(config.window)
      .epsilon(config.eps)
      .momentum(config.momentum)
      .weight_decay(config.weight_decay)
      .density(config.density)
      .error_feedback(config.error_feedback);
}

// efcp's option messages name their own struct ("SparseMFACOptions.density ..."); users wrote
// train.optimizer.<field>, so name that too.
absl::Status EfcpInvalid(const absl::Status& status) {
  std::string message(status.message());
  std::string field = "name";
  const size_t dot = message.find('.');
  if (dot != std::string::npos) {
    const size_t end = message.find(' ', dot);
    field = message.substr(dot + 1, end == std::string::npos ? std::string::npos : end - dot - 1);
  }
  return absl::InvalidArgumentError(absl::StrCat("train.optimizer.", field, ": ", message));
}

}  // namespace

int64_t OptimizerMemory::total() const {
  int64_t sum = 0;
  for (const auto& [name, bytes] : components) sum += bytes;
  return sum;
}

int64_t DenseMfacHistoryBytes(int64_t d, int64_t m) { return 4 * m * d; }

absl::StatusOr<OptimizerConfig> OptimizerConfigFromProto(const latentd::v1::OptimizerSpec& spec) {
  OptimizerConfig config;
  config.name = spec.name();
  if (std::find(KnownNames().begin(), KnownNames().end(), config.name) == KnownNames().end()) {
    return Invalid("name", absl::StrCat("unknown optimizer \"", spec.name(),
                                        "\" (known: ", absl::StrJoin(KnownNames(), ", "), ")"));
  }
  if (!(spec.lr() > 0) || !std::isfinite(spec.lr())) {
    return Invalid("lr", absl::StrCat("must be > 0, got ", spec.lr()));
  }
  config.lr = spec.lr();
  if (spec.momentum() < 0 || spec.momentum() >= 1) {
    return Invalid("momentum", absl::StrCat("must be in [0, 1), got ", spec.momentum()));
  }
  config.momentum = spec.momentum();
  if (spec.weight_decay() < 0 || !std::isfinite(spec.weight_decay())) {
    return Invalid("weight_decay", absl::StrCat("must be >= 0, got ", spec.weight_decay()));
  }
  config.weight_decay = spec.weight_decay();
  if (spec.beta1() < 0 || spec.beta1() >= 1) {
    return Invalid("beta1", absl::StrCat("must be in [0, 1), got ", spec.beta1()));
  }
  if (spec.beta2() < 0 || spec.beta2() >= 1) {
    return Invalid("beta2", absl::StrCat("must be in [0, 1), got ", spec.beta2()));
  }
  if (spec.beta1() > 0) config.beta1 = spec.beta1();
  if (spec.beta2() > 0) config.beta2 = spec.beta2();
  if (spec.eps() < 0) return Invalid("eps", absl::StrCat("must be > 0, got ", spec.eps()));
  config.eps = spec.eps() > 0 ? spec.eps() : (config.name == "ggt" ? 1e-6 : 1e-8);
  if (spec.damp() < 0) return Invalid("damp", absl::StrCat("must be > 0, got ", spec.damp()));
  if (spec.damp() > 0) config.damp = spec.damp();
  if (spec.window() < 0 || spec.window() > 65536) {
    return Invalid("window", absl::StrCat("must be in [1, 65536], got ", spec.window()));
  }
  if (spec.window() > 0) config.window = spec.window();
  if (spec.density() < 0 || spec.density() > 1) {
    return Invalid("density", absl::StrCat("must be in (0, 1], got ", spec.density()));
  }
  if (spec.density() > 0) {
    config.density = spec.density();
  } else if (config.name == "ggt") {
    config.density = 1.0;  // GGT keeps dense rows unless asked to sparsify them
  }
  config.error_feedback = !spec.disable_error_feedback();
  if (spec.rank() < 0 || spec.rank() > 4096) {
    return Invalid("rank", absl::StrCat("must be in [1, 4096], got ", spec.rank()));
  }
  if (spec.rank() > 0) config.rank = spec.rank();
  if (config.name == "mfac") {
    absl::Status status = efcp::ValidateMFACOptions(MfacOptions(config));
    if (!status.ok()) return EfcpInvalid(status);
  } else if (config.name == "smfac") {
    absl::Status status = efcp::ValidateSparseMFACOptions(SmfacOptions(config));
    if (!status.ok()) return EfcpInvalid(status);
  } else if (config.name == "ggt") {
    absl::Status status = efcp::ValidateGGTOptions(GgtOptions(config));
    if (!status.ok()) return EfcpInvalid(status);
  } else if (config.name == "lrmfac") {
    absl::Status status = efcp::ValidateLowRankMFACOptions(LrmfacOptions(config));
    if (!status.ok()) return EfcpInvalid(status);
  }
  return config;
}

OptimizerMemory EstimateOptimizerMemory(const OptimizerConfig& config,
                                        const std::vector<std::vector<int64_t>>& shapes) {
  int64_t d = 0;
  for (const auto& shape : shapes) d += Numel(shape);
  const int64_t m = config.window;
  OptimizerMemory memory;
  if (config.name == "sgd") {
    memory.components.emplace_back("momentum", config.momentum > 0 ? 4 * d : 0);
  } else if (config.name == "adam" || config.name == "adamw") {
    memory.components.emplace_back("exp_avg", 4 * d);
    memory.components.emplace_back("exp_avg_sq", 4 * d);
  } else if (config.name == "mfac") {
    return OptimizerMemory{efcp::MFAC::EstimateMemory(shapes, MfacOptions(config)).components};
  } else if (config.name == "smfac") {
    return OptimizerMemory{
        efcp::SparseMFAC::EstimateMemory(shapes, SmfacOptions(config)).components};
  } else if (config.name == "ggt") {
    return OptimizerMemory{efcp::GGT::EstimateMemory(shapes, GgtOptions(config)).components};
  } else if (config.name == "smfac") {
    const int64_t k = static_cast<int64_t>(std::ceil(config.density * static_cast<double>(d)));
    memory.components.emplace_back("history_values", 4 * m * k);
    memory.components.emplace_back("history_indices", 4 * m * k);
    if (config.error_feedback) memory.components.emplace_back("error", 4 * d);
    memory.components.emplace_back("gram", 8 * m * m);
    if (config.momentum > 0) memory.components.emplace_back("momentum", 4 * d);
  } else if (config.name == "lrmfac") {
    return OptimizerMemory{
        efcp::LowRankMFAC::EstimateMemory(shapes, LrmfacOptions(config)).components};
  }
  return memory;
}

void TrainOptimizer::SetLr(double lr) {
  for (auto& group : optimizer().param_groups()) group.options().set_lr(lr);
}

absl::Status TrainOptimizer::Step() {
  try {
    optimizer().step();
  } catch (const c10::Error& e) {
    return TorchErrorStatus(e, "optimizer step");
  }
  return absl::OkStatus();
}

absl::Status TrainOptimizer::Save(torch::serialize::OutputArchive* archive) {
  try {
    optimizer().save(*archive);
  } catch (const c10::Error& e) {
    return absl::InternalError(
        absl::StrCat("saving optimizer state: ", e.what_without_backtrace()));
  }
  return absl::OkStatus();
}

absl::Status TrainOptimizer::Load(torch::serialize::InputArchive* archive) {
  try {
    optimizer().load(*archive);
  } catch (const c10::Error& e) {
    return absl::DataLossError(
        absl::StrCat("loading optimizer state from the checkpoint: ", e.what_without_backtrace()));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<TrainOptimizer>> MakeOptimizer(const OptimizerConfig& config,
                                                              std::vector<torch::Tensor> params) {
  std::unique_ptr<torch::optim::Optimizer> optimizer;
  if (config.name == "sgd") {
    optimizer = std::make_unique<torch::optim::SGD>(params, torch::optim::SGDOptions(config.lr)
                                                                .momentum(config.momentum)
                                                                .weight_decay(config.weight_decay));
  } else if (config.name == "adam") {
    optimizer =
        std::make_unique<torch::optim::Adam>(params, torch::optim::AdamOptions(config.lr)
                                                         .betas({config.beta1, config.beta2})
                                                         .eps(config.eps)
                                                         .weight_decay(config.weight_decay));
  } else if (config.name == "adamw") {
    optimizer =
        std::make_unique<torch::optim::AdamW>(params, torch::optim::AdamWOptions(config.lr)
                                                          .betas({config.beta1, config.beta2})
                                                          .eps(config.eps)
                                                          .weight_decay(config.weight_decay));
  } else if (config.name == "mfac" || config.name == "smfac" || config.name == "ggt" ||
             config.name == "lrmfac") {
    try {
      std::unique_ptr<efcp::AccountedOptimizer> efcp_optimizer;
      if (config.name == "mfac") {
        efcp_optimizer = std::make_unique<efcp::MFAC>(
            std::vector<torch::optim::OptimizerParamGroup>{
                torch::optim::OptimizerParamGroup(params)},
            MfacOptions(config));
      } else if (config.name == "smfac") {
        efcp_optimizer =
            std::make_unique<efcp::SparseMFAC>(std::move(params), SmfacOptions(config));
      } else if (config.name == "lrmfac") {
        efcp_optimizer =
            std::make_unique<efcp::LowRankMFAC>(std::move(params), LrmfacOptions(config));
      } else {
        efcp_optimizer = std::make_unique<efcp::GGT>(
            std::vector<torch::optim::OptimizerParamGroup>{
                torch::optim::OptimizerParamGroup(params)},
            GgtOptions(config));
      }
      return std::unique_ptr<TrainOptimizer>(new EfcpOptimizer(std::move(efcp_optimizer)));
    } catch (const c10::Error& e) {
      return absl::InvalidArgumentError(
          absl::StrCat("train.optimizer: ", e.what_without_backtrace()));
    }
  } else {
    return absl::UnimplementedError(absl::StrCat("train.optimizer.name: \"", config.name,
                                                 "\" needs efcp/, which this build lacks"));
  }
  return std::unique_ptr<TrainOptimizer>(new TorchOptimizer(std::move(optimizer)));
}

}  // namespace latentd::engine
