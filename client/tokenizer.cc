#include "client/tokenizer.h"

#include <unicode/locid.h>
#include <unicode/normalizer2.h>
#include <unicode/regex.h>
#include <unicode/uchar.h>
#include <unicode/unistr.h>

#include <algorithm>
#include <array>
#include <nlohmann/json.hpp>
#include <queue>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/hash/hash.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_replace.h"
#include "absl/synchronization/mutex.h"
#include "client/byte_level.h"
#include "common/read_file.h"
#include "common/status_macros.h"

namespace latentd::client {
namespace {

using Json = nlohmann::json;
using Span = std::pair<size_t, size_t>;  // [begin, end) byte offsets

absl::Status Invalid(absl::string_view field, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("tokenizer.json ", field, ": ", what));
}

// ---- small JSON accessors that name the field they fail on -------------------------------------

const Json* Member(const Json& object, const char* key) {
  if (!object.is_object()) return nullptr;
  auto it = object.find(key);
  return it == object.end() || it->is_null() ? nullptr : &*it;
}

absl::StatusOr<std::string> StringField(const Json& object, const char* key,
                                        absl::string_view where,
                                        std::optional<std::string> fallback = std::nullopt) {
  const Json* value = Member(object, key);
  if (value == nullptr) {
    if (fallback) return *fallback;
    return Invalid(absl::StrCat(where, ".", key), "missing");
  }
  if (!value->is_string()) return Invalid(absl::StrCat(where, ".", key), "not a string");
  return value->get<std::string>();
}

absl::StatusOr<bool> BoolField(const Json& object, const char* key, absl::string_view where,
                               bool fallback) {
  const Json* value = Member(object, key);
  if (value == nullptr) return fallback;
  if (!value->is_boolean()) return Invalid(absl::StrCat(where, ".", key), "not true or false");
  return value->get<bool>();
}

// Parses each entry of spec's list `key` (a Sequence's components) with `parse(entry, where)`.
template <typename Parse>
absl::Status ForEachListed(const Json& spec, const char* key, const std::string& where,
                           Parse parse) {
  const Json* list = Member(spec, key);
  if (list == nullptr || !list->is_array()) {
    return Invalid(absl::StrCat(where, ".", key), "not a list");
  }
  for (size_t i = 0; i < list->size(); ++i) {
    RETURN_IF_ERROR(parse((*list)[i], absl::StrCat(where, ".", key, "[", i, "]")));
  }
  return absl::OkStatus();
}

bool IsWhitespace(uint32_t cp) { return u_isUWhiteSpace(static_cast<UChar32>(cp)); }

// ---- regular expressions -----------------------------------------------------------------------

// A tokenizer.json pattern (Oniguruma syntax) compiled by ICU. The patterns tokenizers ship
// (\p{L}, \p{N}, (?i:...), (?!\S), {1,3}) mean the same in both; ICU's \s, like Oniguruma's, is
// the Unicode White_Space property (U+000B and U+0085 included).
class Regex {
 public:
  static absl::StatusOr<std::shared_ptr<const Regex>> Compile(absl::string_view pattern,
                                                              absl::string_view where) {
    UErrorCode status = U_ZERO_ERROR;
    UParseError parse_error;
    std::unique_ptr<icu::RegexPattern> compiled(
        icu::RegexPattern::compile(icu::UnicodeString::fromUTF8(icu::StringPiece(
                                       pattern.data(), static_cast<int32_t>(pattern.size()))),
                                   0, parse_error, status));
    if (U_FAILURE(status)) {
      return Invalid(where,
                     absl::StrCat("regex \"", pattern, "\" does not compile (", u_errorName(status),
                                  " at offset ", parse_error.offset, ")"));
    }
    auto regex = std::shared_ptr<Regex>(new Regex);
    regex->pattern_ = std::move(compiled);
    return std::shared_ptr<const Regex>(std::move(regex));
  }

  // The non-overlapping, non-empty matches in `s` (valid UTF-8), left to right, as byte spans.
  std::vector<Span> FindAll(absl::string_view s) const {
    const icu::UnicodeString text =
        icu::UnicodeString::fromUTF8(icu::StringPiece(s.data(), static_cast<int32_t>(s.size())));
    // UTF-16 index -> byte offset (matches start and end on code point boundaries).
    std::vector<size_t> byte_at(static_cast<size_t>(text.length()) + 1, s.size());
    for (size_t i = 0, j = 0; i < s.size();) {
      const auto [cp, n] = DecodeUtf8(s, i);
      byte_at[j] = i;
      j += cp >= 0x10000 ? 2 : 1;
      i += n;
    }
    std::vector<Span> matches;
    UErrorCode status = U_ZERO_ERROR;
    std::unique_ptr<icu::RegexMatcher> matcher(pattern_->matcher(text, status));
    if (U_FAILURE(status)) return matches;
    while (matcher->find(status) && U_SUCCESS(status)) {
      const int32_t begin = matcher->start(status), end = matcher->end(status);
      if (end > begin) matches.emplace_back(byte_at[begin], byte_at[end]);
    }
    return matches;
  }

 private:
  Regex() = default;
  std::unique_ptr<icu::RegexPattern> pattern_;
};

// A Split or Replace pattern: {"String": literal} or {"Regex": pattern}.
struct Pattern {
  std::string literal;
  std::shared_ptr<const Regex> regex;

