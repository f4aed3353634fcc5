#include "server/dataset_deletion.h"

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "common/status_macros.h"

namespace latentd::server {
namespace {

using latentd::v1::Job;

// Whether `field` holds dataset ids: a uint64 named dataset_id(s) or *_dataset_id(s). Found by
// name, so that a dataset field a spec gains later is checked without a list to keep in step.
bool HoldsDatasetIds(const google::protobuf::FieldDescriptor& field) {
  if (field.cpp_type() != google::protobuf::FieldDescriptor::CPPTYPE_UINT64) return false;
  const std::string& name = field.name();
  const absl::string_view suffix = field.is_repeated() ? "dataset_ids" : "dataset_id";
  return absl::EndsWith(name, suffix) &&
         (name.size() == suffix.size() || name[name.size() - suffix.size() - 1] == '_');
}

// Appends the paths under `message` (named `prefix`) of every field that names dataset `id`.
void AddFieldsNaming(const google::protobuf::Message& message, const std::string& prefix,
                     uint64_t id, std::vector<std::string>* out) {
  const google::protobuf::Reflection& reflection = *message.GetReflection();
  std::vector<const google::protobuf::FieldDescriptor*> fields;
  reflection.ListFields(message, &fields);  // the fields set, by number
  for (const google::protobuf::FieldDescriptor* field : fields) {
    const std::string path = prefix.empty() ? field->name() : prefix + "." + field->name();
    if (field->cpp_type() == google::protobuf::FieldDescriptor::CPPTYPE_MESSAGE) {
      if (field->is_repeated()) {
        for (int i = 0; i < reflection.FieldSize(message, field); ++i) {
          AddFieldsNaming(reflection.GetRepeatedMessage(message, field, i),
                          absl::StrCat(path, "[", i, "]"), id, out);
        }
      } else {
        AddFieldsNaming(reflection.GetMessage(message, field), path, id, out);
      }
    } else if (HoldsDatasetIds(*field)) {
      if (!field->is_repeated()) {
        if (reflection.GetUInt64(message, field) == id) out->push_back(path);
        continue;
      }
      for (int i = 0; i < reflection.FieldSize(message, field); ++i) {
        if (reflection.GetRepeatedUInt64(message, field, i) == id) {
          out->push_back(absl::StrCat(path, "[", i, "]"));
        }
      }
    }
  }
}

}  // namespace

std::vector<std::string> DatasetFieldsNaming(const latentd::v1::JobSpec& spec, uint64_t id) {
  std::vector<std::string> fields;
  AddFieldsNaming(spec, "", id, &fields);
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
