#include "server/spec_bindings.h"

#include <google/protobuf/descriptor.h>
#include <google/protobuf/message.h>

#include <limits>
#include <set>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/status_macros.h"

namespace latentd::server {
namespace {

using google::protobuf::Descriptor;
using google::protobuf::FieldDescriptor;
using google::protobuf::Message;
using google::protobuf::Reflection;
using latentd::v1::JobResult;
using latentd::v1::JobSpec;
using latentd::v1::JobType;

// One step of a path: a field, and for a repeated field the element it picks (-1: none).
struct PathStep {
  const FieldDescriptor* field;
  int index = -1;
};

const FieldDescriptor* FindField(const Descriptor* type, absl::string_view name) {
  if (const FieldDescriptor* f = type->FindFieldByName(std::string(name))) return f;
  for (int i = 0; i < type->field_count(); ++i) {
    if (type->field(i)->json_name() == name) return type->field(i);
  }
  return nullptr;
}

// Resolves `path` in the schema of `root`, ending at a scalar field. A repeated scalar may end
// the path without an index only when `allow_append`.
absl::StatusOr<std::vector<PathStep>> ResolvePath(const Descriptor* root, const std::string& path,
                                                  bool allow_append) {
  if (path.empty()) return absl::InvalidArgumentError("empty path");
  std::vector<absl::string_view> parts = absl::StrSplit(path, '.');
  std::vector<PathStep> steps;
  const Descriptor* type = root;
  for (size_t i = 0; i < parts.size(); ++i) {
    if (type == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("\"", path, "\": ", steps.back().field->name(),
                                                     " is a value, it has no \"", parts[i], "\""));
    }
    const FieldDescriptor* field = FindField(type, parts[i]);
    if (field == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("\"", path, "\": ", type->name(), " has no field \"", parts[i], "\""));
    }
    PathStep step{field};
    if (field->is_repeated()) {
      if (field->is_map()) {
        return absl::InvalidArgumentError(absl::StrCat("\"", path, "\": ", field->name(),
                                                       " is a map, which bindings do not reach"));
      }
      int index = -1;
      if (i + 1 < parts.size() && absl::SimpleAtoi(parts[i + 1], &index) && index >= 0) {
        step.index = index;
        ++i;
      } else if (!(allow_append && i + 1 == parts.size() &&
                   field->cpp_type() != FieldDescriptor::CPPTYPE_MESSAGE)) {
        return absl::InvalidArgumentError(absl::StrCat("\"", path, "\": ", field->name(),
                                                       " is a list: name an element (",
                                                       field->name(), ".0)"));
      }
    }
    steps.push_back(step);
    type = field->cpp_type() == FieldDescriptor::CPPTYPE_MESSAGE ? field->message_type() : nullptr;
  }
  if (type != nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("\"", path, "\" is a message (", type->name(), "); name one of its values"));
  }
  return steps;
}

// `steps` as a path of proto field names: the same for every spelling of one field.
std::string CanonicalPath(const std::vector<PathStep>& steps) {
  std::string out;
  for (const PathStep& step : steps) {
    absl::StrAppend(&out, out.empty() ? "" : ".", step.field->name());
    if (step.index >= 0) absl::StrAppend(&out, ".", step.index);
  }
  return out;
}

bool IsInteger(FieldDescriptor::CppType t) {
  return t == FieldDescriptor::CPPTYPE_INT32 || t == FieldDescriptor::CPPTYPE_INT64 ||
         t == FieldDescriptor::CPPTYPE_UINT32 || t == FieldDescriptor::CPPTYPE_UINT64;
}

bool Converts(const FieldDescriptor* from, const FieldDescriptor* to) {
  const auto a = from->cpp_type(), b = to->cpp_type();
  if (a == b) return true;
  if (IsInteger(a) && IsInteger(b)) return true;
  if ((IsInteger(a) && b == FieldDescriptor::CPPTYPE_STRING) ||
      (a == FieldDescriptor::CPPTYPE_STRING && IsInteger(b))) {
    return true;
  }
  return (a == FieldDescriptor::CPPTYPE_FLOAT || a == FieldDescriptor::CPPTYPE_DOUBLE) &&
         (b == FieldDescriptor::CPPTYPE_FLOAT || b == FieldDescriptor::CPPTYPE_DOUBLE);
}

