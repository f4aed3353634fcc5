#include "client/explanation_files.h"

#include <algorithm>
#include <filesystem>
#include <limits>
#include <nlohmann/json.hpp>
#include <regex>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
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

absl::StatusOr<std::vector<v1::LatentExplanation>> ReadDelphiDirectory(const std::string& path) {
  static const std::regex kName(R"(.*latent(\d+)\.txt)");
  std::vector<v1::LatentExplanation> out;
  std::error_code ec;
  for (const fs::directory_entry& entry : fs::directory_iterator(path, ec)) {
    std::smatch match;
    const std::string name = entry.path().filename().string();
    if (!entry.is_regular_file() || !std::regex_match(name, match, kName)) continue;
    v1::LatentExplanation e;
    int32_t latent = 0;
    if (!absl::SimpleAtoi(match[1].str(), &latent)) {
      return absl::InvalidArgumentError(
          absl::StrCat(entry.path().string(), ": latent ", match[1].str(), " is out of range"));
    }
    ASSIGN_OR_RETURN(const std::string content, ReadFileToString(entry.path().string()));
    const nlohmann::json text = nlohmann::json::parse(content, nullptr, false);
    if (!text.is_string()) {
      return absl::InvalidArgumentError(
          absl::StrCat(entry.path().string(), ": not a JSON string (delphi's explanation file)"));
    }
    e.set_text(text.get<std::string>());
    e.set_latent(latent);
    out.push_back(std::move(e));
  }
  if (ec) return absl::InvalidArgumentError(absl::StrCat(path, ": ", ec.message()));
  std::sort(out.begin(), out.end(),
            [](const v1::LatentExplanation& a, const v1::LatentExplanation& b) {
              return a.latent() < b.latent();
            });
  return out;
}

}  // namespace

absl::StatusOr<std::vector<v1::LatentExplanation>> ReadExplanations(
    const std::string& path, const std::string& default_source) {
  std::error_code ec;
  if (!fs::exists(path, ec)) return absl::NotFoundError(absl::StrCat(path, ": no such file"));
  ASSIGN_OR_RETURN(std::vector<v1::LatentExplanation> out,
                   fs::is_directory(path, ec) ? ReadDelphiDirectory(path) : ReadJsonLines(path));
  for (v1::LatentExplanation& e : out) {
    if (e.source().empty()) e.set_source(default_source);
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
