#include "client/explanation_files.h"

#include <filesystem>
#include <fstream>
#include <string>

#include "common/test_dir.h"
#include "gtest/gtest.h"

namespace latentd::client {
namespace {

namespace fs = std::filesystem;

void Write(const fs::path& path, const std::string& text) { std::ofstream(path) << text; }

TEST(ReadExplanationsTest, JsonLinesWithEitherNameForTheText) {
  const fs::path dir = FreshTestDir("explanation_files_jsonl");
  const fs::path file = dir / "explanations.jsonl";
  Write(file,
        "{\"latent\": 12, \"text\": \"French words\", \"score\": 0.8, \"source\": \"delphi\"}\n"
        "\n"
        "{\"latent\": 3, \"explanation\": \"closing brackets\", \"extra\": [1, 2]}\n");
  auto got = ReadExplanations(file.string(), "human");
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_EQ(got->size(), 2u);
  EXPECT_EQ((*got)[0].latent(), 12);
  EXPECT_EQ((*got)[0].text(), "French words");
  EXPECT_TRUE((*got)[0].has_score());
  EXPECT_EQ((*got)[0].score(), 0.8);
  EXPECT_EQ((*got)[0].source(), "delphi");
  EXPECT_EQ((*got)[1].latent(), 3);
  EXPECT_EQ((*got)[1].text(), "closing brackets");
  EXPECT_FALSE((*got)[1].has_score());
  EXPECT_EQ((*got)[1].source(), "human");  // the default fills an unnamed source

  Write(file, "{\"latent\": 1, \"text\": \"ok\"}\n{\"latent\": \"two\"}\n");
  got = ReadExplanations(file.string(), "");
  EXPECT_EQ(got.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(got.status().message().find("explanations.jsonl:2: not an explanation"),
            std::string::npos)
      << got.status();
  EXPECT_EQ(ReadExplanations((dir / "missing").string(), "").status().code(),
            absl::StatusCode::kNotFound);
}

TEST(ReadExplanationsTest, DelphisExplanationsDirectory) {
  const fs::path dir = FreshTestDir("explanation_files_delphi");
  Write(dir / "layers.6_latent40.txt", "\"Mentions of \\\"Paris\\\" and French cities\"");
  Write(dir / "layers.6_latent7.txt", "\"digits\"");
  Write(dir / "notes.md", "not an explanation");
  auto got = ReadExplanations(dir.string(), "delphi");
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_EQ(got->size(), 2u);  // by latent
  EXPECT_EQ((*got)[0].latent(), 7);
  EXPECT_EQ((*got)[0].text(), "digits");
  EXPECT_EQ((*got)[1].latent(), 40);
  EXPECT_EQ((*got)[1].text(), "Mentions of \"Paris\" and French cities");
  EXPECT_EQ((*got)[1].source(), "delphi");
  Write(dir / "layers.6_latent8.txt", "digits without quotes");
  got = ReadExplanations(dir.string(), "delphi");
  EXPECT_EQ(got.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(got.status().message().find("layers.6_latent8.txt: not a JSON string"),
            std::string::npos)
      << got.status();
}

}  // namespace
}  // namespace latentd::client