  std::vector<Span> FindAll(absl::string_view s) const {
    if (regex) return regex->FindAll(s);
    std::vector<Span> matches;
    if (literal.empty()) return matches;
    for (size_t at = s.find(literal); at != absl::string_view::npos;
         at = s.find(literal, at + literal.size())) {
      matches.emplace_back(at, at + literal.size());
    }
    return matches;
  }
};

absl::StatusOr<Pattern> ParsePattern(const Json& spec, const std::string& where) {
  Pattern pattern;
  if (const Json* literal = Member(spec, "String"); literal != nullptr && literal->is_string()) {
    pattern.literal = literal->get<std::string>();
    return pattern;
  }
  if (const Json* regex = Member(spec, "Regex"); regex != nullptr && regex->is_string()) {
    ASSIGN_OR_RETURN(pattern.regex, Regex::Compile(regex->get<std::string>(), where));
    return pattern;
  }
  return Invalid(where, "neither {\"String\": ...} nor {\"Regex\": ...}");
}

// ---- splitting ---------------------------------------------------------------------------------

enum class Behavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };

absl::StatusOr<Behavior> ParseBehavior(const Json& spec, const std::string& where) {
  ASSIGN_OR_RETURN(const std::string name, StringField(spec, "behavior", where));
  if (name == "Removed") return Behavior::kRemoved;
  if (name == "Isolated") return Behavior::kIsolated;
  if (name == "MergedWithPrevious") return Behavior::kMergedWithPrevious;
  if (name == "MergedWithNext") return Behavior::kMergedWithNext;
  if (name == "Contiguous") return Behavior::kContiguous;
  return Invalid(where + ".behavior", absl::StrCat("unknown behavior \"", name, "\""));
}

// The spans `s` falls into when `matches` are its delimiters, as Hugging Face's
// NormalizedString::split arranges them; empty spans are dropped.
std::vector<Span> SplitSpans(size_t size, const std::vector<Span>& matches, bool invert,
                             Behavior behavior) {
  // Cover [0, size) with alternating gaps and matches, each flagged as a delimiter or not.
  std::vector<std::pair<Span, bool>> parts;
  size_t previous = 0;
  for (const Span& m : matches) {
    if (m.first > previous) parts.push_back({{previous, m.first}, invert});
    parts.push_back({m, !invert});
    previous = m.second;
  }
  if (previous < size) parts.push_back({{previous, size}, invert});

  std::vector<std::pair<Span, bool>> merged;
  bool previous_delimiter = false;
  switch (behavior) {
    case Behavior::kRemoved:
    case Behavior::kIsolated:
      for (const auto& part : parts) {
        if (!(behavior == Behavior::kRemoved && part.second)) merged.push_back(part);
      }
      break;
    case Behavior::kMergedWithPrevious:
      for (const auto& part : parts) {
        if (part.second && !previous_delimiter && !merged.empty()) {
          merged.back().first.second = part.first.second;
        } else {
          merged.push_back(part);
        }
        previous_delimiter = part.second;
      }
      break;
    case Behavior::kMergedWithNext:
      for (auto it = parts.rbegin(); it != parts.rend(); ++it) {
        if (it->second && !previous_delimiter && !merged.empty()) {
          merged.back().first.first = it->first.first;
        } else {
          merged.push_back(*it);
        }
        previous_delimiter = it->second;
      }
      std::reverse(merged.begin(), merged.end());
      break;
    case Behavior::kContiguous:
      for (const auto& part : parts) {
        if (!merged.empty() && part.second == previous_delimiter) {
          merged.back().first.second = part.first.second;
        } else {
          merged.push_back(part);
        }
        previous_delimiter = part.second;
      }
      break;
  }
  std::vector<Span> spans;
  for (const auto& part : merged) {
    if (part.first.second > part.first.first) spans.push_back(part.first);
  }
  return spans;
}

// Each code point for which `is_delimiter` holds, as its own match.
template <typename Predicate>
std::vector<Span> CodePointMatches(absl::string_view s, Predicate is_delimiter) {
  std::vector<Span> matches;
  for (size_t i = 0; i < s.size();) {
    const auto [cp, n] = DecodeUtf8(s, i);
    if (is_delimiter(cp)) matches.emplace_back(i, i + n);
    i += n;
  }
  return matches;
}

// A stretch of text on its way through the pipeline. `at_text_start`: it begins at byte 0 of
// the text passed to Encode (Metaspace's prepend_scheme "first" asks).
struct Piece {
  std::string text;
  bool at_text_start = false;
};

void AppendSplit(const Piece& piece, const std::vector<Span>& spans, std::vector<Piece>* out) {
  for (const Span& span : spans) {
    out->push_back({piece.text.substr(span.first, span.second - span.first),
                    piece.at_text_start && span.first == 0});
  }
}

// ---- normalizers -------------------------------------------------------------------------------

std::string Utf8(const icu::UnicodeString& u) {
  std::string out;
  u.toUTF8String(out);
  return out;
}

icu::UnicodeString Utf16(absl::string_view s) {
  return icu::UnicodeString::fromUTF8(icu::StringPiece(s.data(), static_cast<int32_t>(s.size())));
}

struct Normalizer {
  enum class Kind { kUnicode, kLowercase, kPrepend, kReplace, kStrip } kind;
  const icu::Normalizer2* unicode = nullptr;  // kUnicode: NFC, NFD, NFKC or NFKD
  std::string text;                           // kPrepend: what; kReplace: the replacement
  Pattern pattern;                            // kReplace
  bool strip_left = false, strip_right = false;

