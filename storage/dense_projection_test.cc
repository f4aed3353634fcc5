#include "storage/dense_projection.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <memory>
#include <numeric>
#include <random>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "common/test_dir.h"
#include "gtest/gtest.h"

namespace latentd::storage {
namespace {

constexpr int32_t kWidth = 16;
constexpr int32_t kContext = 10;
constexpr int64_t kRows = 300;

// Rows of normal values, but for row 40 (every value 100: the largest dot product with e0 by
// far, a cosine of only 1/4) and row 41 (5 e0: cosine 1).
std::vector<float> MakeRows() {
  std::mt19937 rng(3);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> rows(kRows * kWidth);
  for (float& v : rows) v = normal(rng);
  std::fill(rows.begin() + 40 * kWidth, rows.begin() + 41 * kWidth, 100.0f);
  std::fill(rows.begin() + 41 * kWidth, rows.begin() + 42 * kWidth, 0.0f);
  rows[41 * kWidth] = 5.0f;
  return rows;
}

class DenseProjectionTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto db = Db::Open(FreshTestDir("dense_projection"), DbOptions());
    ASSERT_TRUE(db.ok()) << db.status();
    db_ = *std::move(db);
    ChunkStoreOptions so;
    so.chunk_rows = 64;  // several chunks
    store_ = std::make_unique<ChunkStore>(db_.get(), so);
    DatasetMeta m;
    m.name = "hidden states";
    m.kind = DatasetKind::kDense;
    m.value_dtype = ValueDtype::kFloat32;
    m.width = kWidth;
    m.context_length = kContext;
    id_ = *store_->CreateDataset(m);
    auto w = store_->OpenWriter(id_);
    ASSERT_TRUE(w.ok()) << w.status();
    std::vector<int32_t> tokens(kRows);
    std::iota(tokens.begin(), tokens.end(), 1000);
    ASSERT_TRUE((*w)->AppendDense(kRows, rows_.data(), tokens.data()).ok());
    ASSERT_TRUE((*w)->Commit().ok());
  }

  // Row r's projection on `direction`, in double.
  double Reference(int64_t r, const std::vector<float>& direction, bool cosine) const {
    double dot = 0, squares = 0, norm = 0;
    for (int32_t k = 0; k < kWidth; ++k) {
      dot += static_cast<double>(rows_[r * kWidth + k]) * direction[k];
      squares += static_cast<double>(rows_[r * kWidth + k]) * rows_[r * kWidth + k];
      norm += static_cast<double>(direction[k]) * direction[k];
    }
    if (!cosine) return dot;
    return squares > 0 ? dot / std::sqrt(squares * norm) : 0;
  }

