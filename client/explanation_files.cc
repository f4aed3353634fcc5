#include "client/explanation_files.h"

#include <algorithm>
#include <filesystem>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <regex>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/read_file.h"
#include "common/status_macros.h"

namespace latentd::client {
namespace {

namespace fs = std::filesystem;

// One JSON Lines object as an explanation ("explanation" read as "text"; other fields ignored).
absl::StatusOr<v1::LatentExplanation> ParseLine(absl::string_view line) {
  const nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return absl::InvalidArgumentError("not a JSON object");
  v1::LatentExplanation e;
  const auto latent = j.find("latent");
  if (latent == j.end() || !latent->is_number_integer() || *latent < 0 ||
      *latent > std::numeric_limits<int32_t>::max()) {
    return absl::InvalidArgumentError("\"latent\" is not a latent index");
  }
  e.set_latent(latent->get<int32_t>());
  for (const char* key : {"text", "explanation"}) {
    const auto text = j.find(key);
    if (text == j.end()) continue;
    if (!text->is_string()) {
      return absl::InvalidArgumentError(absl::StrCat("\"", key, "\" is not a string"));
    }
    e.set_text(text->get<std::string>());
    break;
  }
  if (const auto score = j.find("score"); score != j.end() && !score->is_null()) {
    if (!score->is_number()) return absl::InvalidArgumentError("\"score\" is not a number");
    e.set_score(score->get<double>());
  }
  if (const auto source = j.find("source"); source != j.end() && !source->is_null()) {
    if (!source->is_string()) return absl::InvalidArgumentError("\"source\" is not a string");
    e.set_source(source->get<std::string>());
  }
  return e;
}

absl::StatusOr<std::vector<v1::LatentExplanation>> ReadJsonLines(const std::string& path) {
  ASSIGN_OR_RETURN(const std::string text, ReadFileToString(path));
  std::vector<v1::LatentExplanation> out;
  int line_number = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++line_number;
    if (absl::StripAsciiWhitespace(line).empty()) continue;
    absl::StatusOr<v1::LatentExplanation> e = ParseLine(line);
    if (!e.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ":", line_number, ": not an explanation: ", e.status().message()));
    }
    out.push_back(*std::move(e));
  }
  return out;
}

// delphi's files in `dir`: module -> latent -> path, for each name <module>_latent<J>.txt (or
// latent<J>.txt, module ""); other files are skipped.
using LatentFiles = std::map<std::string, std::map<int32_t, std::string>>;

absl::StatusOr<LatentFiles> ListLatentFiles(const std::string& dir) {
  static const std::regex kName(R"((?:(.*)_)?latent(\d+)\.txt)");
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) {
    return absl::NotFoundError(absl::StrCat(dir, ": no such directory"));
  }
  LatentFiles files;
  for (const fs::directory_entry& entry : fs::directory_iterator(dir, ec)) {
    std::smatch match;
    const std::string name = entry.path().filename().string();
    if (!entry.is_regular_file() || !std::regex_match(name, match, kName)) continue;
    int32_t latent = 0;
    if (!absl::SimpleAtoi(match[2].str(), &latent)) {
      return absl::InvalidArgumentError(
          absl::StrCat(entry.path().string(), ": latent ", match[2].str(), " is out of range"));
    }
    files[match[1].str()][latent] = entry.path().string();
  }
  if (ec) return absl::InvalidArgumentError(absl::StrCat(dir, ": ", ec.message()));
  return files;
}

absl::StatusOr<std::string> ReadDelphiExplanation(const std::string& path) {
  ASSIGN_OR_RETURN(const std::string content, ReadFileToString(path));
  const nlohmann::json text = nlohmann::json::parse(content, nullptr, false);
  if (!text.is_string()) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": not a JSON string (delphi's explanation file)"));
  }
  return text.get<std::string>();
}

// A prediction as delphi writes it: a boolean (0 or 1 in some versions); null, missing or -1
// where the scorer's reply could not be parsed.
std::optional<bool> PredictionOf(const nlohmann::json& record) {
  const auto p = record.find("prediction");
  if (p == record.end()) return std::nullopt;
  if (p->is_boolean()) return p->get<bool>();
  if (p->is_number_integer() && (*p == 0 || *p == 1)) return *p == 1;
  return std::nullopt;
}

}  // namespace

absl::StatusOr<std::vector<v1::LatentExplanation>> ReadExplanations(
    const std::string& path, const std::string& default_source) {
  std::error_code ec;
  if (!fs::exists(path, ec)) return absl::NotFoundError(absl::StrCat(path, ": no such file"));
  ASSIGN_OR_RETURN(std::vector<v1::LatentExplanation> out, ReadJsonLines(path));
  for (v1::LatentExplanation& e : out) {
    if (e.source().empty()) e.set_source(default_source);
  }
  return out;
}

absl::StatusOr<DelphiRun> LocateDelphiRun(const std::string& path, const std::string& scores) {
  std::error_code ec;
  if (!fs::is_directory(path, ec)) {
    return absl::NotFoundError(absl::StrCat(path, ": no such directory"));
  }
  DelphiRun run;
  const fs::path root(path);
  const bool whole_run = fs::is_directory(root / "explanations", ec);
  run.explanations_dir = whole_run ? (root / "explanations").string() : path;
  ASSIGN_OR_RETURN(run.explanation_files, ListLatentFiles(run.explanations_dir));
  std::vector<fs::path> candidates;
  if (!scores.empty()) {
    if (whole_run) candidates.push_back(root / "scores" / scores);
    candidates.push_back(scores);
  } else if (whole_run) {
    candidates = {root / "scores" / "detection", root / "scores" / "fuzz"};
  }
  for (const fs::path& candidate : candidates) {
    if (!fs::is_directory(candidate, ec)) continue;
    run.scores_dir = candidate.string();
    // The scorer is the directory's name ("scores/detection/" names detection too).
    fs::path named = candidate.lexically_normal();
    if (named.filename().empty()) named = named.parent_path();
    run.scorer = named.filename().string();
    return run;
  }
  if (!scores.empty()) {
    return absl::NotFoundError(absl::StrCat("scores: ", scores,
                                            " is neither a directory nor a scorer under ",
                                            (root / "scores").string()));
  }
  return run;
}