  void Apply(std::string* s) const {
    switch (kind) {
      case Kind::kUnicode: {
        UErrorCode status = U_ZERO_ERROR;
        const icu::UnicodeString normalized = unicode->normalize(Utf16(*s), status);
        if (U_SUCCESS(status)) *s = Utf8(normalized);
        break;
      }
      case Kind::kLowercase: {
        icu::UnicodeString u = Utf16(*s);
        *s = Utf8(u.toLower(icu::Locale::getRoot()));
        break;
      }
      case Kind::kPrepend:
        if (!s->empty()) *s = text + *s;
        break;
      case Kind::kReplace: {
        std::string out;
        size_t previous = 0;
        for (const Span& m : pattern.FindAll(*s)) {
          out.append(*s, previous, m.first - previous);
          out += text;
          previous = m.second;
        }
        out.append(*s, previous, std::string::npos);
        *s = std::move(out);
        break;
      }
      case Kind::kStrip: {
        size_t begin = 0, end = s->size();
        while (strip_left && begin < end) {
          const auto [cp, n] = DecodeUtf8(*s, begin);
          if (!IsWhitespace(cp)) break;
          begin += n;
        }
        while (strip_right && end > begin) {
          const size_t start = PreviousCodePointStart(*s, end);
          if (!IsWhitespace(DecodeUtf8(*s, start).first)) break;
          end = start;
        }
        *s = s->substr(begin, end - begin);
        break;
      }
    }
  }
};

absl::Status ParseNormalizer(const Json& spec, const std::string& where,
                             std::vector<Normalizer>* out) {
  ASSIGN_OR_RETURN(const std::string type, StringField(spec, "type", where));
  Normalizer n{};
  UErrorCode status = U_ZERO_ERROR;
  if (type == "Sequence") {
    return ForEachListed(spec, "normalizers", where, [&](const Json& item, const std::string& at) {
      return ParseNormalizer(item, at, out);
    });
  } else if (type == "NFC" || type == "NFD" || type == "NFKC" || type == "NFKD") {
    n.kind = Normalizer::Kind::kUnicode;
    n.unicode = type == "NFC"    ? icu::Normalizer2::getNFCInstance(status)
                : type == "NFD"  ? icu::Normalizer2::getNFDInstance(status)
                : type == "NFKC" ? icu::Normalizer2::getNFKCInstance(status)
                                 : icu::Normalizer2::getNFKDInstance(status);
    if (U_FAILURE(status)) return absl::InternalError(absl::StrCat("ICU ", type, " unavailable"));
  } else if (type == "Lowercase") {
    n.kind = Normalizer::Kind::kLowercase;
  } else if (type == "Prepend") {
    n.kind = Normalizer::Kind::kPrepend;
    ASSIGN_OR_RETURN(n.text, StringField(spec, "prepend", where));
  } else if (type == "Replace") {
    n.kind = Normalizer::Kind::kReplace;
    const Json* pattern = Member(spec, "pattern");
    if (pattern == nullptr) return Invalid(where + ".pattern", "missing");
    ASSIGN_OR_RETURN(n.pattern, ParsePattern(*pattern, where + ".pattern"));
    ASSIGN_OR_RETURN(n.text, StringField(spec, "content", where));
  } else if (type == "Strip") {
    n.kind = Normalizer::Kind::kStrip;
    ASSIGN_OR_RETURN(n.strip_left, BoolField(spec, "strip_left", where, true));
    ASSIGN_OR_RETURN(n.strip_right, BoolField(spec, "strip_right", where, true));
  } else {
    return Invalid(where, absl::StrCat("normalizer \"", type,
                                       "\" is not supported (NFC, NFD, NFKC, NFKD, Lowercase, "
                                       "Prepend, Replace, Strip, Sequence are)"));
  }
  out->push_back(std::move(n));
  return absl::OkStatus();
}

// ---- pre-tokenizers ----------------------------------------------------------------------------

// GPT-2's split, which Hugging Face's ByteLevel pre-tokenizer applies when use_regex is set.
constexpr char kGpt2SplitPattern[] =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

struct PreTokenizer {
  enum class Kind { kByteLevel, kSplit, kMetaspace, kDigits, kWhitespaceSplit } kind;
  bool add_prefix_space = false;  // kByteLevel
  bool use_regex = true;          // kByteLevel
  Pattern pattern;                // kSplit; kByteLevel with use_regex
  Behavior behavior = Behavior::kIsolated;
  bool invert = false;
  std::string replacement;  // kMetaspace
  enum class Prepend { kAlways, kFirst, kNever } prepend = Prepend::kAlways;
  bool split = true;               // kMetaspace
  bool individual_digits = false;  // kDigits

