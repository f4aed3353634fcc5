// The EXTRACT job as the job runner calls it. Torch-free: the server includes this.
//
//   ValidateExtractJob(spec, env)   -- at submit
//   RunExtract(spec, env, ctx)      -- in the job's thread
//
// RunExtract creates the dataset (dataset_name, default "extract-<job id>") in env.store, or, when
// it exists for the same job id, resumes it at its watermark; the final dataset equals, row for
// row, that of an uninterrupted run. It returns CANCELLED promptly after ctx->cancel_requested()
// (committed rows stay), and on failure leaves nothing beyond the last commit. With
// resume_from_job_id it takes the dataset of that FAILED or CANCELLED job over and continues it
// the same way.
#ifndef LATENTD_ENGINE_EXTRACT_JOB_H_
#define LATENTD_ENGINE_EXTRACT_JOB_H_

#include "absl/status/statusor.h"
#include "engine/extract_runner.h"
#include "engine/job_context.h"
#include "proto/latentd/v1/extract.pb.h"

namespace latentd::engine {

// ValidateExtractSpec (extract_runner.h) with free_disk_bytes, when unset, read from the store's
// disk; and with resume_from_job_id that the continued job's dataset still exists and is still
// that job's (FAILED_PRECONDITION otherwise).
absl::Status ValidateExtractJob(const latentd::v1::ExtractSpec& spec, const ExtractEnv& env);
// What that job would do, after the same checks (DescribeExtractSpec, and the datasets a
// continuation takes over): the answer to a dry run.
absl::StatusOr<std::vector<std::string>> DescribeExtractJob(const latentd::v1::ExtractSpec& spec,
                                                            const ExtractEnv& env);

absl::StatusOr<latentd::v1::ExtractResult> RunExtract(const latentd::v1::ExtractSpec& spec,
                                                      const ExtractEnv& env, JobContext* ctx);

// The SinkOpener that creates or resumes datasets in `store` (what RunExtract uses).
SinkOpener ChunkStoreSinkOpener(storage::ChunkStore* store);
// ExtractEnv::open_stored_dense over the DENSE datasets of `store`.
StoredDenseOpener ChunkStoreDenseOpener(const storage::ChunkStore* store);

}  // namespace latentd::engine

#endif  // LATENTD_ENGINE_EXTRACT_JOB_H_
