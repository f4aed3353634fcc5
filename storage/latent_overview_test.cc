#include "storage/latent_overview.h"

#include <algorithm>
#include <cmath>
#include <memory>
#include <tuple>

#include "common/test_dir.h"
#include "gtest/gtest.h"

namespace latentd::storage {
namespace {

constexpr int32_t kWidth = 300;
constexpr int64_t kRows = 22;

// Latent l fires in rows [0, l % 23) with value (l % 7 + 1) + row / 64 (exact in fp32): firing
// counts 0..22 (22 = every row), maxima and means that tie across latents, 14 dead latents.
int64_t Count(int32_t l) { return l % 23; }
float Value(int32_t l, int64_t row) { return static_cast<float>(l % 7 + 1) + row / 64.0f; }

DatasetMeta Meta(const std::string& name, DatasetKind kind, ValueDtype dtype, int32_t width) {
  DatasetMeta m;
  m.name = name;
  m.kind = kind;
  m.value_dtype = dtype;
  m.width = width;
  return m;
}

class LatentOverviewTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto db = Db::Open(FreshTestDir("latent_overview"), DbOptions());
    ASSERT_TRUE(db.ok()) << db.status();
    db_ = *std::move(db);
    ChunkStoreOptions so;
    so.sparse_chunk_rows = 8;
    store_ = std::make_unique<ChunkStore>(db_.get(), so);
    DatasetMeta m = Meta("sae", DatasetKind::kSparse, ValueDtype::kFloat32, kWidth);
    m.encoder = "relu";
    m.context_length = 11;
    auto id = store_->CreateDataset(m);
    ASSERT_TRUE(id.ok()) << id.status();
    id_ = *id;
    std::vector<int64_t> indptr{0};
    std::vector<int32_t> indices, tokens;
    std::vector<float> values;
    for (int64_t r = 0; r < kRows; ++r) {
      for (int32_t l = 0; l < kWidth; ++l) {
        if (r < Count(l)) indices.push_back(l), values.push_back(Value(l, r));
      }
      indptr.push_back(static_cast<int64_t>(indices.size()));
      tokens.push_back(static_cast<int32_t>(r));
    }
    auto w = store_->OpenWriter(id_);
    ASSERT_TRUE(w.ok()) << w.status();
    ASSERT_TRUE(
        (*w)->AppendSparse(kRows, indptr.data(), indices.data(), values.data(), tokens.data())
            .ok());
    ASSERT_TRUE((*w)->Commit().ok());
  }

  // Every latent's summary as the rows define it, independently of the store.
  static std::vector<LatentSummary> Expected() {
    std::vector<LatentSummary> all;
    for (int32_t l = 0; l < kWidth; ++l) {
      LatentSummary s;
      s.latent = l;
      s.firing_count = Count(l);
      double sum = 0;
      for (int64_t r = 0; r < Count(l); ++r) sum += Value(l, r), s.max = Value(l, r);
      s.mean = Count(l) > 0 ? sum / Count(l) : 0;
      all.push_back(s);
    }
    return all;
  }

  std::unique_ptr<Db> db_;
  std::unique_ptr<ChunkStore> store_;
  uint64_t id_ = 0;
};

void ExpectSame(const std::vector<LatentSummary>& got, const std::vector<LatentSummary>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(got[i].latent, want[i].latent) << "position " << i;
    EXPECT_EQ(got[i].firing_count, want[i].firing_count) << "latent " << want[i].latent;
    EXPECT_NEAR(got[i].mean, want[i].mean, 1e-9) << "latent " << want[i].latent;
    EXPECT_EQ(got[i].max, want[i].max) << "latent " << want[i].latent;
  }
}

