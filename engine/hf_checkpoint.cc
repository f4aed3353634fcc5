#include "engine/hf_checkpoint.h"

#include <fstream>
#include <set>
#include <sstream>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/safetensors.h"
#include "common/status_macros.h"
#include "engine/safetensors_tensor.h"
#include "storage/crc32c.h"

namespace latentd::engine {
namespace {

using nlohmann::json;

absl::StatusOr<std::string> ReadText(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat(path, " not found"));
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// Where each expected tensor lies: its file and its header entry.
struct TensorPlace {
  int file = 0;
  StTensorInfo info;
  bool optional = false;  // its HfTensorSpec's
};

absl::StatusOr<std::map<std::string, TensorPlace>> LocateTensors(
    const std::vector<std::string>& files, const std::vector<HfTensorSpec>& expected,
    const std::vector<std::string>& prefixes) {
  std::map<std::string, TensorPlace> found;
  for (size_t i = 0; i < files.size(); ++i) {
    ASSIGN_OR_RETURN(StHeader header, ReadStHeader(files[i]));
    for (const StTensorInfo& info : header.tensors) {
      std::string name = info.name;
      for (const std::string& prefix : prefixes) {
        if (!prefix.empty() && absl::StartsWith(name, prefix)) {
          name.erase(0, prefix.size());
          break;
        }
      }
      auto [it, inserted] = found.insert({name, TensorPlace{static_cast<int>(i), info}});
      if (!inserted) {
        return absl::InvalidArgumentError(absl::StrCat("tensor ", name, " is in both ",
                                                       files[it->second.file], " and ", files[i]));
      }
    }
  }
  std::map<std::string, TensorPlace> wanted;
  for (const HfTensorSpec& spec : expected) {
    auto it = found.find(spec.name);
    if (it == found.end() && spec.optional) continue;
    if (it == found.end()) {
      return absl::InvalidArgumentError(absl::StrCat("the checkpoint has no tensor ", spec.name,
                                                     " (looked in ", absl::StrJoin(files, ", "),
                                                     ")"));
    }
    const StTensorInfo& info = it->second.info;
    const std::string& file = files[it->second.file];
    if (info.shape != spec.shape) {
      return absl::InvalidArgumentError(absl::StrCat(
          file, ": tensor ", info.name, " has shape [", absl::StrJoin(info.shape, ", "),
          "], config.json implies [", absl::StrJoin(spec.shape, ", "), "]"));
    }
    if (!IsStFloat(info.dtype)) {
      return absl::InvalidArgumentError(absl::StrCat(file, ": tensor ", info.name, " has dtype ",
                                                     StDtypeName(info.dtype),
                                                     " (F32, F16, BF16 or F64 only)"));
    }
    TensorPlace place = it->second;
    place.optional = spec.optional;
    wanted.insert({it->first, place});
  }
  return wanted;
}

}  // namespace

absl::StatusOr<HfConfig> HfConfig::Read(const std::string& dir) {
  HfConfig c;
  c.dir_ = dir;
  c.path_ = dir + "/config.json";
  ASSIGN_OR_RETURN(std::string text, ReadText(c.path_));
  c.json_ = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!c.json_.is_object()) return c.Bad("not a JSON object");
  if (!c.json_.contains("model_type") || !c.json_["model_type"].is_string()) {
    return c.Bad("no model_type (a Hugging Face config.json names its architecture)");
  }
  c.model_type_ = c.json_["model_type"].get<std::string>();
  return c;
}

absl::StatusOr<HfConfig> HfConfig::Nested(const char* key, const std::string& model_type) const {
  if (!Has(key) || !json_[key].is_object()) return Bad(absl::StrCat(key, " is not an object"));
  HfConfig c;
  c.dir_ = dir_;
  c.path_ = absl::StrCat(path_, " ", key);
  c.json_ = json_[key];
  c.model_type_ = c.json_.contains("model_type") && c.json_["model_type"].is_string()
                      ? c.json_["model_type"].get<std::string>()
                      : model_type;
  return c;
}

absl::Status HfConfig::Bad(const std::string& what) const {
  return absl::InvalidArgumentError(absl::StrCat(path_, ": ", what));
}

absl::StatusOr<int64_t> HfConfig::Integer(const char* key, int64_t fallback, int64_t lo,
                                          int64_t hi) const {
  if (!Has(key)) {
    if (fallback < 0) return Bad(absl::StrCat(key, " is missing"));
    return fallback;
  }
  if (!json_[key].is_number_integer()) return Bad(absl::StrCat(key, " is not an integer"));
  const int64_t v = json_[key].get<int64_t>();
  if (v < lo || v > hi) return Bad(absl::StrCat(key, " = ", v, " is outside [", lo, ", ", hi, "]"));
  return v;
}

