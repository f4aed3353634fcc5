// latentctl's commands on jobs and devices (the Jobs and Devices services): submit, pipeline,
// get, list, watch, cancel, delete-job, telemetry, devices and train-nodes. Each returns the
// process's exit status as client/cli.h says; `latentctl help` lists their flags.
#ifndef LATENTD_CLIENT_JOB_COMMANDS_H_
#define LATENTD_CLIENT_JOB_COMMANDS_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "client/cli.h"
#include "proto/latentd/v1/jobs.pb.h"

namespace latentd::client::cli {

// latentctl submit: the job of SpecFromFlags() (or with --dry_run, what it would do); prints
// its id.
int Submit(Client& client);

// latentctl pipeline FILE.json: submits a pipeline file's jobs in order (client/pipeline_file.h);
// with --watch, follows them to their ends.
int Pipeline(Client& client, const std::vector<std::string>& args);

// latentctl get ID: one job: its state, dependencies, times, devices, progress, latest
// telemetry and result.
int Get(Client& client, const std::vector<std::string>& args);

// latentctl list: jobs newest first, filtered by --state, --type and --label; --all follows the
// page tokens to the end.
int List(Client& client);

// latentctl watch ID: the job's events after --after until it ends; kExitJobNotSucceeded when it
// ends other than SUCCEEDED.
int Watch(Client& client, const std::vector<std::string>& args);

// latentctl delete-job ID: forgets a finished job (record, events, a TRAIN checkpoint).
int DeleteJob(Client& client, const std::vector<std::string>& args);

// latentctl cancel ID.
int Cancel(Client& client, const std::vector<std::string>& args);

// latentctl devices: the daemon's devices, their memory and the job holding each.
int Devices(Client& client);

// latentctl telemetry ID: every telemetry sample of a job (it may have ended) as a table, and
// with --plot a PNG of loss and memory against steps.
int Telemetry(Client& client, const std::vector<std::string>& args);

// latentctl train-nodes: one TRAIN spec over several nodes (docs/TRAIN.md, "Several latentd
// nodes"): node i gets the ranks after node i-1's, the same rendezvous and run id, and with
// --dataset its own id of the named dataset. Then follows the jobs until all have ended, showing
// rank 0's progress. Talks to each node itself, so it takes no Client.
int TrainNodes();

// The job spec of --spec (a whole JobSpec, or the spec of --type, else of `default_type`) with
// --type, --num_devices, --priority, --label, --after_jobs and --bind applied; the usage error as
// text otherwise.
absl::StatusOr<v1::JobSpec> SpecFromFlags(const std::string& default_type = "");

// Prints how well an EXTRACT output's SAE reconstructs its hook (nothing for DENSE outputs).
void PrintFit(const v1::SaeFit& fit);

}  // namespace latentd::client::cli

#endif  // LATENTD_CLIENT_JOB_COMMANDS_H_
