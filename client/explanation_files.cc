#include "client/explanation_files.h"

#include <algorithm>
#include <filesystem>
#include <regex>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/read_file.h"
#include "common/status_macros.h"
#include "google/protobuf/util/json_util.h"

namespace latentd::client {
namespace {

namespace fs = std::filesystem;

// One JSON Lines object as an explanation ("explanation" read as "text").
absl::StatusOr<v1::LatentExplanation> ParseLine(absl::string_view line) {
  google::protobuf::util::JsonParseOptions options;
  options.ignore_unknown_fields = true;
  v1::LatentExplanation e;
  auto parsed = google::protobuf::util::JsonStringToMessage(std::string(line), &e, options);
  if (!parsed.ok()) return absl::InvalidArgumentError(std::string(parsed.message()));
  if (e.text().empty()) {
    // Records that call it "explanation": the same object with that key renamed.
    static constexpr absl::string_view kKey = "\"explanation\"";
    if (const size_t at = line.find(kKey); at != absl::string_view::npos) {
      std::string renamed(line);
      renamed.replace(at, kKey.size(), "\"text\"");
      v1::LatentExplanation alias;
      if (google::protobuf::util::JsonStringToMessage(renamed, &alias, options).ok()) {
        e.set_text(alias.text());
      }
    }
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
    // The file holds a JSON string: read it as the text field of an object.
    auto parsed =
        google::protobuf::util::JsonStringToMessage(absl::StrCat("{\"text\": ", content, "}"), &e);
    if (!parsed.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(
          entry.path().string(),
          ": not a JSON string (delphi's explanation file): ", std::string(parsed.message())));
    }
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

}  // namespace latentd::client
