// Which engine entry point runs each job type, and the environment those runners need.
#ifndef LATENTD_SERVER_JOB_RUNNERS_H_
#define LATENTD_SERVER_JOB_RUNNERS_H_

#include <map>
#include <string>
#include <vector>

#include "server/job_manager.h"

namespace latentd::server {

struct RunnerEnvironment {
  std::vector<std::string> data_roots;
  std::string artifact_dir;
};

std::map<latentd::v1::JobType, JobRunner> MakeJobRunners(const RunnerEnvironment& env);

}  // namespace latentd::server

#endif  // LATENTD_SERVER_JOB_RUNNERS_H_