TEST_F(LatentOverviewTest, EveryOrderRanksAllLatentsAndPagesTileIt) {
  const std::vector<LatentSummary> all = Expected();
  // Sort keys, ties by latent index; latents that never fired have no max or mean and go last.
  auto key = [](LatentOrder order, const LatentSummary& s) {
    const bool dead = s.firing_count == 0;
    switch (order) {
      case LatentOrder::kMostFrequent:
        return std::make_tuple(false, -static_cast<double>(s.firing_count), s.latent);
      case LatentOrder::kLeastFrequent:
        return std::make_tuple(false, static_cast<double>(s.firing_count), s.latent);
      case LatentOrder::kHighestMax:
        return std::make_tuple(dead, -static_cast<double>(s.max), s.latent);
      case LatentOrder::kHighestMean:
        return std::make_tuple(dead, -s.mean, s.latent);
      case LatentOrder::kByLatent:
        break;
    }
    return std::make_tuple(false, 0.0, s.latent);
  };
  for (LatentOrder order :
       {LatentOrder::kByLatent, LatentOrder::kMostFrequent, LatentOrder::kLeastFrequent,
        LatentOrder::kHighestMax, LatentOrder::kHighestMean}) {
    SCOPED_TRACE(static_cast<int>(order));
    std::vector<LatentSummary> want = all;
    std::sort(want.begin(), want.end(), [&](const LatentSummary& a, const LatentSummary& b) {
      return key(order, a) < key(order, b);
    });
    LatentOverviewOptions o;
    o.order = order;
    o.limit = kWidth;
    auto whole = SummarizeLatents(*store_, id_, o);
    ASSERT_TRUE(whole.ok()) << whole.status();
    EXPECT_EQ(whole->rows, kRows);
    EXPECT_EQ(whole->width, kWidth);
    EXPECT_EQ(whole->matching, kWidth);
    ExpectSame(whole->latents, want);
    // Pages of 37 (not a divisor of 300) put together are the whole ranking, none repeated.
    std::vector<LatentSummary> paged;
    o.limit = 37;
    for (o.offset = 0; o.offset < kWidth + 37; o.offset += 37) {
      auto page = SummarizeLatents(*store_, id_, o);
      ASSERT_TRUE(page.ok()) << page.status();
      paged.insert(paged.end(), page->latents.begin(), page->latents.end());
    }
    ExpectSame(paged, want);
  }
}

TEST_F(LatentOverviewTest, FiringCountFilterFindsDeadAndRareLatents) {
  LatentOverviewOptions o;
  o.max_firing_count = 0;
  o.limit = 1000;
  auto dead = SummarizeLatents(*store_, id_, o);
  ASSERT_TRUE(dead.ok()) << dead.status();
  std::vector<int32_t> want_dead;
  for (int32_t l = 0; l < kWidth; ++l) {
    if (Count(l) == 0) want_dead.push_back(l);
  }
  EXPECT_EQ(dead->dead, static_cast<int64_t>(want_dead.size()));
  EXPECT_EQ(dead->matching, dead->dead);
  ASSERT_EQ(dead->latents.size(), want_dead.size());
  for (size_t i = 0; i < want_dead.size(); ++i) EXPECT_EQ(dead->latents[i].latent, want_dead[i]);
  EXPECT_EQ(store_->GetDataset(id_)->dead_latents(), dead->dead);

  o.min_firing_count = 3;
  o.max_firing_count = 5;
  o.order = LatentOrder::kMostFrequent;
  auto rare = SummarizeLatents(*store_, id_, o);
  ASSERT_TRUE(rare.ok()) << rare.status();
  int64_t want_matching = 0;
  for (int32_t l = 0; l < kWidth; ++l) want_matching += Count(l) >= 3 && Count(l) <= 5;
  EXPECT_EQ(rare->matching, want_matching);
  ASSERT_EQ(static_cast<int64_t>(rare->latents.size()), want_matching);
  EXPECT_EQ(rare->latents.front().firing_count, 5);
  EXPECT_EQ(rare->latents.back().firing_count, 3);
}

