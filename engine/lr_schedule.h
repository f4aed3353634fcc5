// Learning-rate schedules for TRAIN jobs: constant, linear, cosine and step decay, each with an
// optional linear warm-up. Torch-free and pure: the lr of a step depends only on the options and
// the step, so a resumed job continues the same curve without storing schedule state.
#ifndef LATENTD_ENGINE_LR_SCHEDULE_H_
#define LATENTD_ENGINE_LR_SCHEDULE_H_

#include <cstdint>

#include "absl/status/statusor.h"
#include "proto/latentd/v1/train.pb.h"

namespace latentd::engine {

struct LrScheduleOptions {
  latentd::v1::LrScheduleKind kind = latentd::v1::CONSTANT;
  double base_lr = 1e-3;
  // Steps of linear warm-up from base_lr / warmup_steps to base_lr. Default 0 (none).
  int64_t warmup_steps = 0;
  // STEP: multiply by gamma every step_size steps after warm-up. Default step_size = total / 3.
  int64_t step_size = 0;
  double gamma = 0.1;
  // LINEAR / COSINE: the lr at the last step, as a fraction of base_lr. Default 0.
  double final_lr_fraction = 0.0;
  // Steps of the whole run; LINEAR and COSINE decay over [warmup_steps, total_steps).
  int64_t total_steps = 1;
};

// Checks `schedule` (fields named "train.schedule.*") and fills in the defaults.
absl::StatusOr<LrScheduleOptions> LrScheduleFromProto(const latentd::v1::LrSchedule& schedule,
                                                      double base_lr, int64_t total_steps);

// The lr of 0-based step `step`.
double LrAt(const LrScheduleOptions& options, int64_t step);

}  // namespace latentd::engine

#endif  // LATENTD_ENGINE_LR_SCHEDULE_H_
