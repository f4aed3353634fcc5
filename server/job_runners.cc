#include "server/job_runners.h"

#include "engine/probe.h"

namespace latentd::server {

std::map<latentd::v1::JobType, JobRunner> MakeJobRunners(const RunnerEnvironment& /*env*/) {
  std::map<latentd::v1::JobType, JobRunner> runners;

  JobRunner probe;
  probe.validate = [](const latentd::v1::JobSpec& spec) {
    return engine::ValidateProbeSpec(spec.probe());
  };
  probe.run = [](const latentd::v1::JobSpec& spec,
                 engine::JobContext* context) -> absl::StatusOr<latentd::v1::JobResult> {
    auto result = engine::RunProbe(spec.probe(), context);
    if (!result.ok()) return result.status();
    latentd::v1::JobResult out;
    *out.mutable_probe() = std::move(*result);
    return out;
  };
  runners[latentd::v1::PROBE] = probe;
  return runners;
}

}  // namespace latentd::server