// The name of a job type's member of the JobSpec and JobResult oneofs: the type's name in lower
// case ("extract").
std::string CaseName(JobType type) {
  if (type == latentd::v1::JOB_TYPE_UNSPECIFIED) return "";
  return absl::AsciiStrToLower(latentd::v1::JobType_Name(type));
}

// A scalar read from a result, kept in the widest form of its kind.
struct ScalarValue {
  enum Kind { kSigned, kUnsigned, kFloating, kString, kBool, kEnum } kind;
  int64_t i = 0;
  uint64_t u = 0;
  double d = 0;
  std::string s;
  bool b = false;
  int e = 0;

  std::string ToString() const {
    switch (kind) {
      case kSigned:
        return absl::StrCat(i);
      case kUnsigned:
        return absl::StrCat(u);
      case kFloating:
        return absl::StrCat(d);
      case kString:
        return absl::StrCat("\"", s, "\"");
      case kBool:
        return b ? "true" : "false";
      case kEnum:
        return absl::StrCat(e);
    }
    return "";
  }
};

// "\"path\": the spec's more_outputs has 1 elements, no 1".
absl::Status NoSuchElement(const std::string& path, absl::string_view whose,
                           const FieldDescriptor* field, int size, int index) {
  return absl::InvalidArgumentError(absl::StrCat("\"", path, "\": ", whose, field->name(), " has ",
                                                 size, " elements, no ", index));
}

// A scalar through the getters of its type: element `index` of a list, or the field itself
// (index < 0).
template <typename T>
T Get(const Reflection* r, const Message& m, const FieldDescriptor* f, int index,
      T (Reflection::*get)(const Message&, const FieldDescriptor*) const,
      T (Reflection::*get_element)(const Message&, const FieldDescriptor*, int) const) {
  return index < 0 ? (r->*get)(m, f) : (r->*get_element)(m, f, index);
}

// Sets a scalar through the setters of its type: the field itself, element `index` of a list,
// or (a list, index < 0) a new last element.
template <typename T>
void Put(const Reflection* r, Message* m, const FieldDescriptor* f, int index, T value,
         void (Reflection::*set)(Message*, const FieldDescriptor*, T) const,
         void (Reflection::*set_element)(Message*, const FieldDescriptor*, int, T) const,
         void (Reflection::*add)(Message*, const FieldDescriptor*, T) const) {
  if (!f->is_repeated()) {
    (r->*set)(m, f, std::move(value));
  } else if (index < 0) {
    (r->*add)(m, f, std::move(value));
  } else {
    (r->*set_element)(m, f, index, std::move(value));
  }
}

absl::StatusOr<ScalarValue> ReadScalar(const Message& root, const std::vector<PathStep>& steps,
                                       const std::string& path) {
  const Message* message = &root;
  for (const PathStep& step : steps) {
    const Reflection* r = message->GetReflection();
    if (step.field->is_repeated() && step.index >= r->FieldSize(*message, step.field)) {
      return NoSuchElement(path, "", step.field, r->FieldSize(*message, step.field), step.index);
    }
    if (&step == &steps.back()) break;
    message = step.field->is_repeated() ? &r->GetRepeatedMessage(*message, step.field, step.index)
                                        : &r->GetMessage(*message, step.field);
  }
  const Reflection* r = message->GetReflection();
  const FieldDescriptor* f = steps.back().field;
  const int k = steps.back().index;
  ScalarValue v{ScalarValue::kSigned};
  switch (f->cpp_type()) {
    case FieldDescriptor::CPPTYPE_INT32:
      v.i = Get<int32_t>(r, *message, f, k, &Reflection::GetInt32, &Reflection::GetRepeatedInt32);
      break;
    case FieldDescriptor::CPPTYPE_INT64:
      v.i = Get<int64_t>(r, *message, f, k, &Reflection::GetInt64, &Reflection::GetRepeatedInt64);
      break;
    case FieldDescriptor::CPPTYPE_UINT32:
      v.kind = ScalarValue::kUnsigned;
      v.u =
          Get<uint32_t>(r, *message, f, k, &Reflection::GetUInt32, &Reflection::GetRepeatedUInt32);
      break;
    case FieldDescriptor::CPPTYPE_UINT64:
      v.kind = ScalarValue::kUnsigned;
      v.u =
          Get<uint64_t>(r, *message, f, k, &Reflection::GetUInt64, &Reflection::GetRepeatedUInt64);
      break;
    case FieldDescriptor::CPPTYPE_FLOAT:
      v.kind = ScalarValue::kFloating;
      v.d = Get<float>(r, *message, f, k, &Reflection::GetFloat, &Reflection::GetRepeatedFloat);
      break;
    case FieldDescriptor::CPPTYPE_DOUBLE:
      v.kind = ScalarValue::kFloating;
      v.d = Get<double>(r, *message, f, k, &Reflection::GetDouble, &Reflection::GetRepeatedDouble);
      break;
    case FieldDescriptor::CPPTYPE_STRING:
      v.kind = ScalarValue::kString;
      v.s = Get<std::string>(r, *message, f, k, &Reflection::GetString,
                             &Reflection::GetRepeatedString);
      break;
    case FieldDescriptor::CPPTYPE_BOOL:
      v.kind = ScalarValue::kBool;
      v.b = Get<bool>(r, *message, f, k, &Reflection::GetBool, &Reflection::GetRepeatedBool);
      break;
    case FieldDescriptor::CPPTYPE_ENUM:
      v.kind = ScalarValue::kEnum;
      v.e =
          Get<int>(r, *message, f, k, &Reflection::GetEnumValue, &Reflection::GetRepeatedEnumValue);
      break;
    default:
      return absl::InternalError("not a scalar");
  }
  return v;
}