  // The answer's lists are the rows' projections ranked, each with its window clipped to its
  // sequence and the scanned rows, and the statistics are those of every scanned row.
  void ExpectAsRecomputed(const Projection& got, const std::vector<float>& direction,
                          const ProjectionOptions& o) {
    const bool cosine = o.measure == ProjectionMeasure::kCosine;
    const int64_t start = o.row_start, end = o.row_count > 0 ? start + o.row_count : kRows;
    std::vector<int64_t> rows(end - start);
    std::iota(rows.begin(), rows.end(), start);
    std::vector<double> p(kRows);
    for (int64_t r : rows) p[r] = Reference(r, direction, cosine);
    EXPECT_EQ(got.rows, end - start);
    double mean = 0;
    for (int64_t r : rows) mean += p[r] / rows.size();
    double variance = 0;
    for (int64_t r : rows) variance += (p[r] - mean) * (p[r] - mean) / rows.size();
    EXPECT_NEAR(got.mean, mean, 1e-4);
    EXPECT_NEAR(got.stddev, std::sqrt(variance), 1e-4);
    EXPECT_EQ(std::accumulate(got.histogram.begin(), got.histogram.end(), int64_t{0}), got.rows);
    EXPECT_EQ(static_cast<int32_t>(got.histogram.size()), o.bins);
    EXPECT_GT(got.histogram.front(), 0);  // the minimum's
    EXPECT_GT(got.histogram.back(), 0);   // the maximum's
    // Each bin as recounted from the float64 projections over [min, max] (a row within rounding
    // of a bin edge may fall on either side of it).
    const auto [lo, hi] = std::minmax_element(rows.begin(), rows.end(),
                                              [&](int64_t a, int64_t b) { return p[a] < p[b]; });
    EXPECT_NEAR(got.min, p[*lo], 1e-4 * (1 + std::abs(p[*lo])));
    EXPECT_NEAR(got.max, p[*hi], 1e-4 * (1 + std::abs(p[*hi])));
    std::vector<int64_t> recounted(o.bins, 0);
    for (int64_t r : rows) {
      const double at = (p[r] - p[*lo]) / (p[*hi] - p[*lo]) * o.bins;
      ++recounted[std::min<int64_t>(static_cast<int64_t>(at), o.bins - 1)];
    }
    int64_t moved = 0;
    for (int32_t b = 0; b < o.bins; ++b) moved += std::abs(got.histogram[b] - recounted[b]);
    EXPECT_LE(moved, 2) << "bins differ beyond an edge row";
    for (const bool largest : {true, false}) {
      std::vector<int64_t> ranked = rows;
      if (o.distinct_sequences) {  // each sequence's extreme row alone
        ranked.clear();
        for (int64_t r = start; r < end;) {
          const int64_t sequence_end = std::min(end, (r / kContext + 1) * kContext);
          int64_t best = r;
          for (int64_t q = r; q < sequence_end; ++q) {
            if (largest ? p[q] > p[best] : p[q] < p[best]) best = q;
          }
          ranked.push_back(best);
          r = sequence_end;
        }
      }
      std::stable_sort(ranked.begin(), ranked.end(),
                       [&](int64_t a, int64_t b) { return largest ? p[a] > p[b] : p[a] < p[b]; });
      ranked.resize(std::min<size_t>(ranked.size(), o.top_n));
      const std::vector<TopActivationContext>& list = largest ? got.largest : got.smallest;
      ASSERT_EQ(list.size(), ranked.size());
      for (size_t i = 0; i < list.size(); ++i) {
        const TopActivationContext& t = list[i];
        EXPECT_EQ(t.row, ranked[i]) << (largest ? "largest " : "smallest ") << i;
        EXPECT_NEAR(t.value, p[t.row], 1e-4 * (1 + std::abs(p[t.row])));
        EXPECT_EQ(t.token_id, 1000 + t.row);
        const int64_t first =
            std::max({t.row - o.context_before, t.row / kContext * kContext, start});
        const int64_t last =
            std::min({t.row + o.context_after, (t.row / kContext + 1) * kContext - 1, end - 1});
        EXPECT_EQ(t.context_start_row, first);
        ASSERT_EQ(static_cast<int64_t>(t.context_token_ids.size()), last - first + 1);
        ASSERT_EQ(t.context_values.size(), t.context_token_ids.size());
        for (int64_t r = first; r <= last; ++r) {
          EXPECT_EQ(t.context_token_ids[r - first], 1000 + r);
          EXPECT_NEAR(t.context_values[r - first], p[r], 1e-4 * (1 + std::abs(p[r])));
        }
      }
    }
  }

  const std::vector<float> rows_ = MakeRows();
  std::unique_ptr<Db> db_;
  std::unique_ptr<ChunkStore> store_;
  uint64_t id_ = 0;
};

std::vector<float> UnitVector(int32_t k) {
  std::vector<float> v(kWidth, 0.0f);
  v[k] = 1.0f;
  return v;
}

TEST_F(DenseProjectionTest, DotProductsRankTheRowsWithTheirContexts) {
  ProjectionOptions o;
  o.top_n = 7;
  o.context_before = 3;
  o.context_after = 2;
  auto got = ProjectDenseRows(*store_, id_, UnitVector(0), o);
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_FALSE(got->largest.empty());
  EXPECT_EQ(got->largest[0].row, 40);  // outsized norm
  EXPECT_FLOAT_EQ(got->max, 100.0f);
  ExpectAsRecomputed(*got, UnitVector(0), o);
  // Any direction, its scale kept.
  std::vector<float> direction(kWidth);
  for (int32_t k = 0; k < kWidth; ++k) direction[k] = 0.5f * (k % 3) - 0.4f;
  got = ProjectDenseRows(*store_, id_, direction, o);
  ASSERT_TRUE(got.ok()) << got.status();
  ExpectAsRecomputed(*got, direction, o);
}

