// AccountedOptimizer: the common base of the efcp optimizers.
//
// It is a torch::optim::Optimizer that also
//  * reports the exact bytes of the state it holds (memory_breakdown()),
//  * applies the non-finite gradient policy and counts skipped steps,
//  * checks that no parameter changes shape between steps,
//  * lays the parameters out as "slots" (one per parameter tensor, in param
//    group order) and "shards" (the slots that share a device and dtype,
//    concatenated into one flat vector),
//  * applies the final update p -= lr * (momentum of) u per parameter group,
//  * saves/loads its whole state with torch::serialize archives
//    (torch::save(optimizer, path) / torch::load(optimizer, path) work).
//
// Per-group options honoured: lr, momentum, weight_decay, weight_decay_kind.
// Every other option (window, damp, density, ...) is structural and is taken
// from the options the optimizer was constructed with.
//
// Errors are thrown as c10::Error (the torch convention); module boundaries
// that need absl::Status catch it (see efcp/status.h-free Validate*Options
// functions in each optimizer header, which return absl::Status).
#ifndef EFCP_ACCOUNTED_OPTIMIZER_H_
#define EFCP_ACCOUNTED_OPTIMIZER_H_

#include <ATen/ATen.h>
#include <torch/optim/optimizer.h>
#include <torch/serialize/archive.h>

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "efcp/memory.h"
#include "efcp/options_common.h"

namespace efcp {

// Shapes of every parameter of `groups`, in order; *dtype gets the last parameter's dtype.
inline std::vector<std::vector<int64_t>> ParamShapes(
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

// What every efcp constructor checks before allocating: throws c10::Error with `valid`'s message
// when it is not OK, and with AdmitMemory's when Optimizer::EstimateMemory for `groups` exceeds
// options.memory_budget_bytes() (when that is > 0).
template <typename Optimizer, typename Options>
void CheckOptionsAndBudget(const absl::Status& valid, const Options& options,
                           const std::vector<torch::optim::OptimizerParamGroup>& groups,
                           const char* name) {
  TORCH_CHECK(valid.ok(), std::string(valid.message()));
  if (options.memory_budget_bytes() <= 0) return;
  at::ScalarType dtype = at::kFloat;
  const std::vector<std::vector<int64_t>> shapes = ParamShapes(groups, &dtype);
  const absl::Status fit = AdmitMemory(Optimizer::EstimateMemory(shapes, options, dtype),
                                       options.memory_budget_bytes(), name);
  TORCH_CHECK(fit.ok(), std::string(fit.message()));
}

// Bytes a tensor's elements occupy (0 when undefined).
int64_t TensorBytes(const at::Tensor& t);

class AccountedOptimizer : public torch::optim::Optimizer {
 public:
  // Exact bytes of the optimizer state, from the tensors currently held.
  virtual MemoryBreakdown memory_breakdown() const = 0;

  // Steps skipped because of non-finite gradients (NonFinitePolicy::kSkip).
  int64_t skipped_steps() const { return skipped_steps_; }
  // Steps that changed the parameters.
  int64_t applied_steps() const { return applied_steps_; }

  void save(torch::serialize::OutputArchive& archive) const override;
  void load(torch::serialize::InputArchive& archive) override;

 protected:
  struct Hyper {
    double lr = 0;
    double momentum = 0;
    double weight_decay = 0;
    WeightDecayKind weight_decay_kind = WeightDecayKind::kCoupled;
  };
  // The Hyper of an efcp options struct (each has lr, momentum, weight_decay and its kind).
  template <typename Options>
  static Hyper HyperFrom(const torch::optim::OptimizerOptions& options) {
    const auto& o = static_cast<const Options&>(options);
    return Hyper{o.lr(), o.momentum(), o.weight_decay(), o.weight_decay_kind()};
  }
  struct Slot {
    at::Tensor param;
    size_t group = 0;
    size_t shard = 0;
    int64_t offset = 0;  // in the shard's flat vector
    int64_t numel = 0;
    std::vector<int64_t> shape;
  };
  struct Shard {
    at::Device device = at::kCPU;
    at::ScalarType dtype = at::kFloat;
    int64_t numel = 0;
    std::vector<size_t> slots;
  };

  AccountedOptimizer(std::vector<torch::optim::OptimizerParamGroup> groups,
                     std::unique_ptr<torch::optim::OptimizerOptions> defaults, std::string kind,
                     NonFinitePolicy policy);
  // Allocates the momentum buffers of the groups with momentum != 0; derived
  // constructors call it last (it needs HyperOf).
  void InitMomentum();

  // Per-group hyper-parameters, read from that group's options.
  virtual Hyper HyperOf(const torch::optim::OptimizerOptions& options) const = 0;
  // Derived state (archive keys must not start with "efcp.").
  virtual void SaveState(torch::serialize::OutputArchive& archive) const = 0;
  virtual void LoadState(torch::serialize::InputArchive& archive) = 0;

  // Checks shapes and the non-finite policy. Returns the effective gradient of
  // each slot (coupled weight decay applied; undefined when the parameter has
  // no gradient), or an empty vector when the step must not happen.
  std::vector<at::Tensor> BeginStep();
  // p -= lr * u (through momentum; decoupled weight decay first).
  void ApplyUpdate(size_t slot, const at::Tensor& direction);
  void EndStep() { ++applied_steps_; }

  // Adds the momentum bytes; used by memory_breakdown().
  int64_t MomentumBytes() const;
  // What the momentum buffers of `shapes` take when momentum != 0.
  static int64_t EstimateMomentumBytes(const std::vector<std::vector<int64_t>>& shapes,
                                       at::ScalarType dtype, double momentum);

  // Reads a tensor from `archive` and copies it into `held` (same shape).
  static void ReadInto(torch::serialize::InputArchive& archive, const std::string& key,
                       at::Tensor& held);
  static int64_t ReadInt(torch::serialize::InputArchive& archive, const std::string& key);

  std::vector<Slot> slots_;
  std::vector<Shard> shards_;
  std::string kind_;

 private:
  NonFinitePolicy policy_;
  std::vector<at::Tensor> momentum_;  // per slot; undefined without momentum
  int64_t skipped_steps_ = 0;
  int64_t applied_steps_ = 0;
};

}  // namespace efcp

#endif  // EFCP_ACCOUNTED_OPTIMIZER_H_
