// PROBE jobs: a real self-test of each held device, to check a node before trusting it.
//
// For every device: the throughput of an n x n fp32 matmul (GFLOP/s, 2 n^3 per product) and the
// bandwidth of a device-to-device copy of a large buffer (GB/s, bytes read + written). Results are
// medians over the timed iterations, after one warm-up. Torch-free header.
#ifndef LATENTD_ENGINE_PROBE_H_
#define LATENTD_ENGINE_PROBE_H_

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/job_context.h"
#include "proto/latentd/v1/jobs.pb.h"

namespace latentd::engine {

// INVALID_ARGUMENT naming the field for sizes that are negative or absurd.
absl::Status ValidateProbeSpec(const latentd::v1::ProbeSpec& spec);

absl::StatusOr<latentd::v1::ProbeResult> RunProbe(const latentd::v1::ProbeSpec& spec,
                                                  JobContext* context);

}  // namespace latentd::engine

#endif  // LATENTD_ENGINE_PROBE_H_