  void Apply(std::vector<Piece>* pieces) const {
    std::vector<Piece> out;
    for (Piece& piece : *pieces) {
      switch (kind) {
        case Kind::kByteLevel: {
          if (add_prefix_space && !absl::StartsWith(piece.text, " ")) {
            piece.text.insert(0, " ");
          }
          std::vector<Piece> split_pieces;
          if (use_regex) {
            AppendSplit(piece,
                        SplitSpans(piece.text.size(), pattern.FindAll(piece.text), false,
                                   Behavior::kIsolated),
                        &split_pieces);
          } else {
            split_pieces.push_back(std::move(piece));
          }
          for (Piece& p : split_pieces) {
            p.text = ByteLevelEncode(p.text);
            out.push_back(std::move(p));
          }
          break;
        }
        case Kind::kSplit:
          AppendSplit(piece,
                      SplitSpans(piece.text.size(), pattern.FindAll(piece.text), invert, behavior),
                      &out);
          break;
        case Kind::kMetaspace: {
          piece.text = absl::StrReplaceAll(piece.text, {{" ", replacement}});
          const bool prepend_here =
              prepend == Prepend::kAlways || (prepend == Prepend::kFirst && piece.at_text_start);
          if (prepend_here && !absl::StartsWith(piece.text, replacement)) {
            piece.text.insert(0, replacement);
          }
          if (split) {
            Pattern literal{replacement, nullptr};
            AppendSplit(piece,
                        SplitSpans(piece.text.size(), literal.FindAll(piece.text), false,
                                   Behavior::kMergedWithNext),
                        &out);
          } else {
            out.push_back(std::move(piece));
          }
          break;
        }
        case Kind::kDigits:
          AppendSplit(
              piece,
              SplitSpans(
                  piece.text.size(),
                  CodePointMatches(piece.text, [](uint32_t cp) { return cp >= '0' && cp <= '9'; }),
                  false, individual_digits ? Behavior::kIsolated : Behavior::kContiguous),
              &out);
          break;
        case Kind::kWhitespaceSplit:
          AppendSplit(piece,
                      SplitSpans(piece.text.size(), CodePointMatches(piece.text, IsWhitespace),
                                 false, Behavior::kRemoved),
                      &out);
          break;
      }
    }
    *pieces = std::move(out);
  }
};

absl::Status ParsePreTokenizer(const Json& spec, const std::string& where,
                               std::vector<PreTokenizer>* out) {
  ASSIGN_OR_RETURN(const std::string type, StringField(spec, "type", where));
  PreTokenizer p{};
  if (type == "Sequence") {
    return ForEachListed(
        spec, "pretokenizers", where,
        [&](const Json& item, const std::string& at) { return ParsePreTokenizer(item, at, out); });
  } else if (type == "ByteLevel") {
    p.kind = PreTokenizer::Kind::kByteLevel;
    ASSIGN_OR_RETURN(p.add_prefix_space, BoolField(spec, "add_prefix_space", where, true));
    ASSIGN_OR_RETURN(p.use_regex, BoolField(spec, "use_regex", where, true));
    if (p.use_regex) {
      ASSIGN_OR_RETURN(p.pattern.regex, Regex::Compile(kGpt2SplitPattern, where));
    }
  } else if (type == "Split") {
    p.kind = PreTokenizer::Kind::kSplit;
    const Json* pattern = Member(spec, "pattern");
    if (pattern == nullptr) return Invalid(where + ".pattern", "missing");
    ASSIGN_OR_RETURN(p.pattern, ParsePattern(*pattern, where + ".pattern"));
    ASSIGN_OR_RETURN(p.behavior, ParseBehavior(spec, where));
    ASSIGN_OR_RETURN(p.invert, BoolField(spec, "invert", where, false));
  } else if (type == "Metaspace") {
    p.kind = PreTokenizer::Kind::kMetaspace;
    ASSIGN_OR_RETURN(p.replacement, StringField(spec, "replacement", where, "\u2581"));
    if (p.replacement.empty()) return Invalid(where + ".replacement", "empty");
    ASSIGN_OR_RETURN(p.split, BoolField(spec, "split", where, true));
    // Older files say add_prefix_space; newer ones prepend_scheme.
    ASSIGN_OR_RETURN(const bool add_prefix_space, BoolField(spec, "add_prefix_space", where, true));
    ASSIGN_OR_RETURN(const std::string scheme,
                     StringField(spec, "prepend_scheme", where,
                                 std::string(add_prefix_space ? "always" : "never")));
    if (scheme == "always") {
      p.prepend = PreTokenizer::Prepend::kAlways;
    } else if (scheme == "first") {
      p.prepend = PreTokenizer::Prepend::kFirst;
    } else if (scheme == "never") {
      p.prepend = PreTokenizer::Prepend::kNever;
    } else {
      return Invalid(where + ".prepend_scheme", absl::StrCat("unknown scheme \"", scheme, "\""));
    }
  } else if (type == "Digits") {
    p.kind = PreTokenizer::Kind::kDigits;
    ASSIGN_OR_RETURN(p.individual_digits, BoolField(spec, "individual_digits", where, false));
  } else if (type == "WhitespaceSplit") {
    p.kind = PreTokenizer::Kind::kWhitespaceSplit;
  } else {
    return Invalid(where, absl::StrCat("pre-tokenizer \"", type,
                                       "\" is not supported (ByteLevel, Split, Metaspace, Digits, "
                                       "WhitespaceSplit, Sequence are)"));
  }
  out->push_back(std::move(p));
  return absl::OkStatus();
}

// ---- post-processors ---------------------------------------------------------------------------

// What the post-processor puts around one sequence.
struct Wrapping {
  std::vector<int32_t> before, after;
};

