// Deleting a dataset that jobs still need. The store itself refuses only while a writer holds
// the dataset open (a RUNNING EXTRACT); a PENDING job that will read it (a TRAIN job, a SPARSE
// extraction over stored activations, a pipeline job that takes it from a finished job's
// result) or continue it (an interrupted EXTRACT, a resume_from_job_id of its job) would fail
// when it starts, or lose the rows committed so far. These checks make the deletion wait.
#ifndef LATENTD_SERVER_DATASET_DELETION_H_
#define LATENTD_SERVER_DATASET_DELETION_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "proto/latentd/v1/jobs.pb.h"
#include "storage/chunk_store.h"

namespace latentd::server {

// The fields of `spec` that name dataset `id`, as paths in proto names with list indices
// ("train.dataset_id", "train.crosscoder_dataset_ids[1]", "extract.model.stored.dataset_ids[0]"),
// ascending field numbers at each level. A field names datasets when it is a uint64 called
// dataset_id(s) or *_dataset_id(s), wherever it lies in the spec.
std::vector<std::string> DatasetFieldsNaming(const latentd::v1::JobSpec& spec, uint64_t id);

// OK when no job of `unfinished_jobs` needs dataset `id` (called `name`), written by job
// `writer_job_id` (DatasetInfo.job_id; 0 when unknown). FAILED_PRECONDITION naming the first
// job that does, its state and how: a field of its spec names the dataset, it is the job writing
// it (it resumes at the watermark after an interruption), or it continues the writer's datasets
// (extract.resume_from_job_id).
absl::Status CheckNoJobNeedsDataset(const std::vector<latentd::v1::Job>& unfinished_jobs,
                                    uint64_t id, const std::string& name, uint64_t writer_job_id);

// Deletes dataset `id` from `store` once CheckNoJobNeedsDataset allows it. A dataset whose
// record cannot be read (DATA_LOSS) is checked by the jobs' fields alone and deleted as the store
// allows. NOT_FOUND for an unknown id. A job submitted between the check and the delete fails at
// its start with NOT_FOUND naming the dataset field.
absl::Status DeleteDataset(storage::ChunkStore* store,
                           const std::vector<latentd::v1::Job>& unfinished_jobs, uint64_t id);

}  // namespace latentd::server

#endif  // LATENTD_SERVER_DATASET_DELETION_H_
