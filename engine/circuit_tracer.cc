#include "engine/circuit_tracer.h"

#include <fstream>
#include <optional>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "common/status_macros.h"

namespace latentd::engine {
namespace {

bool Exists(const std::string& path) { return std::ifstream(path).good(); }

// A YAML scalar as written: quotes stripped, a trailing " # comment" dropped.
std::string Scalar(absl::string_view v) {
  v = absl::StripAsciiWhitespace(v);
  if (!v.empty() && (v.front() == '"' || v.front() == '\'')) {
    const size_t close = v.find(v.front(), 1);
    if (close != absl::string_view::npos) return std::string(v.substr(1, close - 1));
  }
  if (const size_t hash = v.find(" #"); hash != absl::string_view::npos) v = v.substr(0, hash);
  return std::string(absl::StripAsciiWhitespace(v));
}

}  // namespace

absl::StatusOr<std::map<std::string, std::string>> ParseTopLevelYaml(const std::string& text) {
  std::map<std::string, std::string> out;
  std::istringstream in(text);
  std::string line;
  for (int number = 1; std::getline(in, line); ++number) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    const absl::string_view stripped = absl::StripAsciiWhitespace(line);
    // Nested and list lines (indented, or "- item"), comments, blanks, document markers.
    if (stripped.empty() || stripped[0] == '#' || line[0] == ' ' || line[0] == '\t' ||
        line[0] == '-' || stripped == "---" || stripped == "...") {
      continue;
    }
    const size_t colon = line.find(':');
    if (colon == std::string::npos || colon == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("line ", number, " is not \"key: value\": ", line));
    }
    out[Scalar(absl::string_view(line).substr(0, colon))] =
        Scalar(absl::string_view(line).substr(colon + 1));
  }
  return out;
}

namespace {

// dir/config.yaml's top-level keys; nullopt when there is no such file. INVALID_ARGUMENT naming
// the file when it is malformed.
absl::StatusOr<std::optional<std::map<std::string, std::string>>> ReadConfigYaml(
    const std::string& dir) {
  const std::string path = dir + "/" + kCircuitTracerConfig;
  std::ifstream config(path);
  if (!config) return std::nullopt;
  std::stringstream text;
  text << config.rdbuf();
  auto keys = ParseTopLevelYaml(text.str());
  if (!keys.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": ", keys.status().message()));
  }
  return std::optional<std::map<std::string, std::string>>(*std::move(keys));
}

}  // namespace

bool IsCircuitTracerLayout(const std::string& dir) {
  const auto keys = ReadConfigYaml(dir);
  // A malformed one is circuit-tracer's too: ReadCircuitTracerRelease says what is wrong.
  if (!keys.ok() || (*keys && (*keys)->count("model_kind") > 0)) return true;
  return !Exists(dir + "/cfg.json") &&
         (Exists(dir + "/layer_0.safetensors") || Exists(dir + "/W_enc_0.safetensors"));
}

absl::StatusOr<CircuitTracerRelease> ReadCircuitTracerRelease(const std::string& dir) {
  CircuitTracerRelease release;
  ASSIGN_OR_RETURN(const auto keys, ReadConfigYaml(dir));
  if (keys) {
    auto get = [&](const char* key) {
      const auto it = keys->find(key);
      return it == keys->end() ? std::string() : it->second;
    };
    const std::string kind = get("model_kind");
    if (kind == "cross_layer_transcoder") {
      release.cross_layer = true;
    } else if (kind != "transcoder_set" && !kind.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat(dir, "/", kCircuitTracerConfig, ": model_kind \"", kind,
                       "\" (transcoder_set or cross_layer_transcoder expected)"));
    }
    release.feature_input_hook = get("feature_input_hook");
    release.feature_output_hook = get("feature_output_hook");
    release.activation = get("activation");
    // "transcoders:" with its list on the following lines reads as an empty value.
    release.transcoders_elsewhere = keys->count("transcoders") > 0;
    if (kind.empty()) release.cross_layer = Exists(dir + "/W_enc_0.safetensors");
  } else {
    release.cross_layer = Exists(dir + "/W_enc_0.safetensors");
  }
  while (Exists(CircuitTracerEncoderFile(dir, release.cross_layer, release.n_layers))) {
    ++release.n_layers;
  }
  if (release.n_layers > 0) release.transcoders_elsewhere = false;
  return release;
}

std::string CircuitTracerEncoderFile(const std::string& dir, bool cross_layer, int layer) {
  return absl::StrCat(dir, "/", cross_layer ? "W_enc_" : "layer_", layer, ".safetensors");
}

std::string CircuitTracerDecoderFile(const std::string& dir, int layer) {
  return absl::StrCat(dir, "/W_dec_", layer, ".safetensors");
}

}  // namespace latentd::engine
