#include "efcp/sparse_mfac.h"

#include <c10/util/Exception.h>

#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"
#include "efcp/mfac.h"

namespace efcp {
namespace {

RowWindowConfig ConfigOf(const SparseMFACOptions& o) {
  RowWindowConfig c;
  c.window = o.window();
  c.sparse = true;
  c.density = o.density();
  c.k = o.k();
  c.error_feedback = o.error_feedback();
  c.topk_scope = o.topk_scope();
  c.block_size = o.block_size();
  c.index_encoding = o.index_encoding();
  c.value_dtype = o.value_dtype();
  return c;
}

MFACOptions DenseOf(const SparseMFACOptions& o) {
  return MFACOptions(o.lr())
      .damp(o.damp())
      .window(o.window())
      .momentum(o.momentum())
      .weight_decay(o.weight_decay());
}

std::string Renamed(const absl::Status& st) {
  std::string msg(st.message());
  const std::string from = "MFACOptions.";
  if (msg.rfind(from, 0) == 0) msg = "SparseMFACOptions." + msg.substr(from.size());
  return msg;
}

RowWindowConfig Checked(const SparseMFACOptions& o,
                        const std::vector<torch::optim::OptimizerParamGroup>& groups) {
  CheckOptionsAndBudget<SparseMFAC>(ValidateSparseMFACOptions(o), o, groups, "SparseMFAC");
  return ConfigOf(o);
}

}  // namespace

absl::Status ValidateSparseMFACOptions(const SparseMFACOptions& o) {
  const absl::Status dense = ValidateMFACOptions(DenseOf(o));
  if (!dense.ok()) return absl::InvalidArgumentError(Renamed(dense));
  return ValidateSparseConfig(ConfigOf(o), "SparseMFACOptions");
}

SparseMFAC::SparseMFAC(std::vector<torch::optim::OptimizerParamGroup> groups,
                       SparseMFACOptions options)
    : RowWindowOptimizer(groups, std::make_unique<SparseMFACOptions>(options), "SparseMFAC",
                         options.non_finite(), Checked(options, groups)),
      options_(options) {
  InitMomentum();
}

MemoryBreakdown SparseMFAC::EstimateMemory(const std::vector<std::vector<int64_t>>& shapes,
                                           const SparseMFACOptions& options, at::ScalarType dtype) {
  return EstimateRowWindow(shapes, dtype, ConfigOf(options), options.momentum());
}

AccountedOptimizer::Hyper SparseMFAC::HyperOf(const torch::optim::OptimizerOptions& options) const {
  return HyperFrom<SparseMFACOptions>(options);
}

at::Tensor SparseMFAC::Coefficients(const at::Tensor& gram, int64_t count, int64_t newest) const {
  return MfacCoefficients(gram, count, newest, options_.scaling(), options_.window(),
                          options_.damp(), shards_[0].dtype);
}

}  // namespace efcp