absl::Status ParsePostProcessor(const Json& spec, const std::string& where, Wrapping* wrapping) {
  ASSIGN_OR_RETURN(const std::string type, StringField(spec, "type", where));
  Wrapping own;
  if (type == "Sequence") {
    return ForEachListed(spec, "processors", where, [&](const Json& item, const std::string& at) {
      return ParsePostProcessor(item, at, wrapping);
    });
  } else if (type == "ByteLevel") {
    return absl::OkStatus();  // offsets only
  } else if (type == "TemplateProcessing") {
    const Json* single = Member(spec, "single");
    const Json* special = Member(spec, "special_tokens");
    if (single == nullptr || !single->is_array()) return Invalid(where + ".single", "not a list");
    bool seen_sequence = false;
    for (size_t i = 0; i < single->size(); ++i) {
      const std::string item = absl::StrCat(where, ".single[", i, "]");
      if (Member((*single)[i], "Sequence") != nullptr) {
        seen_sequence = true;
        continue;
      }
      const Json* token = Member((*single)[i], "SpecialToken");
      if (token == nullptr) return Invalid(item, "neither a Sequence nor a SpecialToken");
      ASSIGN_OR_RETURN(const std::string name, StringField(*token, "id", item + ".SpecialToken"));
      const Json* entry = special == nullptr ? nullptr : Member(*special, name.c_str());
      const Json* ids = entry == nullptr ? nullptr : Member(*entry, "ids");
      if (ids == nullptr || !ids->is_array()) {
        return Invalid(where + ".special_tokens",
                       absl::StrCat("no ids for \"", name, "\", which ", item, " names"));
      }
      for (const Json& id : *ids) {
        if (!id.is_number_integer()) {
          return Invalid(where + ".special_tokens", absl::StrCat("\"", name, "\": ids"));
        }
        (seen_sequence ? own.after : own.before).push_back(id.get<int32_t>());
      }
    }
  } else if (type == "RobertaProcessing" || type == "BertProcessing") {
    for (const char* key : {"cls", "sep"}) {
      const Json* pair = Member(spec, key);
      if (pair == nullptr || !pair->is_array() || pair->size() != 2 ||
          !(*pair)[1].is_number_integer()) {
        return Invalid(absl::StrCat(where, ".", key), "not [token, id]");
      }
      (std::string(key) == "cls" ? own.before : own.after).push_back((*pair)[1].get<int32_t>());
    }
  } else {
    return Invalid(where, absl::StrCat("post-processor \"", type,
                                       "\" is not supported (TemplateProcessing, "
                                       "RobertaProcessing, BertProcessing, ByteLevel, Sequence "
                                       "are)"));
  }
  // A later processor wraps what the earlier ones produced.
  wrapping->before.insert(wrapping->before.begin(), own.before.begin(), own.before.end());
  wrapping->after.insert(wrapping->after.end(), own.after.begin(), own.after.end());
  return absl::OkStatus();
}

// ---- added tokens ------------------------------------------------------------------------------

struct AddedToken {
  std::string content;
  int32_t id;
  bool lstrip, rstrip, single_word, normalized;
};

bool IsWordCharacter(uint32_t cp) { return cp == '_' || u_isalnum(static_cast<UChar32>(cp)); }

// The code point that ends at byte `end` of s (valid UTF-8, end > 0).
uint32_t CodePointBefore(absl::string_view s, size_t end) {
  return DecodeUtf8(s, PreviousCodePointStart(s, end)).first;
}

// Finds added tokens in text, leftmost first and the longest of those starting at one place.
class AddedTokenMatcher {
 public:
  void Add(const AddedToken* token) {
    if (token->content.empty()) return;
    auto& list = by_first_byte_[static_cast<uint8_t>(token->content[0])];
    list.push_back(token);
    std::stable_sort(list.begin(), list.end(), [](const AddedToken* a, const AddedToken* b) {
      return a->content.size() > b->content.size();
    });
  }
  bool empty() const {
    return std::all_of(by_first_byte_.begin(), by_first_byte_.end(),
                       [](const auto& list) { return list.empty(); });
  }

  // Splits `piece` into text pieces and matched tokens (a text piece has id -1).
  void Split(const Piece& piece, std::vector<std::pair<Piece, int32_t>>* out) const {
    const std::string& s = piece.text;
    size_t text_begin = 0;  // where the pending text piece starts
    for (size_t i = 0; i < s.size();) {
      const AddedToken* found = nullptr;
      for (const AddedToken* token : by_first_byte_[static_cast<uint8_t>(s[i])]) {
        if (s.compare(i, token->content.size(), token->content) != 0) continue;
        const size_t end = i + token->content.size();
        if (token->single_word && ((i > 0 && IsWordCharacter(CodePointBefore(s, i))) ||
                                   (end < s.size() && IsWordCharacter(DecodeUtf8(s, end).first)))) {
          continue;
        }
        found = token;
        break;
      }
      if (found == nullptr) {
        ++i;
        continue;
      }
      size_t begin = i, end = i + found->content.size();
      while (found->lstrip && begin > text_begin && IsWhitespace(CodePointBefore(s, begin))) {
        begin = PreviousCodePointStart(s, begin);
      }
      while (found->rstrip && end < s.size() && IsWhitespace(DecodeUtf8(s, end).first)) {
        end += DecodeUtf8(s, end).second;
      }
      if (begin > text_begin) {
        out->push_back(
            {{s.substr(text_begin, begin - text_begin), piece.at_text_start && text_begin == 0},
             -1});
      }
      out->push_back({{}, found->id});
      text_begin = i = end;
    }
    if (text_begin < s.size()) {
      out->push_back({{s.substr(text_begin), piece.at_text_start && text_begin == 0}, -1});
    }
  }

