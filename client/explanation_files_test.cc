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

TEST(ExplanationBatchesTest, RunsUnderTheByteBoundInOrder) {
  std::vector<v1::LatentExplanation> all;
  for (int32_t latent = 0; latent < 10; ++latent) {
    v1::LatentExplanation& e = all.emplace_back();
    e.set_latent(latent);
    e.set_text(std::string(latent == 4 ? 500 : 90, 'x'));  // latent 4 alone passes the bound
  }
  const size_t bound = 3 * all[1].ByteSizeLong();  // (latent 0 is 2 bytes shorter: no field)
  const auto batches = ExplanationBatches(all, bound);
  std::vector<int32_t> order;
  for (const auto& batch : batches) {
    size_t bytes = 0;
    for (const auto& e : batch) bytes += e.ByteSizeLong(), order.push_back(e.latent());
    EXPECT_TRUE(bytes <= bound || batch.size() == 1) << bytes;
    EXPECT_FALSE(batch.empty());
  }
  EXPECT_EQ(order, (std::vector<int32_t>{0, 1, 2, 3, 4, 5, 6, 7, 8, 9}));
  ASSERT_EQ(batches.size(), 5u);  // 0-2, 3, 4, 5-7, 8-9
  EXPECT_EQ(batches[2].size(), 1u);
  // None: one empty call still goes (--replace_all with an empty file clears).
  const auto none = ExplanationBatches({}, bound);
  ASSERT_EQ(none.size(), 1u);
  EXPECT_TRUE(none[0].empty());
}

}  // namespace
}  // namespace latentd::client
