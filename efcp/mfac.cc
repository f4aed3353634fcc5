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

const MFACOptions& Checked(const MFACOptions& o, const std::vector<std::vector<int64_t>>& shapes,
                           at::ScalarType dtype) {
  const absl::Status st = ValidateMFACOptions(o);
  TORCH_CHECK(st.ok(), std::string(st.message()));
  if (o.memory_budget_bytes() > 0) {
    const absl::Status fit =
        AdmitMemory(MFAC::EstimateMemory(shapes, o, dtype), o.memory_budget_bytes(), "MFAC");
    TORCH_CHECK(fit.ok(), std::string(fit.message()));
  }
  return o;
}

std::vector<std::vector<int64_t>> ShapesOf(
    const std::vector<torch::optim::OptimizerParamGroup>& groups, at::ScalarType* dtype) {
  std::vector<std::vector<int64_t>> shapes;
  for (const auto& g : groups) {
    for (const auto& p : g.params()) {
      shapes.push_back(p.sizes().vec());
      *dtype = p.scalar_type();
    }
  }
  return shapes;
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
                         options.non_finite(), ConfigOf([&] {
                           at::ScalarType dtype = at::kFloat;
                           auto shapes = ShapesOf(groups, &dtype);
                           return Checked(options, shapes, dtype);
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