 private:
  std::array<std::vector<const AddedToken*>, 256> by_first_byte_;
};

// ---- the BPE model -----------------------------------------------------------------------------

uint64_t PairKey(int32_t a, int32_t b) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
}

struct Bpe {
  absl::flat_hash_map<std::string, int32_t> vocab;
  absl::flat_hash_map<uint64_t, std::pair<int32_t, int32_t>> merges;  // (a, b) -> (rank, a+b)
  std::optional<int32_t> unk;
  bool fuse_unk = false, byte_fallback = false, ignore_merges = false;
  std::string continuing_subword_prefix, end_of_word_suffix;
  std::array<int32_t, 256> byte_ids;  // "<0xNN>" -> id, -1 where the vocabulary lacks it

  // Appends the ids of one pre-token.
  void Encode(absl::string_view word, std::vector<int32_t>* out) const {
    if (ignore_merges) {
      if (auto it = vocab.find(word); it != vocab.end()) {
        out->push_back(it->second);
        return;
      }
    }
    struct Symbol {
      int32_t id;
      int prev, next;
      bool alive;
    };
    std::vector<Symbol> symbols;
    bool previous_unk = false;
    const auto push = [&](int32_t id) {
      const int index = static_cast<int>(symbols.size());
      symbols.push_back({id, index - 1, -1, true});
      if (index > 0) symbols[index - 1].next = index;
    };
    std::string token;
    for (size_t i = 0; i < word.size();) {
      const size_t n = std::max<size_t>(1, DecodeUtf8(word, i).second);
      token.clear();
      if (i > 0) token += continuing_subword_prefix;
      token.append(word.data() + i, n);
      if (i + n == word.size()) token += end_of_word_suffix;
      const absl::string_view character = word.substr(i, n);
      i += n;
      if (auto it = vocab.find(token); it != vocab.end()) {
        push(it->second);
        previous_unk = false;
        continue;
      }
      if (byte_fallback && std::all_of(character.begin(), character.end(), [&](char c) {
            return byte_ids[static_cast<uint8_t>(c)] >= 0;
          })) {
        for (const char c : character) push(byte_ids[static_cast<uint8_t>(c)]);
        previous_unk = false;
        continue;
      }
      // Without an unknown token the character is dropped, as Hugging Face does.
      if (unk && !(fuse_unk && previous_unk)) push(*unk);
      previous_unk = unk.has_value();
    }

    // Merge the lowest-ranked pair first (leftmost among equals) until no pair has a merge.
    struct Candidate {
      int32_t rank;
      int pos;
      int32_t merged;
      bool operator<(const Candidate& o) const {  // inverted: priority_queue pops the largest
        return rank != o.rank ? rank > o.rank : pos > o.pos;
      }
    };
    std::priority_queue<Candidate> queue;
    const auto consider = [&](int left) {
      if (left < 0 || symbols[left].next < 0) return;
      auto it = merges.find(PairKey(symbols[left].id, symbols[symbols[left].next].id));
      if (it != merges.end()) queue.push({it->second.first, left, it->second.second});
    };
    for (int k = 0; k + 1 < static_cast<int>(symbols.size()); ++k) consider(k);
    while (!queue.empty()) {
      const Candidate top = queue.top();
      queue.pop();
      Symbol& left = symbols[top.pos];
      if (!left.alive || left.next < 0) continue;
      auto it = merges.find(PairKey(left.id, symbols[left.next].id));
      if (it == merges.end() || it->second.second != top.merged) continue;  // stale
      Symbol& right = symbols[left.next];
      left.id = top.merged;
      right.alive = false;
      left.next = right.next;
      if (right.next >= 0) symbols[right.next].prev = top.pos;
      consider(left.prev);
      consider(top.pos);
    }
    for (const Symbol& s : symbols) {
      if (s.alive) out->push_back(s.id);
    }
  }
};

