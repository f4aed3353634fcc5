#include "efcp/ggt.h"

#include <c10/util/Exception.h>

#include <cmath>

#include "absl/strings/str_cat.h"

namespace efcp {
namespace {

RowWindowConfig ConfigOf(const GGTOptions& o) {
  RowWindowConfig c;
  c.window = o.window();
  c.sparse = o.density() < 1.0;
  c.density = o.density();
  c.error_feedback = o.error_feedback();
  c.topk_scope = o.topk_scope();
  c.block_size = o.block_size();
  c.index_encoding = o.index_encoding();
  c.value_dtype = o.value_dtype();
  return c;
}

RowWindowConfig Checked(const GGTOptions& o,
                        const std::vector<torch::optim::OptimizerParamGroup>& groups) {
  CheckOptionsAndBudget<GGT>(ValidateGGTOptions(o), o, groups, "GGT");
  return ConfigOf(o);
}

}  // namespace

absl::Status ValidateGGTOptions(const GGTOptions& o) {
  if (!(o.lr() >= 0)) {
    return absl::InvalidArgumentError(absl::StrCat("GGTOptions.lr must be >= 0, got ", o.lr()));
  }
  if (o.window() < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("GGTOptions.window must be >= 1, got ", o.window()));
  }
  if (!(o.epsilon() > 0) || !std::isfinite(o.epsilon())) {
    return absl::InvalidArgumentError(
        absl::StrCat("GGTOptions.epsilon must be > 0, got ", o.epsilon()));
  }
  if (!(o.momentum() >= 0 && o.momentum() < 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("GGTOptions.momentum must be in [0, 1), got ", o.momentum()));
  }
  if (!(o.weight_decay() >= 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("GGTOptions.weight_decay must be >= 0, got ", o.weight_decay()));
  }
  return ValidateSparseConfig(ConfigOf(o), "GGTOptions");
}

GGT::GGT(std::vector<torch::optim::OptimizerParamGroup> groups, GGTOptions options)
    : RowWindowOptimizer(groups, std::make_unique<GGTOptions>(options), "GGT", options.non_finite(),
                         Checked(options, groups)),
      options_(options) {
  InitMomentum();
}

MemoryBreakdown GGT::EstimateMemory(const std::vector<std::vector<int64_t>>& shapes,
                                    const GGTOptions& options, at::ScalarType dtype) {
  return EstimateRowWindow(shapes, dtype, ConfigOf(options), options.momentum());
}

AccountedOptimizer::Hyper GGT::HyperOf(const torch::optim::OptimizerOptions& options) const {
  return HyperFrom<GGTOptions>(options);
}

at::Tensor GGT::Coefficients(const at::Tensor& gram, int64_t count, int64_t newest) const {
  at::Tensor k = gram.narrow(0, 0, count).narrow(1, 0, count);
  auto eig = at::linalg_eigh(k);
  at::Tensor sigma = std::get<0>(eig).clamp_min(0).sqrt_();
  const at::Tensor& u = std::get<1>(eig);
  at::Tensor c = u.mv(u.select(0, newest) / (sigma + options_.epsilon()));
  at::Tensor out = at::zeros({gram.size(0)}, k.options());
  out.narrow(0, 0, count).copy_(c);
  return out;
}

}  // namespace efcp
