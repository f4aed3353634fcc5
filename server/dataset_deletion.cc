#include "server/dataset_deletion.h"

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace latentd::server {
namespace {

using latentd::v1::Job;

// Appends `path` when `value` is the dataset, `path[i]` for each element of a list that is.
void AddIfNames(uint64_t id, uint64_t value, const std::string& path,
                std::vector<std::string>* out) {
  if (value == id) out->push_back(path);
}
template <typename List>
void AddEachNaming(uint64_t id, const List& values, const std::string& path,
                   std::vector<std::string>* out) {
  for (int i = 0; i < values.size(); ++i) {
    if (values.Get(i) == id) out->push_back(absl::StrCat(path, "[", i, "]"));
  }
}

void AddExtractFields(uint64_t id, const latentd::v1::ExtractSpec& extract,
                      const std::string& prefix, std::vector<std::string>* out) {
  AddEachNaming(id, extract.model().stored().dataset_ids(),
                absl::StrCat(prefix, ".model.stored.dataset_ids"), out);
}

}  // namespace

std::vector<std::string> DatasetFieldsNaming(const latentd::v1::JobSpec& spec, uint64_t id) {
  std::vector<std::string> fields;
  if (spec.has_extract()) AddExtractFields(id, spec.extract(), "extract", &fields);
  if (spec.has_train()) {
    const latentd::v1::TrainSpec& train = spec.train();
    AddIfNames(id, train.dataset_id(), "train.dataset_id", &fields);
    AddIfNames(id, train.target_dataset_id(), "train.target_dataset_id", &fields);
    AddEachNaming(id, train.cross_layer_dataset_ids(), "train.cross_layer_dataset_ids", &fields);
    AddEachNaming(id, train.crosscoder_dataset_ids(), "train.crosscoder_dataset_ids", &fields);
    if (train.has_activations()) {
      AddExtractFields(id, train.activations(), "train.activations", &fields);
    }
  }
  return fields;
}

absl::Status CheckNoJobNeedsDataset(const std::vector<Job>& unfinished_jobs, uint64_t id,
                                    const std::string& name, uint64_t writer_job_id) {
  for (const Job& job : unfinished_jobs) {
    std::string how;
    if (std::vector<std::string> fields = DatasetFieldsNaming(job.spec(), id); !fields.empty()) {
      how = absl::StrCat("is ", fields[0], " of");
    } else if (writer_job_id != 0 && job.id() == writer_job_id) {
      how = "is being written by";
    } else if (writer_job_id != 0 && job.spec().has_extract() &&
               job.spec().extract().resume_from_job_id() == writer_job_id) {
      how = absl::StrCat("belongs to job ", writer_job_id, ", whose datasets are continued by");
    } else {
      continue;
    }
    return absl::FailedPreconditionError(absl::StrCat(
        "dataset ", id, " (\"", name, "\") ", how, " job ", job.id(), " (",
        latentd::v1::JobState_Name(job.state()), "); cancel it or let it finish first"));
  }
  return absl::OkStatus();
}

absl::Status DeleteDataset(storage::ChunkStore* store, const std::vector<Job>& unfinished_jobs,
                           uint64_t id) {
  absl::StatusOr<latentd::v1::DatasetInfo> info = store->GetDataset(id);
  // A damaged record still lets the dataset go (the store deletes it by its name index); the
  // jobs are then checked by the id their specs give.
  if (!info.ok() && info.status().code() != absl::StatusCode::kDataLoss) return info.status();
  const std::string name = info.ok() ? info->name() : "unreadable";
  const uint64_t writer = info.ok() ? info->job_id() : 0;
  RETURN_IF_ERROR(CheckNoJobNeedsDataset(unfinished_jobs, id, name, writer));
  return store->DeleteDataset(id);
}

}  // namespace latentd::server