absl::Status ParseBpe(const Json& model, Bpe* bpe) {
  ASSIGN_OR_RETURN(const std::string type, StringField(model, "type", "model", "BPE"));
  if (type != "BPE") {
    return Invalid("model.type",
                   absl::StrCat("\"", type,
                                "\": only BPE models are supported (GPT-2, Llama, Mistral, "
                                "Gemma, Qwen2, GPT-NeoX); tokenize with the tokenizers library "
                                "and pass token ids"));
  }
  if (const Json* dropout = Member(model, "dropout");
      dropout != nullptr && !(dropout->is_number() && dropout->get<double>() == 0)) {
    return Invalid("model.dropout", "BPE dropout is for training; set it to null");
  }
  const Json* vocab = Member(model, "vocab");
  if (vocab == nullptr || !vocab->is_object()) return Invalid("model.vocab", "not a map");
  bpe->vocab.reserve(vocab->size());
  for (auto it = vocab->begin(); it != vocab->end(); ++it) {
    if (!it.value().is_number_integer() || it.value().get<int64_t>() < 0 ||
        it.value().get<int64_t>() >= (int64_t{1} << 31)) {
      return Invalid("model.vocab", absl::StrCat("the id of \"", it.key(), "\" is not an id"));
    }
    bpe->vocab.emplace(it.key(), it.value().get<int32_t>());
  }
  ASSIGN_OR_RETURN(bpe->continuing_subword_prefix,
                   StringField(model, "continuing_subword_prefix", "model", ""));
  ASSIGN_OR_RETURN(bpe->end_of_word_suffix, StringField(model, "end_of_word_suffix", "model", ""));
  ASSIGN_OR_RETURN(bpe->fuse_unk, BoolField(model, "fuse_unk", "model", false));
  ASSIGN_OR_RETURN(bpe->byte_fallback, BoolField(model, "byte_fallback", "model", false));
  ASSIGN_OR_RETURN(bpe->ignore_merges, BoolField(model, "ignore_merges", "model", false));
  if (const Json* unk = Member(model, "unk_token"); unk != nullptr) {
    if (!unk->is_string()) return Invalid("model.unk_token", "not a string");
    auto it = bpe->vocab.find(unk->get<std::string>());
    if (it == bpe->vocab.end()) {
      return Invalid("model.unk_token",
                     absl::StrCat("\"", unk->get<std::string>(), "\" is not in model.vocab"));
    }
    bpe->unk = it->second;
  }
  for (int byte = 0; byte < 256; ++byte) {
    auto it = bpe->vocab.find(absl::StrFormat("<0x%02X>", byte));
    bpe->byte_ids[byte] = it == bpe->vocab.end() ? -1 : it->second;
  }

  const Json* merges = Member(model, "merges");
  if (merges == nullptr || !merges->is_array()) return Invalid("model.merges", "not a list");
  bpe->merges.reserve(merges->size());
  const size_t prefix = bpe->continuing_subword_prefix.size();
  for (size_t rank = 0; rank < merges->size(); ++rank) {
    const Json& merge = (*merges)[rank];
    std::string a, b;
    if (merge.is_string()) {  // "a b"
      const std::string& line = merge.get_ref<const std::string&>();
      const size_t space = line.find(' ');
      if (space == std::string::npos || line.find(' ', space + 1) != std::string::npos) {
        return Invalid(absl::StrCat("model.merges[", rank, "]"),
                       absl::StrCat("\"", line, "\" is not two tokens"));
      }
      a = line.substr(0, space), b = line.substr(space + 1);
    } else if (merge.is_array() && merge.size() == 2 && merge[0].is_string() &&
               merge[1].is_string()) {  // ["a", "b"]
      a = merge[0].get<std::string>(), b = merge[1].get<std::string>();
    } else {
      return Invalid(absl::StrCat("model.merges[", rank, "]"), "neither \"a b\" nor [a, b]");
    }
    const std::string merged =
        a +
        (prefix > 0 && absl::StartsWith(b, bpe->continuing_subword_prefix) ? b.substr(prefix) : b);
    const auto ia = bpe->vocab.find(a), ib = bpe->vocab.find(b), im = bpe->vocab.find(merged);
    if (ia == bpe->vocab.end() || ib == bpe->vocab.end() || im == bpe->vocab.end()) {
      return Invalid(absl::StrCat("model.merges[", rank, "]"),
                     absl::StrCat("\"", a, "\" + \"", b, "\": a token outside model.vocab"));
    }
    bpe->merges.emplace(PairKey(ia->second, ib->second),
                        std::make_pair(static_cast<int32_t>(rank), im->second));
  }
  return absl::OkStatus();
}

}  // namespace

struct Tokenizer::Impl {
  Bpe bpe;
  std::vector<AddedToken> added;
  AddedTokenMatcher raw_matcher, normalized_matcher;  // added tokens with normalized false / true
  std::vector<Normalizer> normalizers;
  std::vector<PreTokenizer> pre_tokenizers;
  Wrapping wrapping;
  int32_t vocab_size = 0;

  // Pre-token -> ids; words repeat (Zipf), so most lookups hit. Sharded by the word's hash so
  // that threads encoding at once rarely wait on each other; each shard is cleared when full.
  static constexpr size_t kCacheShards = 16;
  static constexpr size_t kShardEntries = 1 << 12;
  static constexpr size_t kCacheableBytes = 256;
  struct CacheShard {
    absl::Mutex mu;
    absl::flat_hash_map<std::string, std::vector<int32_t>> ids ABSL_GUARDED_BY(mu);
  };
  mutable std::array<CacheShard, kCacheShards> cache;

  void EncodeWord(const std::string& word, std::vector<int32_t>* out) const {
    if (word.size() > kCacheableBytes) {
      bpe.Encode(word, out);
      return;
    }
    CacheShard& shard = cache[absl::Hash<std::string>()(word) % kCacheShards];
    {
      absl::MutexLock lock(&shard.mu);
      if (auto it = shard.ids.find(word); it != shard.ids.end()) {
        out->insert(out->end(), it->second.begin(), it->second.end());
        return;
      }
    }
    const size_t begin = out->size();
    bpe.Encode(word, out);
    absl::MutexLock lock(&shard.mu);
    if (shard.ids.size() >= kShardEntries) shard.ids.clear();
    shard.ids.emplace(word, std::vector<int32_t>(out->begin() + begin, out->end()));
  }

  // A stretch of text between added tokens: normalize, split out the normalized added tokens,
  // pre-tokenize, BPE.
  void EncodeText(Piece piece, std::vector<int32_t>* out) const {
    for (const Normalizer& n : normalizers) n.Apply(&piece.text);
    std::vector<std::pair<Piece, int32_t>> parts;
    if (normalized_matcher.empty()) {
      parts.push_back({std::move(piece), -1});
    } else {
      normalized_matcher.Split(piece, &parts);
    }
    for (auto& [text, id] : parts) {
      if (id >= 0) {
        out->push_back(id);
        continue;
      }
      std::vector<Piece> pieces{std::move(text)};
      for (const PreTokenizer& p : pre_tokenizers) p.Apply(&pieces);
      for (const Piece& word : pieces) {
        if (!word.text.empty()) EncodeWord(word.text, out);
      }
    }
  }
};