// `v` as sign and magnitude, when it is an integer (a decimal string included).
bool AsSignAndMagnitude(const ScalarValue& v, bool* negative, uint64_t* magnitude) {
  int64_t i = 0;
  switch (v.kind) {
    case ScalarValue::kSigned:
      i = v.i;
      break;
    case ScalarValue::kUnsigned:
      *negative = false;
      *magnitude = v.u;
      return true;
    case ScalarValue::kString:
      if (absl::SimpleAtoi(v.s, magnitude)) {
        *negative = false;
        return true;
      }
      if (!absl::SimpleAtoi(v.s, &i)) return false;
      break;
    default:
      return false;
  }
  *negative = i < 0;
  *magnitude = i < 0 ? uint64_t(0) - static_cast<uint64_t>(i) : static_cast<uint64_t>(i);
  return true;
}

absl::Status WriteScalar(Message* root, const std::vector<PathStep>& steps, const ScalarValue& v,
                         const std::string& path) {
  Message* message = root;
  for (const PathStep& step : steps) {
    const Reflection* r = message->GetReflection();
    if (step.field->is_repeated() && step.index >= r->FieldSize(*message, step.field)) {
      return NoSuchElement(path, "the spec's ", step.field, r->FieldSize(*message, step.field),
                           step.index);
    }
    if (&step == &steps.back()) break;
    message = step.field->is_repeated() ? r->MutableRepeatedMessage(message, step.field, step.index)
                                        : r->MutableMessage(message, step.field);
  }
  const Reflection* r = message->GetReflection();
  const FieldDescriptor* f = steps.back().field;
  const int k = steps.back().index;
  auto refused = [&](const std::string& what) {
    return absl::InvalidArgumentError(
        absl::StrCat("\"", path, "\": ", v.ToString(), " is not ", what));
  };
  switch (f->cpp_type()) {
    case FieldDescriptor::CPPTYPE_INT32:
    case FieldDescriptor::CPPTYPE_INT64:
    case FieldDescriptor::CPPTYPE_UINT32:
    case FieldDescriptor::CPPTYPE_UINT64: {
      bool negative = false;
      uint64_t magnitude = 0;
      if (!AsSignAndMagnitude(v, &negative, &magnitude)) return refused("an integer");
      const auto t = f->cpp_type();
      const uint64_t max_positive =
          t == FieldDescriptor::CPPTYPE_INT32    ? uint64_t(std::numeric_limits<int32_t>::max())
          : t == FieldDescriptor::CPPTYPE_INT64  ? uint64_t(std::numeric_limits<int64_t>::max())
          : t == FieldDescriptor::CPPTYPE_UINT32 ? uint64_t(std::numeric_limits<uint32_t>::max())
                                                 : std::numeric_limits<uint64_t>::max();
      const uint64_t max_negative = t == FieldDescriptor::CPPTYPE_INT32   ? max_positive + 1
                                    : t == FieldDescriptor::CPPTYPE_INT64 ? max_positive + 1
                                                                          : 0;
      if (negative ? magnitude > max_negative : magnitude > max_positive) {
        return refused(absl::StrCat("a ", f->cpp_type_name()));
      }
      const int64_t as_signed = negative ? static_cast<int64_t>(uint64_t(0) - magnitude)
                                         : static_cast<int64_t>(magnitude);
      if (t == FieldDescriptor::CPPTYPE_INT32) {
        Put<int32_t>(r, message, f, k, int32_t(as_signed), &Reflection::SetInt32,
                     &Reflection::SetRepeatedInt32, &Reflection::AddInt32);
      } else if (t == FieldDescriptor::CPPTYPE_INT64) {
        Put<int64_t>(r, message, f, k, as_signed, &Reflection::SetInt64,
                     &Reflection::SetRepeatedInt64, &Reflection::AddInt64);
      } else if (t == FieldDescriptor::CPPTYPE_UINT32) {
        Put<uint32_t>(r, message, f, k, uint32_t(magnitude), &Reflection::SetUInt32,
                      &Reflection::SetRepeatedUInt32, &Reflection::AddUInt32);
      } else {
        Put<uint64_t>(r, message, f, k, magnitude, &Reflection::SetUInt64,
                      &Reflection::SetRepeatedUInt64, &Reflection::AddUInt64);
      }
      return absl::OkStatus();
    }
    case FieldDescriptor::CPPTYPE_STRING: {
      std::string s;
      if (v.kind == ScalarValue::kString) {
        s = v.s;
      } else if (v.kind == ScalarValue::kSigned) {
        s = absl::StrCat(v.i);
      } else if (v.kind == ScalarValue::kUnsigned) {
        s = absl::StrCat(v.u);
      } else {
        return refused("a string or an integer");
      }
      Put<std::string>(r, message, f, k, std::move(s), &Reflection::SetString,
                       &Reflection::SetRepeatedString, &Reflection::AddString);
      return absl::OkStatus();
    }
    case FieldDescriptor::CPPTYPE_FLOAT:
      if (v.kind != ScalarValue::kFloating) return refused("a number");
      Put<float>(r, message, f, k, float(v.d), &Reflection::SetFloat, &Reflection::SetRepeatedFloat,
                 &Reflection::AddFloat);
      return absl::OkStatus();
    case FieldDescriptor::CPPTYPE_DOUBLE:
      if (v.kind != ScalarValue::kFloating) return refused("a number");
      Put<double>(r, message, f, k, v.d, &Reflection::SetDouble, &Reflection::SetRepeatedDouble,
                  &Reflection::AddDouble);
      return absl::OkStatus();
    case FieldDescriptor::CPPTYPE_BOOL:
      if (v.kind != ScalarValue::kBool) return refused("a bool");
      Put<bool>(r, message, f, k, v.b, &Reflection::SetBool, &Reflection::SetRepeatedBool,
                &Reflection::AddBool);
      return absl::OkStatus();
    case FieldDescriptor::CPPTYPE_ENUM:
      if (v.kind != ScalarValue::kEnum) return refused("an enum value");
      Put<int>(r, message, f, k, v.e, &Reflection::SetEnumValue, &Reflection::SetRepeatedEnumValue,
               &Reflection::AddEnumValue);
      return absl::OkStatus();
    default:
      return absl::InternalError("not a scalar");
  }
}

