#include "client/vocabulary.h"

#include <cstdio>
#include <cstring>
#include <nlohmann/json.hpp>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "client/byte_level.h"
#include "common/read_file.h"
#include "common/status_macros.h"

namespace latentd::client {
namespace {

constexpr int64_t kMaxId = int64_t{1} << 24;

// SentencePiece's conventions: "▁" is a space, "<0xNN>" one byte.
std::string DecodeSentencePiece(absl::string_view token) {
  unsigned byte;
  if (token.size() == 6 && absl::StartsWith(token, "<0x") && token[5] == '>' &&
      std::sscanf(std::string(token.substr(3, 2)).c_str(), "%2x", &byte) == 1) {
    return std::string(1, static_cast<char>(byte));
  }
  return absl::StrReplaceAll(token, {{"\u2581", " "}});
}

enum class Scheme { kLiteral, kByteLevel, kSentencePiece };

absl::Status SetToken(int64_t id, std::string bytes, std::vector<std::optional<std::string>>* out) {
  if (id < 0 || id >= kMaxId) {
    return absl::InvalidArgumentError(absl::StrCat("token id ", id, " outside [0, 2^24)"));
  }
  if (static_cast<size_t>(id) >= out->size()) out->resize(id + 1);
  (*out)[id] = std::move(bytes);
  return absl::OkStatus();
}

std::string Decode(const std::string& token, Scheme scheme) {
  switch (scheme) {
    case Scheme::kByteLevel: {
      // A token outside the alphabet (rare: a hand-added one) is shown as written.
      std::optional<std::string> bytes = ByteLevelDecode(token);
      return bytes ? *bytes : token;
    }
    case Scheme::kSentencePiece:
      return DecodeSentencePiece(token);
    case Scheme::kLiteral:
      break;
  }
  return token;
}

// {token: id}, decoded by `scheme`.
absl::Status ParseTokenMap(const nlohmann::json& map, Scheme scheme, absl::string_view where,
                           std::vector<std::optional<std::string>>* out) {
  for (auto it = map.begin(); it != map.end(); ++it) {
    if (!it.value().is_number_integer()) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": the id of token \"", Printable(it.key()), "\" is not an integer"));
    }
    absl::Status s = SetToken(it.value().get<int64_t>(), Decode(it.key(), scheme), out);
    if (!s.ok()) return absl::InvalidArgumentError(absl::StrCat(where, ": ", s.message()));
  }
  return absl::OkStatus();
}