TEST_F(LatentOverviewTest, DensityHistogramBinsEveryLiveLatentByItsLog10Density) {
  LatentOverviewOptions o;
  o.density_bins = 10;
  auto got = SummarizeLatents(*store_, id_, o);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_DOUBLE_EQ(got->log10_density_min, -std::log10(static_cast<double>(kRows)));
  ASSERT_EQ(got->log10_density_histogram.size(), 10u);
  // Bin b holds [min + b * w, min + (b + 1) * w) with w = -min / 10; the last also holds 0.
  std::vector<int64_t> want(10, 0);
  const double w = -got->log10_density_min / 10;
  for (int32_t l = 0; l < kWidth; ++l) {
    if (Count(l) == 0) continue;
    const double x = std::log10(static_cast<double>(Count(l)) / kRows);
    int b = 0;
    while (b < 9 && x >= got->log10_density_min + (b + 1) * w - 1e-12) ++b;
    ++want[b];
  }
  EXPECT_EQ(got->log10_density_histogram, want);
  EXPECT_EQ(got->log10_density_histogram.front(), 13);  // latents firing once: density 1 / rows
  EXPECT_GE(got->log10_density_histogram.back(), 13);   // latents firing on every row included
}

TEST_F(LatentOverviewTest, BadOptionsNameTheFieldAndBadDatasetsAreRefused) {
  auto error_message = [&](LatentOverviewOptions o) {
    auto got = SummarizeLatents(*store_, id_, o);
    return got.ok() ? std::string("OK") : std::string(got.status().message());
  };
  LatentOverviewOptions o;
  o.limit = 0;
  EXPECT_NE(error_message(o).find("limit"), std::string::npos);
  o = {};
  o.limit = kMaxLatentPage + 1;
  EXPECT_NE(error_message(o).find("limit"), std::string::npos);
  o = {};
  o.offset = -1;
  EXPECT_NE(error_message(o).find("offset"), std::string::npos);
  o = {};
  o.order = LatentOrder::kMostFrequent;
  o.offset = kMaxLatentRank;
  EXPECT_NE(error_message(o).find("offset"), std::string::npos);
  o.order = LatentOrder::kByLatent;  // latent order pages anywhere: an empty page past the end
  auto far = SummarizeLatents(*store_, id_, o);
  ASSERT_TRUE(far.ok()) << far.status();
  EXPECT_TRUE(far->latents.empty());
  EXPECT_EQ(far->matching, kWidth);
  o = {};
  o.min_firing_count = 4;
  o.max_firing_count = 3;
  EXPECT_NE(error_message(o).find("max_firing_count"), std::string::npos);
  o = {};
  o.density_bins = 0;
  EXPECT_NE(error_message(o).find("density_bins"), std::string::npos);
  o = {};
  o.order = static_cast<LatentOrder>(99);
  EXPECT_NE(error_message(o).find("order"), std::string::npos);
  EXPECT_EQ(SummarizeLatents(*store_, id_ + 1, {}).status().code(), absl::StatusCode::kNotFound);

  auto dense_id =
      store_->CreateDataset(Meta("dense", DatasetKind::kDense, ValueDtype::kFloat32, 4));
  ASSERT_TRUE(dense_id.ok());
  EXPECT_EQ(SummarizeLatents(*store_, *dense_id, {}).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST_F(LatentOverviewTest, EmptyDatasetHasEveryLatentDeadAndNoHistogram) {
  auto id = store_->CreateDataset(Meta("empty", DatasetKind::kSparse, ValueDtype::kFloat16, 70));
  ASSERT_TRUE(id.ok());
  auto got = SummarizeLatents(*store_, *id, {});
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->rows, 0);
  EXPECT_EQ(got->width, 70);
  EXPECT_EQ(got->dead, 70);
  EXPECT_TRUE(got->log10_density_histogram.empty());
  EXPECT_EQ(got->latents.size(), 70u);
}

}  // namespace
}  // namespace latentd::storage
