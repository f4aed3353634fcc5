// Optimizers by name for TRAIN jobs: sgd, adam, adamw (LibTorch's) and the EFCP family mfac,
// smfac, lrmfac, ggt (efcp/). One wrapper gives the trainer what it needs of any of them: the lr
// knob, a step that returns a Status, a byte count of its state by component (from the
// optimizer's own accounting), and save/load for checkpoints.
#ifndef LATENTD_ENGINE_OPTIMIZER_FACTORY_H_
#define LATENTD_ENGINE_OPTIMIZER_FACTORY_H_

#include <torch/optim/optimizer.h>
#include <torch/serialize/archive.h>
#include <torch/types.h>

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "proto/latentd/v1/train.pb.h"

namespace latentd::engine {

// Bytes of optimizer state by component ("exp_avg", "history_values", "gram", ...).
struct OptimizerMemory {
  std::vector<std::pair<std::string, int64_t>> components;
  int64_t total() const;
};

// An OptimizerSpec with its defaults filled in (see train.proto for each default).
struct OptimizerConfig {
  std::string name;
  double lr = 0;
  double momentum = 0;
  double weight_decay = 0;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double damp = 1e-6;
  int64_t window = 64;
  double density = 0.01;
  bool error_feedback = true;
  int64_t rank = 4;
  uint64_t seed = 0;  // lrmfac's power-iteration start; set from TrainSpec.seed by the job
};

// Checks `spec` (INVALID_ARGUMENT naming "train.optimizer.<field>") and fills in the defaults.
absl::StatusOr<OptimizerConfig> OptimizerConfigFromProto(const latentd::v1::OptimizerSpec& spec);

// What the optimizer's state will take for parameters of these shapes, before anything is
// allocated (admission control). For the EFCP optimizers this is their own static estimate.
OptimizerMemory EstimateOptimizerMemory(const OptimizerConfig& config,
                                        const std::vector<std::vector<int64_t>>& shapes);
// What dense M-FAC's gradient history (m rows of d fp32) takes: 4 * m * d.
int64_t DenseMfacHistoryBytes(int64_t d, int64_t m);

class TrainOptimizer {
 public:
  virtual ~TrainOptimizer() = default;
  virtual torch::optim::Optimizer& optimizer() = 0;
  // Exact bytes of the state allocated now.
  virtual OptimizerMemory Memory() const = 0;

  void SetLr(double lr);
  // One step on the gradients already in the parameters; a torch error becomes INTERNAL (or
  // RESOURCE_EXHAUSTED for an allocation failure).
  absl::Status Step();
  absl::Status Save(torch::serialize::OutputArchive* archive);
  absl::Status Load(torch::serialize::InputArchive* archive);
};

absl::StatusOr<std::unique_ptr<TrainOptimizer>> MakeOptimizer(const OptimizerConfig& config,
                                                              std::vector<torch::Tensor> params);

}  // namespace latentd::engine

#endif  // LATENTD_ENGINE_OPTIMIZER_FACTORY_H_
