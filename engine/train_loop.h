// The training loop of a TRAIN job, independent of where rows come from and where checkpoints go:
// step -> lr -> batch slice of this rank -> forward/backward -> all-reduce -> optimizer step, with
// telemetry, checkpoints, NaN detection and cancellation at step boundaries.
//
// Determinism: the batch of step s is stream rows [s*B, (s+1)*B) (B = global batch), split into
// contiguous rank slices, and the lr is a pure function of s. So the checkpoint needs only the
// step, the model, the optimizer and the dead-latent counters, and a resumed run (or a run on more
// ranks, up to summation order) computes what an uninterrupted one computes.
#ifndef LATENTD_ENGINE_TRAIN_LOOP_H_
#define LATENTD_ENGINE_TRAIN_LOOP_H_

#include <torch/serialize/archive.h>
#include <torch/types.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/checkpoint.h"
#include "engine/data_parallel.h"
#include "engine/job_context.h"
#include "engine/lr_schedule.h"
#include "engine/optimizer_factory.h"
#include "engine/train_data.h"
#include "proto/latentd/v1/train.pb.h"

namespace latentd::engine {

// What the loop trains: an SAE or a TorchScript module with a loss.
class TrainableModel {
 public:
  struct Output {
    torch::Tensor loss;  // scalar with graph, the mean over this rank's rows
    // SAEs: what the FVU is made of, summed over this rank's rows, so that the loop adds them
    // over the ranks and divides once, giving the FVU of the global batch whatever the world
    // size (an average of the ranks' own FVUs would measure each slice against its own mean).
    // The reconstruction's squared error; the rows about a point every rank shares (the SAE's
    // b_dec, near the mean, so float32 sums keep their digits): sum ||x - c||^2 and sum (x - c),
    // from which sum ||x - mean||^2 = sum ||x - c||^2 - ||sum (x - c)||^2 / rows.
    double squared_error = std::numeric_limits<double>::quiet_NaN();
    double centred_squares = 0;
    torch::Tensor centred_sum;  // [width] float32 on the CPU; undefined for other models
    double l0 = std::numeric_limits<double>::quiet_NaN();
    torch::Tensor fired;  // SAEs: d_sae floats, 1 where a latent fired in the batch; else undefined
    double aux_k_loss = 0;  // TopK SAEs: the AuxK term (0 when no latent is dead)
    // Matryoshka SAEs: each inner level's squared error, narrowest first; as many every step.
    std::vector<double> prefix_squared_error;
    // Models with fvu_blocks(): each block's squared error and sum ||y_b - c_b||^2 (c as for
    // centred_squares; the block's share of centred_sum is its columns), blocks in order.
    std::vector<double> block_squared_error;
    std::vector<double> block_centred_squares;
  };
  virtual ~TrainableModel() = default;
  // Parameters, in a fixed order (optimizer, all-reduce and checkpoints rely on it).
  virtual std::vector<torch::Tensor> parameters() = 0;
  // State the optimizer does not train but a resumed run needs (BatchTopK's threshold), in a
  // fixed order; checkpointed with the parameters. Each rank keeps its own (from its rows);
  // rank 0's is checkpointed and saved.
  virtual std::vector<torch::Tensor> buffers() { return {}; }
  virtual absl::StatusOr<Output> Forward(const torch::Tensor& batch) = 0;
  // Called once on a fresh (not resumed) run with the first rows of the stream.
  virtual void InitFromData(const torch::Tensor& rows) {}
  virtual void BeforeOptimizerStep() {}
  virtual void AfterOptimizerStep() {}
  virtual int64_t num_latents() const { return 0; }
  // Matryoshka SAEs: the inner level widths of Output::prefix_squared_error, narrowest first.
  virtual std::vector<int64_t> prefix_widths() const { return {}; }
  // Models whose target is several blocks side by side (a cross-layer transcoder's every block's
  // output): the blocks' widths, in the order of the target's columns, each reported with its
  // own FVU (Output::block_squared_error). Empty: one FVU.
  virtual std::vector<int64_t> fvu_blocks() const { return {}; }
  // Before each Forward of a model that uses_dead_latents(): bool [num_latents()] on the
  // training device, true for latents that have not fired for a full dead_window_steps (TopK
  // SAEs train their AuxK loss on them).
  virtual void SetDeadLatents(const torch::Tensor& dead) {}
  // Whether the model takes that mask (it costs a compare and a copy to the device every step):
  // TopK and BatchTopK SAEs training with AuxK.
  virtual bool uses_dead_latents() const { return false; }
  // After the last step, before the final checkpoint, for models whose inference differs from
  // their training (BatchTopK's threshold): `batches` of the training stream's first rows, each
  // as many rows as a rank trains on, the same on every rank. Returns a line for the job's log.
  virtual bool wants_calibration() const { return false; }
  virtual std::string Calibrate(const std::vector<torch::Tensor>& batches) { return ""; }
  // Writes the trained model into directory `dir` (created when missing).
  virtual absl::Status Save(const std::string& dir) = 0;
  // Figures about the trained model for the job's result (a crosscoder's split of its latents
  // between its sources), after the last step.
  virtual void AddToResult(latentd::v1::TrainResult* result) {}
};

struct TrainLoopOptions {
  int64_t batch_size = 256;  // global rows per step, split over the ranks
  int64_t total_steps = 1;
  LrScheduleOptions lr;
  int64_t checkpoint_every = 100;
  int64_t telemetry_every = 10;
  // A latent is dead when it has not fired in the last dead_window_steps steps (telemetry: or in
  // all steps so far, before that many; AuxK waits for the full window). Default 1000.
  int64_t dead_window_steps = 1000;
  // Rows the model's data initialisation (b_dec) sees. Default 4096.
  int64_t init_rows = 4096;
  c10::Device device = c10::Device(c10::kCPU);
  // For dense_mfac_history_bytes in telemetry.
  int64_t mfac_window = 64;
  // The rank that writes `checkpoints` and reports to the job. 0, or with ranks on several
  // nodes each node's first rank: every node keeps its own checkpoints and telemetry.
  int local_leader_rank = 0;
  // Ranks on several nodes: rank 0 restores its latest checkpoint or initialises from its data,
  // then broadcasts that state and every other rank restores it. Without it each rank restores
  // or initialises its own, which is exact only when the ranks share a store and a machine.
  bool share_start_state = false;
  // Every rank makes the same stream reads in the same order (the whole global batch at each
  // step, then its slice of it; the same rows for initialisation and calibration): needed when
  // the rows are computed by the ranks together (a ModelRowSource sharing its work), whose reads
  // are collectives. Default false: each rank reads only its own slice.
  bool collective_reads = false;
  // Tests: stop (as a kill would) once this step is done, without a final checkpoint. -1: never.
  int64_t crash_after_step = -1;
};

struct TrainLoopResult {
  int64_t steps = 0;
  double final_loss = 0;
  double final_fvu = 0;
  double final_l0 = 0;
  std::vector<double> final_prefix_fvu;  // Matryoshka SAEs
  std::vector<double> final_block_fvu;   // models with fvu_blocks()
  int64_t peak_optimizer_state_bytes = 0;
  int64_t resumed_from_step = -1;  // -1 when the run started fresh
  latentd::v1::TrainTelemetry last_telemetry;
};

// Runs steps until options.total_steps. `checkpoints` (may be null) is read by every rank to
// resume (by rank 0 only with share_start_state) and written by options.local_leader_rank only;
// `context` (may be null) is used on that rank only; `cancel` (may
// be null) is polled by every rank, and the ranks agree on it through the all-reduce so that none
// waits on a collective the others left.
// Resumes from checkpoints->LoadLatest() when there is one. Returns CANCELLED on cancel, an
// error with reason NUMERICAL (WithReason) on a non-finite loss, naming the step.
absl::StatusOr<TrainLoopResult> RunTrainLoop(const TrainLoopOptions& options, TrainableModel* model,
                                             TrainOptimizer* optimizer, ShuffledRowStream* stream,
                                             int64_t width, GradientSync* sync,
                                             CheckpointStore* checkpoints, JobContext* context,
                                             const std::function<bool()>& cancel);

// Sum of bytes of the given tensors (defined ones only).
int64_t TensorListBytes(const std::vector<torch::Tensor>& tensors);

}  // namespace latentd::engine

#endif  // LATENTD_ENGINE_TRAIN_LOOP_H_
