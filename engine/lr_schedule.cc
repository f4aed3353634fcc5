#include "engine/lr_schedule.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"

namespace latentd::engine {

absl::StatusOr<LrScheduleOptions> LrScheduleFromProto(const latentd::v1::LrSchedule& schedule,
                                                      double base_lr, int64_t total_steps) {
  LrScheduleOptions options;
  options.kind = schedule.kind() == latentd::v1::LR_SCHEDULE_UNSPECIFIED ? latentd::v1::CONSTANT
                                                                         : schedule.kind();
  if (!latentd::v1::LrScheduleKind_IsValid(options.kind)) {
    return absl::InvalidArgumentError(
        absl::StrCat("train.schedule.kind: unknown schedule ", static_cast<int>(options.kind)));
  }
  if (schedule.warmup_steps() < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("train.schedule.warmup_steps: must be >= 0, got ", schedule.warmup_steps()));
  }
  if (schedule.step_size() < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("train.schedule.step_size: must be >= 0, got ", schedule.step_size()));
  }
  if (schedule.gamma() < 0 || schedule.gamma() > 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("train.schedule.gamma: must be in (0, 1], got ", schedule.gamma()));
  }
  if (schedule.final_lr_fraction() < 0 || schedule.final_lr_fraction() > 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "train.schedule.final_lr_fraction: must be in [0, 1], got ", schedule.final_lr_fraction()));
  }
  options.base_lr = base_lr;
  options.total_steps = std::max<int64_t>(total_steps, 1);
  options.warmup_steps = schedule.warmup_steps();
  options.gamma = schedule.gamma() == 0 ? 0.1 : schedule.gamma();
  options.step_size = schedule.step_size() > 0
                          ? schedule.step_size()
                          : std::max<int64_t>(1, (options.total_steps - options.warmup_steps) / 3);
  options.final_lr_fraction = schedule.final_lr_fraction();
  return options;
}

double LrAt(const LrScheduleOptions& options, int64_t step) {
  const double base = options.base_lr;
  if (step < options.warmup_steps) {
    return base * static_cast<double>(step + 1) / static_cast<double>(options.warmup_steps);
  }
  const int64_t after = step - options.warmup_steps;
  const int64_t span = std::max<int64_t>(options.total_steps - options.warmup_steps - 1, 1);
  const double t = std::min(1.0, static_cast<double>(after) / static_cast<double>(span));
  const double floor = base * options.final_lr_fraction;
  switch (options.kind) {
    case latentd::v1::LINEAR:
      return base + (floor - base) * t;
    case latentd::v1::COSINE:
      return floor + 0.5 * (base - floor) * (1.0 + std::cos(M_PI * t));
    case latentd::v1::STEP:
      return base * std::pow(options.gamma, static_cast<double>(after / options.step_size));
    default:
      return base;
  }
}

}  // namespace latentd::engine
