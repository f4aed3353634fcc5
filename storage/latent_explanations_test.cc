#include "storage/latent_explanations.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/test_dir.h"
#include "gtest/gtest.h"
#include "storage/keys.h"

namespace latentd::storage {
namespace {

class LatentExplanationsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto db = Db::Open(FreshTestDir("latent_explanations"), DbOptions());
    ASSERT_TRUE(db.ok()) << db.status();
    db_ = *std::move(db);
    store_ = std::make_unique<ChunkStore>(db_.get());
    id_ = MakeDataset("sae", DatasetKind::kSparse);
  }

  uint64_t MakeDataset(const std::string& name, DatasetKind kind,
                       const std::string& sae_weight_hash = "", int32_t width = 100) {
    DatasetMeta m;
    m.name = name;
    m.kind = kind;
    m.value_dtype = ValueDtype::kFloat32;
    m.width = width;
    m.sae_weight_hash = sae_weight_hash;
    if (kind == DatasetKind::kSparse) m.encoder = "relu";
    auto id = store_->CreateDataset(m);
    EXPECT_TRUE(id.ok()) << id.status();
    return *id;
  }

  static LatentExplanation Explained(int32_t latent, const std::string& text,
                                     std::optional<double> score = std::nullopt,
                                     const std::string& source = "") {
    LatentExplanation e;
    e.latent = latent;
    e.text = text;
    e.score = score;
    e.source = source;
    return e;
  }

  std::vector<int32_t> Found(absl::string_view query, int32_t limit = 100) {
    auto found = SearchExplanations(*store_, id_, query, limit);
    EXPECT_TRUE(found.ok()) << found.status();
    std::vector<int32_t> latents;
    if (found.ok()) {
      for (const LatentExplanation& e : found->explanations) latents.push_back(e.latent);
    }
    return latents;
  }

  std::unique_ptr<Db> db_;
  std::unique_ptr<ChunkStore> store_;
  uint64_t id_ = 0;
};

TEST_F(LatentExplanationsTest, StoredExplanationsComeBackAndReplaceEarlierOnes) {
  ASSERT_TRUE(PutExplanations(
                  *store_, id_,
                  {Explained(3, "French words", 0.8, "delphi"), Explained(40, "closing brackets")},
                  /*replace_all=*/false)
                  .ok());
  auto got = GetExplanation(*store_, id_, 3);
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_TRUE(got->has_value());
  EXPECT_EQ((*got)->text, "French words");
  EXPECT_EQ((*got)->score, 0.8);
  EXPECT_EQ((*got)->source, "delphi");
  got = GetExplanation(*store_, id_, 40);
  ASSERT_TRUE(got.ok() && got->has_value());
  EXPECT_FALSE((*got)->score.has_value());
  got = GetExplanation(*store_, id_, 41);
  ASSERT_TRUE(got.ok());
  EXPECT_FALSE(got->has_value());
  // A later explanation of latent 3 replaces its first; 40 keeps its own.
  ASSERT_TRUE(
      PutExplanations(*store_, id_, {Explained(3, "French and Spanish words", 0.9)}, false).ok());
  EXPECT_EQ((*GetExplanation(*store_, id_, 3))->text, "French and Spanish words");
  EXPECT_TRUE(GetExplanation(*store_, id_, 40)->has_value());
  // replace_all: the dataset's explanations are the new set alone.
  ASSERT_TRUE(PutExplanations(*store_, id_, {Explained(7, "digits")}, true).ok());
  EXPECT_FALSE(GetExplanation(*store_, id_, 3)->has_value());
  EXPECT_FALSE(GetExplanation(*store_, id_, 40)->has_value());
  EXPECT_TRUE(GetExplanation(*store_, id_, 7)->has_value());
}

TEST_F(LatentExplanationsTest, SearchMatchesEveryWordAndRanksByScore) {
  ASSERT_TRUE(PutExplanations(*store_, id_,
                              {Explained(1, "French nouns after an article", 0.55),
                               Explained(2, "the word 'France' and French cities", 0.9),
                               Explained(5, "french verbs"), Explained(9, "German nouns", 0.7),
                               Explained(4, "closing parentheses", 0.2, "human rater")},
                              false)
                  .ok());
  // Case aside, anywhere in the text; every word must be there.
  EXPECT_EQ(Found("FRENCH"), (std::vector<int32_t>{2, 1, 5}));  // scored by score, then unscored
  EXPECT_EQ(Found("french nouns"), (std::vector<int32_t>{1}));
  EXPECT_EQ(Found("fren"), (std::vector<int32_t>{2, 1, 5}));
  EXPECT_EQ(Found("nouns"), (std::vector<int32_t>{9, 1}));
  EXPECT_EQ(Found("human"), (std::vector<int32_t>{4}));  // the source counts too
  EXPECT_TRUE(Found("Italian").empty());
  // An empty query lists every one; limit cuts the list, not the count.
  auto all = SearchExplanations(*store_, id_, "  ", 2);
  ASSERT_TRUE(all.ok()) << all.status();
  EXPECT_EQ(all->explained, 5);
  EXPECT_EQ(*CountExplanations(*store_, id_), 5);
  EXPECT_EQ(all->matched, 5);
  ASSERT_EQ(all->explanations.size(), 2u);
  EXPECT_EQ(all->explanations[0].latent, 2);
  EXPECT_EQ(all->explanations[1].latent, 9);
  for (int32_t limit : {0, kMaxExplanationResults + 1}) {
    EXPECT_EQ(SearchExplanations(*store_, id_, "", limit).status().code(),
              absl::StatusCode::kInvalidArgument);
  }
}

