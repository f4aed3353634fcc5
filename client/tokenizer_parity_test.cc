// The ids of real tokenizers against a reference implementation's (tests/tokenizer/golden.json,
// written by tests/tokenizer/make_golden.mjs with @lenml/tokenizers, a port of transformers.js)
// for a corpus of English, code, numbers, whitespace runs, accents, CJK, Arabic, emoji and
// special tokens written in the text. The tokenizer.json files come from
// scripts/fetch-tokenizers.sh (scripts/test.sh runs it).
#include <pwd.h>
#include <unistd.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "client/tokenizer.h"
#include "gtest/gtest.h"

namespace latentd::client {
namespace {

using Json = nlohmann::json;

Json ReadJson(const std::string& path) {
  std::ifstream in(path);
  std::stringstream contents;
  contents << in.rdbuf();
  return Json::parse(contents.str(), nullptr, /*allow_exceptions=*/false);
}

std::string Runfile(const std::string& path) {
  const char* root = std::getenv("TEST_SRCDIR");
  return absl::StrCat(root ? root : "..", "/latentd/", path);
}

std::string TokenizerDir() {
  const passwd* pw = getpwuid(getuid());  // HOME is not passed into Bazel's test environment
  return absl::StrCat(pw ? pw->pw_dir : "/root", "/.cache/latentd/tokenizers");
}

TEST(TokenizerParityTest, RealTokenizersGiveTheReferenceIds) {
  const Json corpus = ReadJson(Runfile("tests/tokenizer/corpus.json"));
  const Json golden = ReadJson(Runfile("tests/tokenizer/golden.json"));
  ASSERT_TRUE(corpus.is_array() && golden.is_object());
  const Json& tokenizers = golden["tokenizers"];
  ASSERT_EQ(tokenizers.size(), 11u);
  for (auto it = tokenizers.begin(); it != tokenizers.end(); ++it) {
    const std::string path = absl::StrCat(TokenizerDir(), "/", it.key(), "/tokenizer.json");
    absl::StatusOr<Tokenizer> tokenizer = Tokenizer::Load(path);
    ASSERT_TRUE(tokenizer.ok()) << tokenizer.status()
                                << "\n(scripts/fetch-tokenizers.sh fetches the files)";
    const Json& expected = it.value()["ids"];
    ASSERT_EQ(expected.size(), corpus.size()) << it.key();
    int matching = 0;
    for (size_t i = 0; i < corpus.size(); ++i) {
      const std::string text = corpus[i].get<std::string>();
      absl::StatusOr<std::vector<int32_t>> ids = tokenizer->Encode(text);
      ASSERT_TRUE(ids.ok()) << ids.status();
      const std::vector<int32_t> want = expected[i].get<std::vector<int32_t>>();
      if (*ids == want) {
        ++matching;
      } else {
        ADD_FAILURE() << it.key() << ", corpus[" << i << "] \"" << text << "\"\n  reference "
                      << absl::StrJoin(want, " ") << "\n  latentctl " << absl::StrJoin(*ids, " ");
      }
    }
    std::printf("%s: %d of %zu texts give the reference ids\n", it.key().c_str(), matching,
                corpus.size());
  }
}

}  // namespace
}  // namespace latentd::client