TEST_F(DenseProjectionTest, CosineIsBlindToARowsNorm) {
  ProjectionOptions o;
  o.measure = ProjectionMeasure::kCosine;
  o.top_n = 5;
  o.bins = 10;
  auto got = ProjectDenseRows(*store_, id_, UnitVector(0), o);
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_FALSE(got->largest.empty());
  EXPECT_EQ(got->largest[0].row, 41);  // along e0 exactly
  EXPECT_NEAR(got->largest[0].value, 1.0f, 1e-6);
  for (const TopActivationContext& t : got->largest) EXPECT_NE(t.row, 40);  // cosine 1/4
  ExpectAsRecomputed(*got, UnitVector(0), o);
}

TEST_F(DenseProjectionTest, DistinctSequencesAndARowRange) {
  ProjectionOptions o;
  o.distinct_sequences = true;
  o.top_n = 4;
  o.row_start = 95;  // mid-sequence: its first sequence is cut, as are the windows
  o.row_count = 100;
  o.context_before = 8;
  o.context_after = 8;
  auto got = ProjectDenseRows(*store_, id_, UnitVector(3), o);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->rows, 100);
  std::set<int64_t> sequences;
  for (const TopActivationContext& t : got->largest) {
    EXPECT_TRUE(sequences.insert(t.row / kContext).second) << t.row;
    EXPECT_GE(t.context_start_row, 95);
  }
  ExpectAsRecomputed(*got, UnitVector(3), o);
  // More rows asked than sequences: one per sequence, every sequence once.
  o.top_n = 1000;
  got = ProjectDenseRows(*store_, id_, UnitVector(3), o);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->largest.size(), 11u);  // rows 95..194: 5 of one sequence, 9 whole, 5 of one
  ExpectAsRecomputed(*got, UnitVector(3), o);
}

TEST_F(DenseProjectionTest, BadInputIsRefusedNamingTheField) {
  const auto refused = [&](uint64_t id, const std::vector<float>& direction,
                           const ProjectionOptions& o, absl::StatusCode code,
                           const std::string& says) {
    auto got = ProjectDenseRows(*store_, id, direction, o);
    ASSERT_FALSE(got.ok()) << says;
    EXPECT_EQ(got.status().code(), code) << got.status();
    EXPECT_NE(got.status().message().find(says), std::string::npos) << got.status();
  };
  const ProjectionOptions o;
  refused(id_, std::vector<float>(3, 1.0f), o, absl::StatusCode::kInvalidArgument,
          "direction: 3 values; the dataset's rows have 16");
  std::vector<float> bad = UnitVector(0);
  bad[5] = std::numeric_limits<float>::quiet_NaN();
  refused(id_, bad, o, absl::StatusCode::kInvalidArgument, "direction[5]");
  refused(id_, std::vector<float>(kWidth, 0.0f), o, absl::StatusCode::kInvalidArgument,
          "all zeros");
  for (const auto& [field, set] :
       std::vector<std::pair<std::string, std::function<void(ProjectionOptions*)>>>{
           {"top_n", [](ProjectionOptions* p) { p->top_n = 0; }},
           {"top_n", [](ProjectionOptions* p) { p->top_n = kMaxProjectionTop + 1; }},
           {"bins", [](ProjectionOptions* p) { p->bins = 0; }},
           {"context_before", [](ProjectionOptions* p) { p->context_before = -1; }},
           {"context_after", [](ProjectionOptions* p) { p->context_after = 2000; }},
       }) {
    ProjectionOptions wrong;
    set(&wrong);
    refused(id_, UnitVector(0), wrong, absl::StatusCode::kInvalidArgument, field + ": ");
  }
  ProjectionOptions past;
  past.row_start = 250;
  past.row_count = 100;
  refused(id_, UnitVector(0), past, absl::StatusCode::kOutOfRange, "");
  refused(id_ + 9, UnitVector(0), o, absl::StatusCode::kNotFound, "");
  DatasetMeta m;
  m.name = "latents";
  m.kind = DatasetKind::kSparse;
  m.width = kWidth;
  m.encoder = "relu";
  refused(*store_->CreateDataset(m), UnitVector(0), o, absl::StatusCode::kFailedPrecondition,
          "SPARSE");
}

}  // namespace
}  // namespace latentd::storage
