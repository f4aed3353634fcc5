#include "efcp/mfac.h"

#include <c10/util/Exception.h>

#include <limits>

#include "absl/strings/str_cat.h"

namespace efcp {
namespace {

RowWindowConfig ConfigOf(const MFACOptions& o) {
  RowWindowConfig c;
  c.window = o.window();
  c.sparse = false;
  return c;
}

}  // namespace

absl::Status ValidateMFACOptions(const MFACOptions& o) {
  if (!(o.lr() >= 0))
    return absl::InvalidArgumentError(absl::StrCat("MFACOptions.lr must be >= 0, got ", o.lr()));
  if (!(o.damp() > 0) || !std::isfinite(o.damp())) {
    return absl::InvalidArgumentError(absl::StrCat("MFACOptions.damp must be > 0, got ", o.damp()));
  }
  if (o.window() < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("MFACOptions.window must be >= 1, got ", o.window()));
  }
  if (!(o.momentum() >= 0 && o.momentum() < 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("MFACOptions.momentum must be in [0, 1), got ", o.momentum()));
  }
  if (!(o.weight_decay() >= 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("MFACOptions.weight_decay must be >= 0, got ", o.weight_decay()));
  }
  return absl::OkStatus();
}

MFAC::MFAC(std::vector<torch::optim::OptimizerParamGroup> groups, MFACOptions options)
    : RowWindowOptimizer(groups, std::make_unique<MFACOptions>(options), "MFAC",
                         options.non_finite(), ConfigOf([&]() -> const MFACOptions& {
                           CheckOptionsAndBudget<MFAC>(ValidateMFACOptions(options), options,
                                                       groups, "MFAC");
                           return options;
                         }())),
      options_(options) {
  InitMomentum();
}

MemoryBreakdown MFAC::EstimateMemory(const std::vector<std::vector<int64_t>>& shapes,
                                     const MFACOptions& options, at::ScalarType dtype) {
  return EstimateRowWindow(shapes, dtype, ConfigOf(options), options.momentum());
}

AccountedOptimizer::Hyper MFAC::HyperOf(const torch::optim::OptimizerOptions& options) const {
  return HyperFrom<MFACOptions>(options);
}

at::Tensor MFAC::Coefficients(const at::Tensor& gram, int64_t count, int64_t newest) const {
  return MfacCoefficients(gram, count, newest, options_.scaling(), options_.window(),
                          options_.damp(), shards_[0].dtype);
}

}  // namespace efcp