absl::Status ParseTokenizerJson(const nlohmann::json& doc,
                                std::vector<std::optional<std::string>>* out) {
  const nlohmann::json& model = *doc.find("model");
  if (!model.is_object() || !model.contains("vocab")) {
    return absl::InvalidArgumentError("tokenizer.json: model.vocab missing");
  }
  const nlohmann::json& vocab = *model.find("vocab");
  // The decoder names the scheme (ByteLevel for GPT-2-like models; Metaspace or a Replace of "▁"
  // for SentencePiece ones); without one, the tokens tell.
  const std::string decoder = doc.contains("decoder") ? doc.find("decoder")->dump() : "";
  Scheme scheme = Scheme::kLiteral;
  if (absl::StrContains(decoder, "ByteLevel")) {
    scheme = Scheme::kByteLevel;
  } else if (absl::StrContains(decoder, "Metaspace") || absl::StrContains(decoder, "\u2581") ||
             absl::StrContains(vocab.dump(), "\u2581")) {
    scheme = Scheme::kSentencePiece;
  }
  if (vocab.is_object()) {
    RETURN_IF_ERROR(ParseTokenMap(vocab, scheme, "tokenizer.json model.vocab", out));
  } else if (vocab.is_array()) {  // Unigram: [[token, score], ...], the index is the id
    for (size_t id = 0; id < vocab.size(); ++id) {
      const nlohmann::json& entry = vocab[id];
      if (!entry.is_array() || entry.empty() || !entry[0].is_string()) {
        return absl::InvalidArgumentError(
            absl::StrCat("tokenizer.json model.vocab[", id, "] is not [token, score]"));
      }
      RETURN_IF_ERROR(
          SetToken(static_cast<int64_t>(id), Decode(entry[0].get<std::string>(), scheme), out));
    }
  } else {
    return absl::InvalidArgumentError("tokenizer.json: model.vocab is neither a map nor a list");
  }
  if (doc.contains("added_tokens")) {
    for (const nlohmann::json& added : *doc.find("added_tokens")) {
      const auto id = added.is_object() ? added.find("id") : added.end();
      const auto content = added.is_object() ? added.find("content") : added.end();
      if (id == added.end() || !id->is_number_integer() || content == added.end() ||
          !content->is_string()) {
        return absl::InvalidArgumentError(
            "tokenizer.json: an added_tokens entry lacks an integer id or a content string");
      }
      absl::Status s = SetToken(id->get<int64_t>(), content->get<std::string>(), out);
      if (!s.ok())
        return absl::InvalidArgumentError(
            absl::StrCat("tokenizer.json added_tokens: ", s.message()));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<Vocabulary> Vocabulary::Load(const std::string& path) {
  absl::StatusOr<std::string> contents = ReadFileToString(path);
  if (!contents.ok()) {
    return absl::Status(contents.status().code(),
                        absl::StrCat("vocabulary ", contents.status().message()));
  }
  absl::StatusOr<Vocabulary> vocab = Parse(*contents);
  if (!vocab.ok()) {
    return absl::Status(vocab.status().code(),
                        absl::StrCat("vocabulary ", path, ": ", vocab.status().message()));
  }
  return vocab;
}

absl::StatusOr<Vocabulary> Vocabulary::Parse(absl::string_view contents) {
  Vocabulary vocab;
  const absl::string_view head = absl::StripLeadingAsciiWhitespace(contents);
  if (absl::StartsWith(head, "{") || absl::StartsWith(head, "[")) {
    const nlohmann::json doc = nlohmann::json::parse(head.begin(), head.end(), nullptr,
                                                     /*allow_exceptions=*/false);
    if (doc.is_discarded()) return absl::InvalidArgumentError("not valid JSON");
    absl::Status s;
    if (doc.is_object() && doc.contains("model")) {
      s = ParseTokenizerJson(doc, &vocab.bytes_);
    } else if (doc.is_object()) {
      const Scheme scheme =
          absl::StrContains(doc.dump(), "\u0120") ? Scheme::kByteLevel : Scheme::kLiteral;
      s = ParseTokenMap(doc, scheme, "vocab.json", &vocab.bytes_);
    } else {
      for (size_t id = 0; id < doc.size() && s.ok(); ++id) {
        if (!doc[id].is_string()) {
          return absl::InvalidArgumentError(
              absl::StrCat("token list entry ", id, " is not a string"));
        }
        s = SetToken(static_cast<int64_t>(id), doc[id].get<std::string>(), &vocab.bytes_);
      }
    }
    if (!s.ok()) return s;
  } else {
    std::vector<absl::string_view> lines = absl::StrSplit(contents, '\n');
    if (!lines.empty() && lines.back().empty()) lines.pop_back();  // the final newline
    if (static_cast<int64_t>(lines.size()) > kMaxId) {
      return absl::InvalidArgumentError(
          absl::StrCat(lines.size(), " lines: more than 2^24 tokens"));
    }
    for (absl::string_view line : lines) {
      if (absl::EndsWith(line, "\r")) line.remove_suffix(1);
      vocab.bytes_.emplace_back(std::string(line));
    }
  }
  if (vocab.bytes_.empty()) return absl::InvalidArgumentError("no tokens");
  return vocab;
}

std::optional<std::string> Vocabulary::Bytes(int32_t id) const {
  if (id < 0 || id >= size()) return std::nullopt;
  return bytes_[id];
}

std::vector<int32_t> Vocabulary::Find(absl::string_view bytes) const {
  std::vector<int32_t> ids;
  for (int32_t id = 0; id < size(); ++id) {
    if (bytes_[id] && *bytes_[id] == bytes) ids.push_back(id);
  }
  return ids;
}

std::string Vocabulary::Display(int32_t id) const {
  std::optional<std::string> bytes = Bytes(id);
  return bytes ? Printable(*bytes) : absl::StrCat("<id ", id, ">");
}

std::string Printable(absl::string_view bytes) {
  std::string out;
  for (size_t i = 0; i < bytes.size();) {
    const char c = bytes[i];
    if (c == '\n') {
      out += "\u21B5";
    } else if (c == '\t') {
      out += "\u21E5";
    } else if (c == '\r') {
      out += "\u240D";
    } else {
      const auto [cp, n] = DecodeUtf8(bytes, i);
      if (n == 0 || cp < 0x20 || cp == 0x7F) {
        out += absl::StrFormat("\\x%02X", static_cast<uint8_t>(c));
      } else {
        out.append(bytes.data() + i, n);
        i += n;
        continue;
      }
    }
    ++i;
  }
  return out;
}

std::string TokenCell(int32_t id, const std::optional<Vocabulary>& vocab) {
  return vocab ? absl::StrCat("\"", vocab->Display(id), "\"") : absl::StrCat(id);
}

}  // namespace latentd::client
