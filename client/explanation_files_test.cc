#include "client/explanation_files.h"

#include <filesystem>
#include <fstream>
#include <string>

#include "absl/strings/str_cat.h"
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

TEST(DelphiTest, ExplanationsDirectoryOfOneModule) {
  const fs::path dir = FreshTestDir("explanation_files_delphi");
  Write(dir / "layers.6_latent40.txt", "\"Mentions of \\\"Paris\\\" and French cities\"");
  Write(dir / "layers.6_latent7.txt", "\"digits\"");
  Write(dir / "notes.md", "not an explanation");
  auto run = LocateDelphiRun(dir.string(), "");
  ASSERT_TRUE(run.ok()) << run.status();
  EXPECT_EQ(run->explanations_dir, dir.string());
  EXPECT_EQ(run->scores_dir, "");  // not a whole run: nothing to score with
  EXPECT_EQ(DelphiModules(*run), std::vector<std::string>{"layers.6"});
  auto got = ReadDelphiExplanations(*run, "layers.6");
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_EQ(got->size(), 2u);  // by latent
  EXPECT_EQ((*got)[0].latent(), 7);
  EXPECT_EQ((*got)[0].text(), "digits");
  EXPECT_EQ((*got)[1].latent(), 40);
  EXPECT_EQ((*got)[1].text(), "Mentions of \"Paris\" and French cities");
  EXPECT_EQ((*got)[1].source(), "delphi");
  EXPECT_FALSE((*got)[1].has_score());
  Write(dir / "layers.6_latent8.txt", "digits without quotes");
  run = LocateDelphiRun(dir.string(), "");
  ASSERT_TRUE(run.ok()) << run.status();
  got = ReadDelphiExplanations(*run, "layers.6");
  EXPECT_EQ(got.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(got.status().message().find("layers.6_latent8.txt: not a JSON string"),
            std::string::npos)
      << got.status();
  EXPECT_EQ(LocateDelphiRun((dir / "missing").string(), "").status().code(),
            absl::StatusCode::kNotFound);
}

// One record of delphi's ClassifierOutput, as its scorers save them.
std::string Verdict(bool activating, const std::string& prediction) {
  return absl::StrCat("{\"str_tokens\": [\"a\", \" b\"], \"activations\": [0.0, 1.5], ",
                      "\"distance\": 0, \"activating\": ", activating ? "true" : "false",
                      ", \"prediction\": ", prediction, ", \"probability\": 0.5}");
}

TEST(DelphiTest, ClassifierScoreIsBalancedOverTheAnsweredExamples) {
  // 3 activating (2 found), 1 not (called activating), 1 unanswered.
  const std::string verdicts = absl::StrCat(
      "[", Verdict(true, "true"), ",", Verdict(true, "true"), ",", Verdict(true, "false"), ",",
      Verdict(false, "true"), ",", Verdict(false, "null"), "]");
  auto score = ParseClassifierScore(verdicts);
  ASSERT_TRUE(score.ok()) << score.status();
  EXPECT_EQ(score->answered, 4);
  EXPECT_EQ(score->unanswered, 1);
  EXPECT_DOUBLE_EQ(score->accuracy, 0.5);
  EXPECT_DOUBLE_EQ(score->balanced_accuracy, (2.0 / 3 + 0.0) / 2);
  // Some delphi versions write 0/1 (and -1 for a reply that could not be parsed).
  score = ParseClassifierScore(absl::StrCat("[", Verdict(false, "0"), ",", Verdict(true, "1"), ",",
                                            Verdict(true, "-1"), "]"));
  ASSERT_TRUE(score.ok()) << score.status();
  EXPECT_EQ(score->answered, 2);
  EXPECT_EQ(score->unanswered, 1);
  EXPECT_DOUBLE_EQ(score->balanced_accuracy, 1.0);
  // One class only: its recall.
  score = ParseClassifierScore(
      absl::StrCat("[", Verdict(true, "true"), ",", Verdict(true, "false"), "]"));
  ASSERT_TRUE(score.ok()) << score.status();
  EXPECT_DOUBLE_EQ(score->balanced_accuracy, 0.5);

  for (const char* bad : {"{}", "[{\"prediction\": true}]", "[1]", "not json"}) {
    EXPECT_EQ(ParseClassifierScore(bad).status().code(), absl::StatusCode::kInvalidArgument) << bad;
  }
  EXPECT_NE(ParseClassifierScore(absl::StrCat("[", Verdict(true, "true"), ", {}]"))
                .status()
                .message()
                .find("record 1 has no boolean \"activating\""),
            std::string::npos);
}

TEST(DelphiTest, WholeRunOfSeveralModulesWithScores) {
  const fs::path root = FreshTestDir("explanation_files_delphi_run");
  fs::create_directories(root / "explanations");
  fs::create_directories(root / "scores" / "detection");
  fs::create_directories(root / "scores" / "fuzz");
  for (const std::string module : {"blocks.1.hook_resid_post", "blocks.2.hook_resid_post"}) {
    Write(root / "explanations" / (module + "_latent3.txt"), "\"" + module + " three\"");
    Write(root / "explanations" / (module + "_latent5.txt"), "\"" + module + " five\"");
  }
  // Latent 3 of layer 2 is scored by both scorers, latent 5 by none.
  Write(root / "scores" / "detection" / "blocks.2.hook_resid_post_latent3.txt",
        absl::StrCat("[", Verdict(true, "true"), ",", Verdict(false, "true"), "]"));
  Write(root / "scores" / "fuzz" / "blocks.2.hook_resid_post_latent3.txt",
        absl::StrCat("[", Verdict(true, "true"), ",", Verdict(false, "false"), "]"));
  // A file the scorer wrote without an answered example leaves its explanation unscored.
  Write(root / "scores" / "detection" / "blocks.1.hook_resid_post_latent3.txt",
        absl::StrCat("[", Verdict(true, "null"), "]"));

  auto run = LocateDelphiRun(root.string(), "");
  ASSERT_TRUE(run.ok()) << run.status();
  EXPECT_EQ(run->explanations_dir, (root / "explanations").string());
  EXPECT_EQ(run->scorer, "detection");  // detection before fuzz
  const std::vector<std::string> modules = DelphiModules(*run);
  EXPECT_EQ(modules.size(), 2u);
  // Several modules: the dataset's hook picks, or --module; else a clear refusal.
  EXPECT_EQ(ChooseDelphiModule(modules, "", "blocks.2.hook_resid_post").value(),
            "blocks.2.hook_resid_post");
  EXPECT_EQ(
      ChooseDelphiModule(modules, "blocks.1.hook_resid_post", "blocks.2.hook_resid_post").value(),
      "blocks.1.hook_resid_post");
  absl::Status refused = ChooseDelphiModule(modules, "", "blocks.0.hook_resid_post").status();
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(refused.message().find("2 modules (blocks.1.hook_resid_post, "
                                   "blocks.2.hook_resid_post)"),
            std::string::npos)
      << refused;
  EXPECT_EQ(ChooseDelphiModule(modules, "layers.6", "").status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ChooseDelphiModule({"layers.6"}, "", "blocks.0.hook_resid_post").value(), "layers.6");

  auto got = ReadDelphiExplanations(*run, "blocks.2.hook_resid_post");
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_EQ(got->size(), 2u);
  EXPECT_EQ((*got)[0].text(), "blocks.2.hook_resid_post three");
  ASSERT_TRUE((*got)[0].has_score());
  EXPECT_DOUBLE_EQ((*got)[0].score(), 0.5);
  EXPECT_EQ((*got)[0].source(), "delphi/detection");
  EXPECT_FALSE((*got)[1].has_score());
  EXPECT_EQ((*got)[1].source(), "delphi");
  got = ReadDelphiExplanations(*run, "blocks.1.hook_resid_post");
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_FALSE((*got)[0].has_score());

  // Another scorer by name, or by its directory.
  for (const std::string& scores : {std::string("fuzz"), (root / "scores" / "fuzz/").string()}) {
    run = LocateDelphiRun(root.string(), scores);
    ASSERT_TRUE(run.ok()) << run.status();
    EXPECT_EQ(run->scorer, "fuzz") << scores;
    got = ReadDelphiExplanations(*run, "blocks.2.hook_resid_post");
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_DOUBLE_EQ((*got)[0].score(), 1.0);
    EXPECT_EQ((*got)[0].source(), "delphi/fuzz");
  }
  EXPECT_EQ(LocateDelphiRun(root.string(), "simulation").status().code(),
            absl::StatusCode::kNotFound);
  // A scorer file that is not a classifier's is named in the refusal.
  Write(root / "scores" / "detection" / "blocks.2.hook_resid_post_latent3.txt", "{\"ev\": 1}");
  run = LocateDelphiRun(root.string(), "");
  got = ReadDelphiExplanations(*run, "blocks.2.hook_resid_post");
  EXPECT_EQ(got.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(got.status().message().find("detection/blocks.2.hook_resid_post_latent3.txt: not a "
                                        "JSON array"),
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