Tokenizer::Tokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;
Tokenizer::~Tokenizer() = default;

absl::StatusOr<Tokenizer> Tokenizer::Load(const std::string& path) {
  absl::StatusOr<std::string> contents = ReadFileToString(path);
  if (!contents.ok()) {
    return absl::Status(contents.status().code(),
                        absl::StrCat("tokenizer ", contents.status().message()));
  }
  absl::StatusOr<Tokenizer> tokenizer = Parse(*contents);
  if (!tokenizer.ok()) {
    return absl::Status(tokenizer.status().code(),
                        absl::StrCat("tokenizer ", path, ": ", tokenizer.status().message()));
  }
  return tokenizer;
}

absl::StatusOr<Tokenizer> Tokenizer::Parse(absl::string_view json) {
  const Json doc = Json::parse(json.begin(), json.end(), nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded() || !doc.is_object()) {
    return absl::InvalidArgumentError("not a JSON object (a Hugging Face tokenizer.json)");
  }
  auto impl = std::make_unique<Impl>();
  const Json* model = Member(doc, "model");
  if (model == nullptr) return Invalid("model", "missing");
  RETURN_IF_ERROR(ParseBpe(*model, &impl->bpe));
  for (const auto& [token, id] : impl->bpe.vocab) {
    impl->vocab_size = std::max(impl->vocab_size, id + 1);
  }

  if (const Json* added = Member(doc, "added_tokens"); added != nullptr) {
    if (!added->is_array()) return Invalid("added_tokens", "not a list");
    impl->added.reserve(added->size());
    for (size_t i = 0; i < added->size(); ++i) {
      const Json& entry = (*added)[i];
      const std::string where = absl::StrCat("added_tokens[", i, "]");
      const Json* id = Member(entry, "id");
      if (id == nullptr || !id->is_number_integer() || id->get<int64_t>() < 0 ||
          id->get<int64_t>() >= (int64_t{1} << 31)) {
        return Invalid(where + ".id", "not an id");
      }
      AddedToken token;
      token.id = id->get<int32_t>();
      ASSIGN_OR_RETURN(token.content, StringField(entry, "content", where));
      ASSIGN_OR_RETURN(token.lstrip, BoolField(entry, "lstrip", where, false));
      ASSIGN_OR_RETURN(token.rstrip, BoolField(entry, "rstrip", where, false));
      ASSIGN_OR_RETURN(token.single_word, BoolField(entry, "single_word", where, false));
      ASSIGN_OR_RETURN(const bool special, BoolField(entry, "special", where, false));
      ASSIGN_OR_RETURN(token.normalized, BoolField(entry, "normalized", where, !special));
      impl->vocab_size = std::max(impl->vocab_size, token.id + 1);
      impl->added.push_back(std::move(token));
    }
    for (const AddedToken& token : impl->added) {
      (token.normalized ? impl->normalized_matcher : impl->raw_matcher).Add(&token);
    }
  }
  if (const Json* normalizer = Member(doc, "normalizer"); normalizer != nullptr) {
    RETURN_IF_ERROR(ParseNormalizer(*normalizer, "normalizer", &impl->normalizers));
  }
  if (const Json* pre = Member(doc, "pre_tokenizer"); pre != nullptr) {
    RETURN_IF_ERROR(ParsePreTokenizer(*pre, "pre_tokenizer", &impl->pre_tokenizers));
  }
  if (const Json* post = Member(doc, "post_processor"); post != nullptr) {
    RETURN_IF_ERROR(ParsePostProcessor(*post, "post_processor", &impl->wrapping));
  }
  return Tokenizer(std::move(impl));
}

absl::StatusOr<std::vector<int32_t>> Tokenizer::Encode(absl::string_view text,
                                                       bool add_special_tokens) const {
  if (const std::optional<size_t> bad = FirstInvalidUtf8(text)) {
    return absl::InvalidArgumentError(
        absl::StrCat("the text is not UTF-8 at byte ", *bad, " (of ", text.size(), ")"));
  }
  std::vector<int32_t> ids;
  if (add_special_tokens) ids = impl_->wrapping.before;
  std::vector<std::pair<Piece, int32_t>> parts;
  impl_->raw_matcher.Split(Piece{std::string(text), true}, &parts);
  for (auto& [piece, id] : parts) {
    if (id >= 0) {
      ids.push_back(id);
    } else {
      impl_->EncodeText(std::move(piece), &ids);
    }
  }
  if (add_special_tokens) {
    ids.insert(ids.end(), impl_->wrapping.after.begin(), impl_->wrapping.after.end());
  }
  return ids;
}

std::optional<int32_t> Tokenizer::TokenId(absl::string_view token) const {
  for (const AddedToken& added : impl_->added) {
    if (added.content == token) return added.id;
  }
  auto it = impl_->bpe.vocab.find(token);
  if (it == impl_->bpe.vocab.end()) return std::nullopt;
  return it->second;
}

int32_t Tokenizer::vocab_size() const { return impl_->vocab_size; }

}  // namespace latentd::client
