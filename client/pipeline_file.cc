#include "client/pipeline_file.h"

#include <google/protobuf/util/json_util.h>

#include <algorithm>
#include <map>
#include <nlohmann/json.hpp>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace latentd::client {

google::protobuf::Message* MutableTypeSpec(latentd::v1::JobSpec* spec, latentd::v1::JobType type) {
  if (type == latentd::v1::JOB_TYPE_UNSPECIFIED) return nullptr;
  const google::protobuf::FieldDescriptor* member =
      latentd::v1::JobSpec::descriptor()->FindFieldByName(
          absl::AsciiStrToLower(latentd::v1::JobType_Name(type)));
  if (member == nullptr) return nullptr;
  return spec->GetReflection()->MutableMessage(spec, member);
}
namespace {

using nlohmann::json;

constexpr int kMaxJobs = 256;

absl::Status Bad(const std::string& where, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat(where, ": ", what));
}

// A job reference: an earlier job of the file (`*index` set) or the id of a job on the daemon
// (`*id` set).
absl::Status ResolveReference(const std::string& where, const std::string& reference,
                              const std::map<std::string, int>& earlier, int* index, uint64_t* id) {
  *index = -1;
  *id = 0;
  if (auto it = earlier.find(reference); it != earlier.end()) {
    *index = it->second;
    return absl::OkStatus();
  }
  if (absl::SimpleAtoi(reference, id) && *id > 0) return absl::OkStatus();
  return Bad(where,
             absl::StrCat("\"", reference, "\" is no earlier job of the file and no job id"));
}

void AddAfter(std::vector<int>* after, int index) {
  if (std::find(after->begin(), after->end(), index) == after->end()) after->push_back(index);
}

absl::StatusOr<PipelineJob> ParseJob(const json& entry, int i, const std::string& pipeline,
                                     const std::map<std::string, int>& earlier) {
  const std::string where = absl::StrCat("jobs[", i, "]");
  if (!entry.is_object()) return Bad(where, "not an object");
  PipelineJob job;
  if (!entry.contains("name") || !entry["name"].is_string() ||
      entry["name"].get<std::string>().empty()) {
    return Bad(where + ".name", "required, a string");
  }
  job.name = entry["name"].get<std::string>();
  if (earlier.count(job.name) > 0) {
    return Bad(where + ".name", absl::StrCat("\"", job.name, "\" names an earlier job too"));
  }
  if (!entry.contains("type") || !entry["type"].is_string()) {
    return Bad(where + ".type", "required: PROBE, EXTRACT, TRAIN or EXPORT");
  }
  latentd::v1::JobType type;
  if (!latentd::v1::JobType_Parse(entry["type"].get<std::string>(), &type) ||
      type == latentd::v1::JOB_TYPE_UNSPECIFIED) {
    return Bad(where + ".type", absl::StrCat("\"", entry["type"].get<std::string>(),
                                             "\" is not PROBE, EXTRACT, TRAIN or EXPORT"));
  }
  job.spec.set_type(type);
  google::protobuf::Message* inner = MutableTypeSpec(&job.spec, type);
  if (inner == nullptr) return Bad(where + ".type", "has no spec");
  if (entry.contains("spec")) {
    if (!entry["spec"].is_object()) return Bad(where + ".spec", "not an object");
    const auto parsed = google::protobuf::util::JsonStringToMessage(entry["spec"].dump(), inner);
    if (!parsed.ok()) return Bad(where + ".spec", parsed.ToString());
  }
  for (const auto& [key, value] : entry.items()) {
    if (key == "name" || key == "type" || key == "spec" || key == "bind" || key == "after") {
      continue;
    }
    if (key == "label" && value.is_string()) {
      job.spec.set_label(value.get<std::string>());
    } else if (key == "priority" && value.is_number_integer()) {
      job.spec.set_priority(value.get<int>());
    } else if (key == "numDevices" && value.is_number_integer()) {
      job.spec.set_num_devices(value.get<int>());
    } else {
      return Bad(absl::StrCat(where, ".", key),
                 "unknown, or not of its type (name, type, spec, bind, after, label, priority, "
                 "numDevices)");
    }
  }
  if (entry.contains("after")) {
    if (!entry["after"].is_array()) return Bad(where + ".after", "a list of job names or ids");
    for (size_t a = 0; a < entry["after"].size(); ++a) {
      const json& reference = entry["after"][a];
      const std::string text = reference.is_string()   ? reference.get<std::string>()
                               : reference.is_number() ? reference.dump()
                                                       : "";
      int index;
      uint64_t id;
      RETURN_IF_ERROR(
          ResolveReference(absl::StrCat(where, ".after[", a, "]"), text, earlier, &index, &id));
      index >= 0 ? AddAfter(&job.after, index) : AddAfterJob(&job.spec, id);
    }
  }
  if (entry.contains("bind")) {
    if (!entry["bind"].is_object()) {
      return Bad(where + ".bind", "an object {field: \"JOB:OUTPUT\"}");
    }
    for (const auto& [field, value] : entry["bind"].items()) {
      const std::string at = absl::StrCat(where, ".bind.", field);
      const std::string text = value.is_string() ? value.get<std::string>() : "";
      const size_t colon = text.find(':');
      if (colon == std::string::npos || colon == 0 || colon + 1 == text.size()) {
        return Bad(at, "\"JOB:OUTPUT\", e.g. \"dense:extract.dataset_id\"");
      }
      int index;
      uint64_t id;
      RETURN_IF_ERROR(ResolveReference(at, text.substr(0, colon), earlier, &index, &id));
      const std::string output = text.substr(colon + 1);
      if (index >= 0) {
        job.bindings.push_back({index, output, field});
        AddAfter(&job.after, index);
      } else {
        latentd::v1::SpecBinding* binding = job.spec.add_bindings();
        binding->set_job_id(id);
        binding->set_output(output);
        binding->set_field(field);
        AddAfterJob(&job.spec, id);
      }
    }
  }
  if (!pipeline.empty()) job.request_id = absl::StrCat(pipeline, "/", job.name);
  return job;
}

}  // namespace