// The schema checks of binding `i` whose source job has type `source_type`; errors name the
// binding's fields. Returns the resolved (output, field) paths.
absl::Status CheckBinding(const JobSpec& spec, int i, JobType source_type,
                          std::vector<PathStep>* output_steps, std::vector<PathStep>* field_steps) {
  const latentd::v1::SpecBinding& b = spec.bindings(i);
  const std::string where = absl::StrCat("spec.bindings[", i, "]");
  const std::string result_case = CaseName(source_type);
  auto output = ResolvePath(JobResult::descriptor(), b.output(), /*allow_append=*/false);
  if (!output.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(where, ".output: ", output.status().message()));
  }
  if ((*output)[0].field->name() != result_case) {
    return absl::InvalidArgumentError(absl::StrCat(
        where, ".output: job ", b.job_id(), " is a ", latentd::v1::JobType_Name(source_type),
        " job: its outputs start with \"", result_case, ".\""));
  }
  const std::string spec_case = CaseName(spec.type());
  auto field = ResolvePath(JobSpec::descriptor(), b.field(), /*allow_append=*/true);
  if (!field.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(where, ".field: ", field.status().message()));
  }
  if ((*field)[0].field->name() != spec_case) {
    return absl::InvalidArgumentError(absl::StrCat(where, ".field: a binding fills this job's own ",
                                                   spec_case, " spec: \"", spec_case,
                                                   ".<field>\""));
  }
  if (!Converts(output->back().field, field->back().field)) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": ", b.output(), " is a ", output->back().field->cpp_type_name(), ", ",
                     b.field(), " a ", field->back().field->cpp_type_name()));
  }
  *output_steps = std::move(*output);
  *field_steps = std::move(*field);
  return absl::OkStatus();
}