TEST_F(LatentExplanationsTest, BadExplanationsAreRefusedAndNothingOfTheirPutIsStored) {
  const auto refused = [&](const std::vector<LatentExplanation>& put, const std::string& says) {
    const absl::Status s = PutExplanations(*store_, id_, put, false);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_NE(s.message().find(says), std::string::npos) << s;
  };
  refused({Explained(1, "fine"), Explained(100, "past the width")},
          "explanations[1].latent: 100 outside [0, 100)");
  refused({Explained(-1, "negative")}, "explanations[0].latent");
  refused({Explained(1, "a"), Explained(1, "b")}, "explanations[1].latent: 1 is given twice");
  refused({Explained(1, "")}, "explanations[0].text: 0 bytes");
  refused({Explained(1, std::string(kMaxExplanationBytes + 1, 'x'))}, "explanations[0].text");
  refused({Explained(1, "x", std::nullopt, std::string(kMaxExplanationSourceBytes + 1, 's'))},
          "explanations[0].source");
  refused({Explained(1, "x", std::numeric_limits<double>::quiet_NaN())}, "explanations[0].score");
  // The good first entry of each refused call was not stored either.
  EXPECT_FALSE(GetExplanation(*store_, id_, 1)->has_value());
  EXPECT_EQ(GetExplanation(*store_, id_, 100).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(PutExplanations(*store_, id_ + 50, {Explained(1, "x")}, false).code(),
            absl::StatusCode::kNotFound);
  const uint64_t dense = MakeDataset("dense", DatasetKind::kDense);
  EXPECT_EQ(PutExplanations(*store_, dense, {Explained(1, "x")}, false).code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(SearchExplanations(*store_, dense, "", 10).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST_F(LatentExplanationsTest, ADamagedValueIsDataLossNamingTheLatent) {
  ASSERT_TRUE(PutExplanations(*store_, id_, {Explained(12, "quotes")}, false).ok());
  ASSERT_TRUE(db_->Put(Family::kMeta, keys::Explanation(id_, 12), "\x01\x01", true).ok());
  auto got = GetExplanation(*store_, id_, 12);
  EXPECT_EQ(got.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(got.status().message().find("latent 12 of dataset"), std::string::npos);
  EXPECT_EQ(SearchExplanations(*store_, id_, "", 10).status().code(), absl::StatusCode::kDataLoss);
  // A score that is not a number can only come from damage (puts refuse one): the ranking
  // would have no order with it.
  ASSERT_TRUE(PutExplanations(*store_, id_, {Explained(12, "quotes", 0.5)}, false).ok());
  auto value = db_->Get(Family::kMeta, keys::Explanation(id_, 12));
  ASSERT_TRUE(value.ok()) << value.status();
  const double nan = std::numeric_limits<double>::quiet_NaN();
  value->replace(2, sizeof(nan), reinterpret_cast<const char*>(&nan),
                 sizeof(nan));  // version, flag
  ASSERT_TRUE(db_->Put(Family::kMeta, keys::Explanation(id_, 12), *value, true).ok());
  EXPECT_EQ(GetExplanation(*store_, id_, 12).status().code(), absl::StatusCode::kDataLoss);
}

TEST_F(LatentExplanationsTest, AWideSearchKeepsTheBestInOrder) {
  // More matches than twice the limit: the list is cut back while searching, and what is left
  // is the best `limit` in order (scored by score, ties and the unscored by latent).
  std::vector<LatentExplanation> all;
  for (int32_t latent = 0; latent < 100; ++latent) {
    std::optional<double> score;
    if (latent % 3 != 0) score = (latent * 37 % 11) / 10.0;  // repeats: ties broken by latent
    all.push_back(Explained(latent, "a word", score));
  }
  ASSERT_TRUE(PutExplanations(*store_, id_, all, false).ok());
  std::vector<LatentExplanation> want = all;
  std::sort(want.begin(), want.end(), [](const LatentExplanation& a, const LatentExplanation& b) {
    if (a.score.has_value() != b.score.has_value()) return a.score.has_value();
    if (a.score != b.score) return *a.score > *b.score;
    return a.latent < b.latent;
  });
  for (int32_t limit : {1, 7, 66, 67, 100}) {
    std::vector<int32_t> first;
    for (int32_t i = 0; i < limit; ++i) first.push_back(want[i].latent);
    EXPECT_EQ(Found("word", limit), first) << limit;
  }
}

TEST_F(LatentExplanationsTest, ADatasetOfTheSameSaeTakesTheExplanationsOver) {
  const std::string sae = "crc32c:0badcafe:4096";
  const uint64_t first = MakeDataset("first", DatasetKind::kSparse, sae);
  const uint64_t more = MakeDataset("more tokens", DatasetKind::kSparse, sae);
  ASSERT_TRUE(PutExplanations(*store_, first,
                              {Explained(1, "French words", 0.8, "delphi"), Explained(2, "digits")},
                              false)
                  .ok());
  ASSERT_TRUE(
      PutExplanations(*store_, more, {Explained(1, "mine"), Explained(3, "kept")}, false).ok());
  // Each copied explanation replaces its latent's; the others stay.
  auto copied = CopyExplanations(*store_, first, more, /*replace_all=*/false);
  ASSERT_TRUE(copied.ok()) << copied.status();
  EXPECT_EQ(*copied, 2);
  auto one = GetExplanation(*store_, more, 1);
  ASSERT_TRUE(one.ok() && one->has_value());
  EXPECT_EQ((*one)->text, "French words");
  EXPECT_EQ((*one)->score, 0.8);
  EXPECT_EQ((*one)->source, "delphi");
  EXPECT_EQ(*CountExplanations(*store_, more), 3);
  // replace_all: the copy alone; the source keeps its own.
  ASSERT_TRUE(CopyExplanations(*store_, first, more, /*replace_all=*/true).ok());
  EXPECT_EQ(*CountExplanations(*store_, more), 2);
  EXPECT_FALSE(GetExplanation(*store_, more, 3)->has_value());
  EXPECT_EQ(*CountExplanations(*store_, first), 2);

  // Only between datasets known to be of one SAE.
  const auto refused = [&](uint64_t from, uint64_t to, absl::StatusCode code,
                           const std::string& says) {
    auto got = CopyExplanations(*store_, from, to, false);
    EXPECT_EQ(got.status().code(), code) << got.status();
    EXPECT_NE(got.status().message().find(says), std::string::npos) << got.status();
  };
  refused(first, MakeDataset("other sae", DatasetKind::kSparse, "crc32c:12345678:4096"),
          absl::StatusCode::kFailedPrecondition, "(crc32c:12345678:4096, 100 latents)");
  refused(first, MakeDataset("wider", DatasetKind::kSparse, sae, 200),
          absl::StatusCode::kFailedPrecondition, "200 latents");
  const uint64_t unrecorded = MakeDataset("old", DatasetKind::kSparse);
  refused(unrecorded, unrecorded, absl::StatusCode::kFailedPrecondition, "itself");
  refused(first, unrecorded, absl::StatusCode::kFailedPrecondition, "not recorded");
  refused(unrecorded, first, absl::StatusCode::kFailedPrecondition, "not recorded");
  refused(first + 500, more, absl::StatusCode::kNotFound, "from_dataset_id");
  refused(MakeDataset("dense", DatasetKind::kDense), more, absl::StatusCode::kFailedPrecondition,
          "");
  // A damaged explanation of the source stops the copy before anything is written.
  ASSERT_TRUE(db_->Put(Family::kMeta, keys::Explanation(first, 2), "\x01", true).ok());
  refused(first, more, absl::StatusCode::kDataLoss, "latent 2 of dataset");
  EXPECT_EQ(*CountExplanations(*store_, more), 2);
  EXPECT_EQ(GetExplanation(*store_, more, 2)->value().text, "digits");
}

TEST_F(LatentExplanationsTest, DeletingTheDatasetDeletesItsExplanations) {
  const uint64_t other = MakeDataset("other", DatasetKind::kSparse);
  ASSERT_TRUE(PutExplanations(*store_, id_, {Explained(1, "a"), Explained(2, "b")}, false).ok());
  ASSERT_TRUE(PutExplanations(*store_, other, {Explained(1, "kept")}, false).ok());
  ASSERT_TRUE(store_->DeleteDataset(id_).ok());
  const std::string prefix = keys::ExplanationPrefix(id_);
  auto it = db_->NewIterator(Family::kMeta);
  it->Seek(prefix);
  EXPECT_FALSE(it->Valid() && it->key().starts_with(prefix)) << "an explanation outlived it";
  EXPECT_EQ((*GetExplanation(*store_, other, 1))->text, "kept");
}

}  // namespace
}  // namespace latentd::storage