absl::StatusOr<bool> HfConfig::Boolean(const char* key, bool fallback) const {
  if (!Has(key)) return fallback;
  if (!json_[key].is_boolean()) return Bad(absl::StrCat(key, " is not a boolean"));
  return json_[key].get<bool>();
}

absl::StatusOr<double> HfConfig::PositiveNumber(const char* key, double fallback) const {
  if (!Has(key)) return fallback;
  if (!json_[key].is_number() || !(json_[key].get<double>() > 0)) {
    return Bad(absl::StrCat(key, " must be a positive number"));
  }
  return json_[key].get<double>();
}

absl::StatusOr<std::string> HfConfig::String(const char* key, const std::string& fallback) const {
  if (!Has(key)) return fallback;
  if (!json_[key].is_string()) return Bad(absl::StrCat(key, " is not a string"));
  return json_[key].get<std::string>();
}

absl::StatusOr<std::vector<std::string>> HfWeightFiles(const std::string& dir) {
  const std::string single = dir + "/model.safetensors";
  if (std::ifstream(single).good()) return std::vector<std::string>{single};
  const std::string index_path = dir + "/model.safetensors.index.json";
  auto text = ReadText(index_path);
  if (!text.ok()) {
    return absl::NotFoundError(absl::StrCat(
        dir,
        " has neither model.safetensors nor model.safetensors.index.json (PyTorch .bin "
        "checkpoints are not read: save with safe_serialization=True)"));
  }
  json j = json::parse(*text, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object() || !j.contains("weight_map") || !j["weight_map"].is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(index_path, ": no weight_map object"));
  }
  std::set<std::string> shards;
  for (const auto& [name, file] : j["weight_map"].items()) {
    if (!file.is_string()) {
      return absl::InvalidArgumentError(
          absl::StrCat(index_path, ": weight_map[\"", name, "\"] is not a file name"));
    }
    const std::string shard = file.get<std::string>();
    if (shard.empty() || absl::StrContains(shard, "/")) {
      return absl::InvalidArgumentError(absl::StrCat(index_path, ": weight_map[\"", name,
                                                     "\"] = \"", shard,
                                                     "\" is not a file in the directory"));
    }
    shards.insert(shard);
  }
  std::vector<std::string> files;
  for (const std::string& shard : shards) files.push_back(dir + "/" + shard);
  return files;
}

absl::Status CheckHfTensors(const std::string& dir, const std::vector<HfTensorSpec>& expected,
                            const std::vector<std::string>& prefixes) {
  ASSIGN_OR_RETURN(std::vector<std::string> files, HfWeightFiles(dir));
  return LocateTensors(files, expected, prefixes).status();
}

std::string HfTensors::Hash(const std::string& extra) const {
  return absl::StrFormat("crc32c:%08x:%d", storage::Crc32cExtend(crc, extra.data(), extra.size()),
                         bytes);
}

absl::StatusOr<HfTensors> ReadHfTensors(const std::string& dir,
                                        const std::vector<HfTensorSpec>& expected,
                                        const std::vector<std::string>& prefixes,
                                        at::ScalarType dtype) {
  ASSIGN_OR_RETURN(std::vector<std::string> files, HfWeightFiles(dir));
  ASSIGN_OR_RETURN(auto places, LocateTensors(files, expected, prefixes));
  // Each file opened once, when its first tensor is read.
  std::vector<int64_t> data_start(files.size(), -1);
  std::vector<std::ifstream> streams(files.size());
  HfTensors out;
  for (const auto& [name, place] : places) {
    const std::string& path = files[place.file];
    std::ifstream& in = streams[place.file];
    if (data_start[place.file] < 0) {
      ASSIGN_OR_RETURN(StHeader header, ReadStHeader(path));
      data_start[place.file] = header.data_start;
      in.open(path, std::ios::binary);
    }
    ASSIGN_OR_RETURN(at::ScalarType type, StFloatType(place.info, path.c_str()));
    at::Tensor raw = at::empty(place.info.shape, at::TensorOptions().dtype(type));
    const int64_t size = place.info.end - place.info.begin;
    in.seekg(data_start[place.file] + place.info.begin);
    if (!in.read(static_cast<char*>(raw.data_ptr()), size)) {
      return absl::DataLossError(absl::StrCat(path, ": tensor ", place.info.name,
                                              " could not be read (the file changed or is short)"));
    }
    if (!place.optional) {
      out.crc = storage::Crc32cExtend(out.crc, raw.data_ptr(), size);
      out.bytes += size;
    }
    at::Tensor t = raw.to(dtype);
    if (!at::isfinite(t).all().item<bool>()) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": tensor ", place.info.name, " has NaN or Inf entries"));
    }
    out.tensors[name] = std::move(t);
  }
  return out;
}

}  // namespace latentd::engine