std::vector<std::string> DelphiModules(const DelphiRun& run) {
  std::vector<std::string> modules;
  for (const auto& [module, latents] : run.explanation_files) modules.push_back(module);
  return modules;
}

absl::StatusOr<std::string> ChooseDelphiModule(const std::vector<std::string>& modules,
                                               const std::string& requested,
                                               const std::string& hook) {
  const auto has = [&](const std::string& m) {
    return std::find(modules.begin(), modules.end(), m) != modules.end();
  };
  const std::string listed =
      absl::StrJoin(modules, ", ", [](std::string* out, const std::string& m) {
        absl::StrAppend(out, m.empty() ? "(unnamed)" : m);
      });
  if (!requested.empty()) {
    if (has(requested)) return requested;
    return absl::InvalidArgumentError(
        absl::StrCat("module: no latent files of ", requested,
                     " (the modules there: ", modules.empty() ? "none" : listed, ")"));
  }
  if (modules.size() == 1) return modules[0];
  if (has(hook)) return hook;
  if (modules.empty()) {
    return absl::InvalidArgumentError("no delphi latent files (<module>_latent<J>.txt) there");
  }
  return absl::InvalidArgumentError(
      absl::StrCat("the latent files are of ", modules.size(), " modules (", listed,
                   "), none of them the dataset's hook; name one with --module"));
}

absl::StatusOr<ClassifierScore> ParseClassifierScore(absl::string_view json) {
  const nlohmann::json records = nlohmann::json::parse(json, nullptr, /*allow_exceptions=*/false);
  if (!records.is_array()) {
    return absl::InvalidArgumentError("not a JSON array of a classifier scorer's records");
  }
  int64_t counts[2][2] = {{0, 0}, {0, 0}};  // [truth][prediction]
  ClassifierScore score;
  for (size_t i = 0; i < records.size(); ++i) {
    const nlohmann::json& record = records[i];
    const auto activating = record.is_object() ? record.find("activating") : record.end();
    if (!record.is_object() || activating == record.end() || !activating->is_boolean()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "record ", i, " has no boolean \"activating\" (not a detection or fuzz scorer's)"));
    }
    const std::optional<bool> prediction = PredictionOf(record);
    if (!prediction) {
      ++score.unanswered;
      continue;
    }
    ++counts[activating->get<bool>()][*prediction];
    ++score.answered;
  }
  if (score.answered == 0) return score;
  score.accuracy = static_cast<double>(counts[0][0] + counts[1][1]) / score.answered;
  double recalls = 0;
  int classes = 0;
  for (int truth : {0, 1}) {
    const int64_t n = counts[truth][0] + counts[truth][1];
    if (n == 0) continue;
    recalls += static_cast<double>(counts[truth][truth]) / n;
    ++classes;
  }
  score.balanced_accuracy = recalls / classes;
  return score;
}

absl::StatusOr<std::vector<v1::LatentExplanation>> ReadDelphiExplanations(
    const DelphiRun& run, const std::string& module) {
  LatentFiles scores;
  if (!run.scores_dir.empty()) {
    ASSIGN_OR_RETURN(scores, ListLatentFiles(run.scores_dir));
  }
  const std::map<int32_t, std::string>& scored = scores[module];
  const auto explained = run.explanation_files.find(module);
  if (explained == run.explanation_files.end()) return std::vector<v1::LatentExplanation>();
  std::vector<v1::LatentExplanation> out;
  for (const auto& [latent, path] : explained->second) {
    v1::LatentExplanation e;
    e.set_latent(latent);
    ASSIGN_OR_RETURN(*e.mutable_text(), ReadDelphiExplanation(path));
    e.set_source("delphi");
    if (const auto it = scored.find(latent); it != scored.end()) {
      ASSIGN_OR_RETURN(const std::string verdicts, ReadFileToString(it->second));
      absl::StatusOr<ClassifierScore> score = ParseClassifierScore(verdicts);
      if (!score.ok()) {
        return absl::InvalidArgumentError(absl::StrCat(it->second, ": ", score.status().message()));
      }
      if (score->answered > 0) {
        e.set_score(score->balanced_accuracy);
        e.set_source(absl::StrCat("delphi/", run.scorer));
      }
    }
    out.push_back(std::move(e));
  }
  return out;
}

std::vector<std::vector<v1::LatentExplanation>> ExplanationBatches(
    const std::vector<v1::LatentExplanation>& explanations, size_t max_bytes) {
  std::vector<std::vector<v1::LatentExplanation>> batches(1);
  size_t bytes = 0;
  for (const v1::LatentExplanation& e : explanations) {
    const size_t size = e.ByteSizeLong();
    if (!batches.back().empty() && bytes + size > max_bytes) {
      batches.emplace_back();
      bytes = 0;
    }
    batches.back().push_back(e);
    bytes += size;
  }
  return batches;
}

}  // namespace latentd::client