void AddAfterJob(latentd::v1::JobSpec* spec, uint64_t id) {
  const auto& ids = spec->after_job_ids();
  if (std::find(ids.begin(), ids.end(), id) == ids.end()) spec->add_after_job_ids(id);
}

absl::StatusOr<std::vector<PipelineJob>> ParsePipeline(const std::string& json_text) {
  const json file = json::parse(json_text, nullptr, /*allow_exceptions=*/false);
  if (file.is_discarded()) return absl::InvalidArgumentError("not JSON");
  if (!file.is_object()) return Bad("the file", "a JSON object {\"name\": ..., \"jobs\": [...]}");
  std::string pipeline;
  if (file.contains("name")) {
    if (!file["name"].is_string()) return Bad("name", "a string");
    pipeline = file["name"].get<std::string>();
  }
  for (const auto& [key, value] : file.items()) {
    if (key != "name" && key != "jobs") return Bad(key, "unknown (name, jobs)");
  }
  if (!file.contains("jobs") || !file["jobs"].is_array() || file["jobs"].empty()) {
    return Bad("jobs", "required, a non-empty list");
  }
  if (file["jobs"].size() > kMaxJobs) {
    return Bad("jobs", absl::StrCat("at most ", kMaxJobs, ", got ", file["jobs"].size()));
  }
  std::vector<PipelineJob> jobs;
  std::map<std::string, int> earlier;
  for (size_t i = 0; i < file["jobs"].size(); ++i) {
    ASSIGN_OR_RETURN(PipelineJob job,
                     ParseJob(file["jobs"][i], static_cast<int>(i), pipeline, earlier));
    earlier[job.name] = static_cast<int>(i);
    jobs.push_back(std::move(job));
  }
  return jobs;
}

latentd::v1::JobSpec ResolvedSpec(const PipelineJob& job, const std::vector<uint64_t>& ids) {
  latentd::v1::JobSpec spec = job.spec;
  for (int index : job.after) AddAfterJob(&spec, ids[index]);
  for (const PipelineJob::FileBinding& b : job.bindings) {
    latentd::v1::SpecBinding* binding = spec.add_bindings();
    binding->set_job_id(ids[b.job]);
    binding->set_output(b.output);
    binding->set_field(b.field);
  }
  return spec;
}

}  // namespace latentd::client