JobType ResultType(const JobResult& result) {
  if (result.result_case() == JobResult::RESULT_NOT_SET) return latentd::v1::JOB_TYPE_UNSPECIFIED;
  const google::protobuf::FieldDescriptor* member =
      JobResult::descriptor()->FindFieldByNumber(result.result_case());
  JobType type = latentd::v1::JOB_TYPE_UNSPECIFIED;
  if (member == nullptr ||
      !latentd::v1::JobType_Parse(absl::AsciiStrToUpper(member->name()), &type)) {
    return latentd::v1::JOB_TYPE_UNSPECIFIED;
  }
  return type;
}

}  // namespace

absl::Status CheckBindings(const JobSpec& spec,
                           const std::function<std::optional<JobType>(uint64_t)>& type_of) {
  if (spec.after_job_ids_size() > kMaxAfterJobs) {
    return absl::InvalidArgumentError(absl::StrCat("spec.after_job_ids: at most ", kMaxAfterJobs,
                                                   " jobs, got ", spec.after_job_ids_size()));
  }
  if (spec.bindings_size() > kMaxBindings) {
    return absl::InvalidArgumentError(
        absl::StrCat("spec.bindings: at most ", kMaxBindings, ", got ", spec.bindings_size()));
  }
  std::map<uint64_t, JobType> types;
  for (int i = 0; i < spec.after_job_ids_size(); ++i) {
    const uint64_t id = spec.after_job_ids(i);
    const std::optional<JobType> type = type_of(id);
    if (!type.has_value()) {
      return absl::NotFoundError(
          absl::StrCat("spec.after_job_ids[", i, "]: job ", id, " not found"));
    }
    types[id] = *type;
  }
  std::set<std::string> filled;
  for (int i = 0; i < spec.bindings_size(); ++i) {
    const latentd::v1::SpecBinding& b = spec.bindings(i);
    auto type = types.find(b.job_id());
    if (type == types.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat("spec.bindings[", i, "].job_id: job ", b.job_id(),
                       " is not one of after_job_ids (a job is bound only to jobs it waits for)"));
    }
    std::vector<PathStep> output, field;
    RETURN_IF_ERROR(CheckBinding(spec, i, type->second, &output, &field));
    const bool appends = field.back().field->is_repeated() && field.back().index < 0;
    if (!appends && !filled.insert(CanonicalPath(field)).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("spec.bindings[", i, "].field: ", b.field(), " is bound twice"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<JobSpec> ApplyBindings(const JobSpec& spec,
                                      const std::map<uint64_t, JobResult>& results,
                                      std::vector<std::string>* applied) {
  JobSpec bound = spec;
  for (int i = 0; i < spec.bindings_size(); ++i) {
    const latentd::v1::SpecBinding& b = spec.bindings(i);
    const std::string where = absl::StrCat("spec.bindings[", i, "]");
    auto result = results.find(b.job_id());
    if (result == results.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": no result of job ", b.job_id(), " to take ", b.output(), " from"));
    }
    std::vector<PathStep> output, field;
    RETURN_IF_ERROR(CheckBinding(spec, i, ResultType(result->second), &output, &field));
    auto value = ReadScalar(result->second, output, b.output());
    if (!value.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ".output: job ", b.job_id(), "'s ", value.status().message()));
    }
    if (absl::Status s = WriteScalar(&bound, field, *value, b.field()); !s.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(where, ".field: ", s.message()));
    }
    if (applied != nullptr) {
      // In proto names, however the paths were spelled.
      applied->push_back(absl::StrCat(CanonicalPath(field), " = ", value->ToString(), " (job ",
                                      b.job_id(), "'s ", CanonicalPath(output), ")"));
    }
  }
  return bound;
}

}  // namespace latentd::server
