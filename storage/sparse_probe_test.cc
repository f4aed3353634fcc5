#include "storage/sparse_probe.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <memory>
#include <numeric>
#include <random>
#include <set>
#include <string>
#include <utility>

#include "common/test_dir.h"
#include "gtest/gtest.h"

namespace latentd::storage {
namespace {

// Logistic fits on dense data written as sparse rows.
LabelledExamples Dense(const std::vector<std::vector<double>>& x, const std::vector<int>& y) {
  LabelledExamples out;
  for (size_t i = 0; i < x.size(); ++i) {
    for (size_t c = 0; c < x[i].size(); ++c) {
      out.columns.push_back(static_cast<int32_t>(c));
      out.values.push_back(x[i][c]);
    }
    out.indptr.push_back(static_cast<int64_t>(out.columns.size()));
    out.labels.push_back(static_cast<uint8_t>(y[i]));
  }
  return out;
}

double Sigmoid(double z) { return 1.0 / (1.0 + std::exp(-z)); }

TEST(FitLogisticTest, ThePenalizedLossIsStationaryAtTheAnswer) {
  std::mt19937_64 rng(0);
  std::normal_distribution<double> normal;
  std::vector<std::vector<double>> x(500, std::vector<double>(3));
  std::vector<int> y(500);
  for (int i = 0; i < 500; ++i) {
    // Columns of different scales: the penalty acts on the standardized weights.
    x[i] = {normal(rng), 3.0 * normal(rng), 0.5 * normal(rng)};
    y[i] = 2.0 * x[i][0] - x[i][1] / 3 + x[i][2] + 0.3 + 0.5 * normal(rng) > 0;
  }
  const LabelledExamples examples = Dense(x, y);
  std::vector<double> scale(3);
  for (int c = 0; c < 3; ++c) {
    double sum = 0, sum_sq = 0;
    for (const auto& row : x) sum += row[c], sum_sq += row[c] * row[c];
    scale[c] = std::sqrt(sum_sq / 500 - (sum / 500) * (sum / 500));
  }
  for (double l2 : {0.1, 1.0, 10.0}) {
    const LogisticFit fit = FitLogistic(examples, 3, l2);
    // d/dw_c of the loss in raw units: sum (p - y) x_c + l2 s_c^2 w_c; d/db: sum (p - y).
    std::vector<double> gradient(3, 0.0);
    double intercept_gradient = 0;
    for (int i = 0; i < 500; ++i) {
      double z = fit.intercept;
      for (int c = 0; c < 3; ++c) z += fit.weights[c] * x[i][c];
      const double residual = Sigmoid(z) - y[i];
      intercept_gradient += residual;
      for (int c = 0; c < 3; ++c) gradient[c] += residual * x[i][c];
    }
    for (int c = 0; c < 3; ++c) {
      EXPECT_LT(std::abs(gradient[c] + l2 * scale[c] * scale[c] * fit.weights[c]), 1e-8)
          << "l2 " << l2 << " column " << c;
    }
    EXPECT_LT(std::abs(intercept_gradient), 1e-8);
    EXPECT_GT(fit.weights[0], 0);
    EXPECT_LT(fit.weights[1], 0);
    EXPECT_GT(fit.weights[2], 0);
    EXPECT_LT(fit.iterations, 30);
  }
  // A stronger penalty shrinks the (standardized) weights.
  const auto norm = [&](const LogisticFit& f) {
    double sq = 0;
    for (int c = 0; c < 3; ++c) sq += std::pow(f.weights[c] * scale[c], 2);
    return std::sqrt(sq);
  };
  EXPECT_LT(norm(FitLogistic(examples, 3, 100.0)), norm(FitLogistic(examples, 3, 0.1)));
}

TEST(FitLogisticTest, BalancedWeighsTheRareClassUp) {
  // 50 positives among 1000, one overlapping feature: unweighted, the fit calls few positives.
  std::mt19937_64 rng(1);
  std::normal_distribution<double> normal;
  std::vector<std::vector<double>> x;
  std::vector<int> y;
  for (int i = 0; i < 1000; ++i) {
    y.push_back(i < 50);
    x.push_back({normal(rng) + (i < 50 ? 1.5 : 0.0)});
  }
  const LabelledExamples examples = Dense(x, y);
  const auto recall = [&](const LogisticFit& f) {
    int hit = 0;
    for (int i = 0; i < 50; ++i) hit += f.weights[0] * x[i][0] + f.intercept > 0;
    return hit / 50.0;
  };
  const LogisticFit plain = FitLogistic(examples, 1, 1.0);
  const LogisticFit balanced = FitLogistic(examples, 1, 1.0, /*balanced=*/true);
  EXPECT_GT(recall(balanced), recall(plain) + 0.3);
  // Stationary for the weighted loss: each class weighs n / (2 n_class).
  double sum = 0, sum_sq = 0;
  for (const auto& row : x) sum += row[0], sum_sq += row[0] * row[0];
  const double scale_sq = sum_sq / 1000 - (sum / 1000) * (sum / 1000);
  double gradient = 0, intercept_gradient = 0;
  for (int i = 0; i < 1000; ++i) {
    const double weight = y[i] ? 1000.0 / 100 : 1000.0 / 1900;
    const double residual =
        weight * (Sigmoid(balanced.weights[0] * x[i][0] + balanced.intercept) - y[i]);
    gradient += residual * x[i][0];
    intercept_gradient += residual;
  }
  EXPECT_LT(std::abs(gradient + 1.0 * scale_sq * balanced.weights[0]), 1e-8);
  EXPECT_LT(std::abs(intercept_gradient), 1e-8);
}

TEST(FitLogisticTest, LaterColumnsAreLeftOutAndSeparableClassesStayFinite) {
  std::vector<std::vector<double>> x;
  std::vector<int> y;
  for (int i = 0; i < 60; ++i) {
    // Column 0 separates the classes exactly; column 1 is noise the two-column fit must ignore.
    x.push_back({i < 50 ? 0.0 : 0.01 * (i - 49), std::sin(i * 1.7)});
    y.push_back(i >= 50);
  }
  const LogisticFit one = FitLogistic(Dense(x, y), 1, 1.0);
  ASSERT_EQ(one.weights.size(), 1u);
  EXPECT_TRUE(std::isfinite(one.weights[0]) && std::isfinite(one.intercept));
  EXPECT_GT(one.weights[0], 0);
  for (auto& row : x) row.pop_back();
  const LogisticFit without = FitLogistic(Dense(x, y), 1, 1.0);
  EXPECT_EQ(one.weights, without.weights);
  EXPECT_EQ(one.intercept, without.intercept);
  // No columns: the intercept alone, the log-odds of the classes (10 of 60 positive).
  EXPECT_NEAR(FitLogistic(Dense(x, y), 0, 1.0).intercept, std::log(10.0 / 50.0), 1e-9);
}

// A dataset of sequences of kContext rows; a sequence is positive when (s / 3) % 2 == 0 (runs of
// three). Latent 7 fires on 90% of the positive rows and 5% of the negative ones, latent 9 on 30%
// and 10%, latent 3 marks the negatives (15% of their rows, 2% of the positives'), latents
// 10..39 fire at random everywhere.
constexpr int32_t kWidth = 40;
constexpr int32_t kContext = 48;  // 16384 rows (a read window) is not a whole number of them
constexpr int64_t kSequences = 1000;
constexpr int64_t kRows = kSequences * kContext;

bool PositiveSequence(int64_t s) { return (s / 3) % 2 == 0; }

std::vector<std::map<int32_t, float>> MakeRows() {
  std::mt19937 rng(5);
  std::mt19937 negative_marks(11);
  std::uniform_real_distribution<float> unit(0.0f, 1.0f);
  std::vector<std::map<int32_t, float>> rows(kRows);
  for (int64_t r = 0; r < kRows; ++r) {
    const bool positive = PositiveSequence(r / kContext);
    if (unit(negative_marks) < (positive ? 0.02f : 0.15f)) rows[r][3] = 0.4f;
    if (unit(rng) < (positive ? 0.9f : 0.05f)) rows[r][7] = positive ? 1 + unit(rng) : 0.3f;
    if (unit(rng) < (positive ? 0.3f : 0.1f)) rows[r][9] = 0.5f + unit(rng);
    for (int n = static_cast<int>(rng() % 4); n > 0; --n) {
      rows[r][10 + static_cast<int32_t>(rng() % 30)] = 0.1f + unit(rng);
    }
  }
  return rows;
}

class SparseProbeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto db = Db::Open(FreshTestDir("sparse_probe"), DbOptions());
    ASSERT_TRUE(db.ok()) << db.status();
    db_ = *std::move(db);
    ChunkStoreOptions so;
    so.sparse_chunk_rows = 1000;
    so.latent_slices = 4;
    store_ = std::make_unique<ChunkStore>(db_.get(), so);
    DatasetMeta m;
    m.name = "sae";
    m.kind = DatasetKind::kSparse;
    m.value_dtype = ValueDtype::kFloat32;
    m.width = kWidth;
    m.context_length = kContext;
    m.encoder = "relu";
    auto id = store_->CreateDataset(m);
    ASSERT_TRUE(id.ok()) << id.status();
    id_ = *id;
    auto w = store_->OpenWriter(id_);
    ASSERT_TRUE(w.ok()) << w.status();
    std::vector<int32_t> tokens(kRows, 1);
    for (int64_t at = 0; at < kRows; at += 6000) {
      std::vector<int64_t> indptr{0};
      std::vector<int32_t> indices;
      std::vector<float> values;
      for (int64_t r = at; r < at + 6000; ++r) {
        for (const auto& [l, v] : rows_[r]) indices.push_back(l), values.push_back(v);
        indptr.push_back(static_cast<int64_t>(indices.size()));
      }
      ASSERT_TRUE(
          (*w)->AppendSparse(6000, indptr.data(), indices.data(), values.data(), tokens.data() + at)
              .ok());
      ASSERT_TRUE((*w)->Commit().ok());
    }
  }

  // The runs of three sequences of one class, a span each.
  static std::vector<RowSpan> Runs(bool positive) {
    std::vector<RowSpan> spans;
    for (int64_t s = 0; s < kSequences; s += 3) {
      if (PositiveSequence(s) == positive) {
        spans.push_back({s * kContext, std::min<int64_t>(3, kSequences - s) * kContext});
      }
    }
    return spans;
  }

  // The examples of `spans` (rows, or sequences pooled) over all latents, labelled, computed
  // from the rows written.
  LabelledExamples Examples(const std::vector<RowSpan>& spans, uint8_t label,
                            ProbePool pool) const {
    LabelledExamples out;
    const auto add = [&](const std::map<int32_t, float>& entries) {
      for (const auto& [l, v] : entries) out.columns.push_back(l), out.values.push_back(v);
      out.indptr.push_back(static_cast<int64_t>(out.columns.size()));
      out.labels.push_back(label);
    };
    for (const RowSpan& span : spans) {
      if (pool == ProbePool::kNone) {
        for (int64_t r = span.start; r < span.start + span.count; ++r) add(rows_[r]);
        continue;
      }
      for (int64_t s = span.start; s < span.start + span.count; s += kContext) {
        std::map<int32_t, float> pooled;
        for (int64_t r = s; r < s + kContext; ++r) {
          for (const auto& [l, v] : rows_[r]) {
            pooled[l] = pool == ProbePool::kMean ? pooled[l] + v : std::max(pooled[l], v);
          }
        }
        if (pool == ProbePool::kMean) {
          for (auto& [l, v] : pooled) v /= kContext;
        }
        add(pooled);
      }
    }
    return out;
  }

  // `spans` without the rows of `held` (spans of the same list, or sequences of them).
  static std::vector<RowSpan> Without(const std::vector<RowSpan>& spans,
                                      const std::vector<RowSpan>& held) {
    std::vector<RowSpan> out;
    for (const RowSpan& s : spans) {
      for (int64_t r = s.start; r < s.start + s.count; ++r) {
        const bool is_held = std::any_of(held.begin(), held.end(), [r](const RowSpan& h) {
          return r >= h.start && r < h.start + h.count;
        });
        if (is_held) continue;
        if (!out.empty() && out.back().start + out.back().count == r) {
          ++out.back().count;
        } else {
          out.push_back({r, 1});
        }
      }
    }
    return out;
  }

  // Keeps the columns of `latents` (renumbered in their order) of two example sets, appended.
  static LabelledExamples Keep(const std::vector<LabelledExamples>& parts,
                               const std::vector<int32_t>& latents) {
    LabelledExamples out;
    for (const LabelledExamples& part : parts) {
      for (int64_t i = 0; i < part.size(); ++i) {
        for (int64_t e = part.indptr[i]; e < part.indptr[i + 1]; ++e) {
          const auto at = std::find(latents.begin(), latents.end(), part.columns[e]);
          if (at == latents.end()) continue;
          out.columns.push_back(static_cast<int32_t>(at - latents.begin()));
          out.values.push_back(part.values[e]);
        }
        out.indptr.push_back(static_cast<int64_t>(out.columns.size()));
        out.labels.push_back(part.labels[i]);
      }
    }
    return out;
  }

  // Checks `got` against the probe recomputed here from the rows written and the split it
  // reports: the chosen latents, each k's weights and every metric.
  void ExpectAsRecomputed(const SparseProbeResult& got, const SparseProbeOptions& o) {
    const std::vector<RowSpan> positives = Runs(true), negatives = Runs(false);
    const std::vector<RowSpan> train_spans[2] = {Without(negatives, got.test_negatives),
                                                 Without(positives, got.test_positives)};
    const LabelledExamples train[2] = {Examples(train_spans[0], 0, o.pool),
                                       Examples(train_spans[1], 1, o.pool)};
    const LabelledExamples test[2] = {Examples(got.test_negatives, 0, o.pool),
                                      Examples(got.test_positives, 1, o.pool)};
    EXPECT_EQ(got.train_negative, train[0].size());
    EXPECT_EQ(got.train_positive, train[1].size());
    EXPECT_EQ(got.test_negative, test[0].size());
    EXPECT_EQ(got.test_positive, test[1].size());
    const int32_t most = *std::max_element(o.ks.begin(), o.ks.end());
    // The gap of each latent between the classes: of the mean value over the examples as
    // fitted, or of the share of rows it fires on (rows even when pooled).
    const bool by_mean = o.select == ProbeSelect::kByMean;
    const ProbePool counted_as = by_mean ? o.pool : ProbePool::kNone;
    const LabelledExamples chosen_on[2] = {Examples(train_spans[0], 0, counted_as),
                                           Examples(train_spans[1], 1, counted_as)};
    std::vector<double> gap(kWidth, 0.0);
    for (int side = 0; side < 2; ++side) {
      for (size_t e = 0; e < chosen_on[side].columns.size(); ++e) {
        gap[chosen_on[side].columns[e]] += (side == 1 ? 1 : -1) *
                                           (by_mean ? chosen_on[side].values[e] : 1.0) /
                                           chosen_on[side].size();
      }
    }
    std::vector<int32_t> order(kWidth);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(),
                     [&gap](int32_t a, int32_t b) { return std::abs(gap[a]) > std::abs(gap[b]); });
    std::vector<int32_t> latents;
    for (int32_t l : order) {
      if (static_cast<int32_t>(latents.size()) < most && std::abs(gap[l]) > 1e-12) {
        latents.push_back(l);
      }
    }
    ASSERT_EQ(got.latents, latents);
    const LabelledExamples fitted = Keep({train[0], train[1]}, latents);
    const LabelledExamples held = Keep({test[0], test[1]}, latents);
    const std::set<int32_t> ks(o.ks.begin(), o.ks.end());
    ASSERT_EQ(got.fits.size(), ks.size());
    for (const ProbeFit& fit : got.fits) {
      const int32_t used = std::min<int32_t>(fit.k, static_cast<int32_t>(latents.size()));
      const LogisticFit want = FitLogistic(fitted, used, o.l2, o.balanced);
      ASSERT_EQ(fit.weights.size(), want.weights.size());
      for (int32_t c = 0; c < used; ++c) {
        EXPECT_NEAR(fit.weights[c], want.weights[c], 1e-6 * (1 + std::abs(want.weights[c])));
      }
      EXPECT_NEAR(fit.intercept, want.intercept, 1e-6 * (1 + std::abs(want.intercept)));
      int64_t right = 0, said = 0, hit = 0;
      for (int64_t i = 0; i < held.size(); ++i) {
        double z = want.intercept;
        for (int64_t e = held.indptr[i]; e < held.indptr[i + 1]; ++e) {
          if (held.columns[e] < used) z += want.weights[held.columns[e]] * held.values[e];
        }
        right += (z > 0) == (held.labels[i] == 1);
        said += z > 0;
        hit += z > 0 && held.labels[i] == 1;
      }
      EXPECT_DOUBLE_EQ(fit.test_accuracy, static_cast<double>(right) / held.size()) << fit.k;
      EXPECT_DOUBLE_EQ(fit.test_precision, static_cast<double>(hit) / std::max<int64_t>(1, said));
      EXPECT_DOUBLE_EQ(fit.test_recall, static_cast<double>(hit) / test[1].size());
      // Negatives called negative: all held-out examples minus the wrong ones and the hits.
      const int64_t rejected = right - hit;
      EXPECT_DOUBLE_EQ(fit.test_balanced_accuracy,
                       (static_cast<double>(hit) / test[1].size() +
                        static_cast<double>(rejected) / test[0].size()) /
                           2);
    }
  }

  const std::vector<std::map<int32_t, float>> rows_ = MakeRows();
  std::unique_ptr<Db> db_;
  std::unique_ptr<ChunkStore> store_;
  uint64_t id_ = 0;
};

TEST_F(SparseProbeTest, TheLatentThatMarksThePositivesLeadsAndTellsHeldOutRowsApart) {
  SparseProbeOptions o;
  o.ks = {5, 1, 2, 1};
  auto got = SparseProbe(*store_, id_, Runs(true), Runs(false), o);
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_FALSE(got->latents.empty());
  EXPECT_EQ(got->latents[0], 7);
  ASSERT_EQ(got->fits.size(), 3u);  // ascending, the repeat dropped
  EXPECT_EQ(got->fits[0].k, 1);
  EXPECT_EQ(got->fits[2].k, 5);
  // 90% against 5% of the rows: about 0.92 of the held-out rows told apart by latent 7 alone.
  EXPECT_GE(got->fits[0].test_accuracy, 0.88);
  EXPECT_GT(got->fits[0].weights[0], 0);
  // Latent 9 (30% against 10%) comes next, and the larger probes weigh it up too; then latent 3,
  // which marks the negatives (2% against 15%): weighed down.
  EXPECT_EQ(got->latents[1], 9);
  EXPECT_GT(got->fits[1].weights[1], 0);
  EXPECT_EQ(got->latents[2], 3);
  EXPECT_LT(got->fits[2].weights[2], 0);
  // Each class's spans split 1 : 3, whole: every row of a span lies on one side.
  const std::vector<RowSpan> positives = Runs(true);
  EXPECT_EQ(static_cast<int64_t>(got->test_positives.size()),
            std::llround(0.25 * positives.size()));
  for (const RowSpan& held : got->test_positives) {
    EXPECT_TRUE(std::any_of(positives.begin(), positives.end(), [&held](const RowSpan& s) {
      return s.start == held.start && s.count == held.count;
    }));
  }
  EXPECT_EQ(got->rows_read, kRows);
  EXPECT_EQ(got->train_positive + got->test_positive + got->train_negative + got->test_negative,
            kRows);
  ExpectAsRecomputed(*got, o);
  // The same seed, the same split and answer; another seed, another split.
  auto again = SparseProbe(*store_, id_, Runs(true), Runs(false), o);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->fits[1].weights, got->fits[1].weights);
  o.seed = 1;
  auto reseeded = SparseProbe(*store_, id_, Runs(true), Runs(false), o);
  ASSERT_TRUE(reseeded.ok());
  const auto starts = [](const std::vector<RowSpan>& spans) {
    std::vector<int64_t> out;
    for (const RowSpan& s : spans) out.push_back(s.start);
    return out;
  };
  EXPECT_NE(starts(reseeded->test_positives), starts(got->test_positives));
}

TEST_F(SparseProbeTest, CallingTheOtherClassPositiveChoosesTheSameLatents) {
  // Latents are chosen by their gap either way, so a marker of either class is used whichever
  // class the user calls positive; its weight changes sign with the labels.
  for (ProbeSelect select : {ProbeSelect::kByFraction, ProbeSelect::kByMean}) {
    SCOPED_TRACE(static_cast<int>(select));
    SparseProbeOptions o;
    o.ks = {3};
    o.select = select;
    auto got = SparseProbe(*store_, id_, Runs(true), Runs(false), o);
    auto swapped = SparseProbe(*store_, id_, Runs(false), Runs(true), o);
    ASSERT_TRUE(got.ok()) << got.status();
    ASSERT_TRUE(swapped.ok()) << swapped.status();
    const std::vector<int32_t> markers = {7, 9, 3};
    ASSERT_GE(got->latents.size(), 3u);
    EXPECT_EQ(std::vector<int32_t>(got->latents.begin(), got->latents.begin() + 3), markers);
    ASSERT_GE(swapped->latents.size(), 3u);
    EXPECT_EQ(std::vector<int32_t>(swapped->latents.begin(), swapped->latents.begin() + 3),
              markers);
    for (int c = 0; c < 3; ++c) {
      EXPECT_LT(got->fits[0].weights[c] * swapped->fits[0].weights[c], 0) << markers[c];
    }
    EXPECT_GE(swapped->fits[0].test_accuracy, 0.88);
    ExpectAsRecomputed(*got, o);
  }
}

TEST_F(SparseProbeTest, BalancedClassesMoveTheBoundaryTowardTheRareOne) {
  // 8 runs of positives against every negative run (about 1 : 20): weighed up, the rare class
  // pulls the intercept its way (FitLogisticTest.BalancedWeighsTheRareClassUp shows the recall
  // it buys where the classes overlap); the split is the same.
  const std::vector<RowSpan> runs = Runs(true);
  const std::vector<RowSpan> few(runs.begin(), runs.begin() + 8);
  SparseProbeOptions o;
  o.ks = {2};
  auto plain = SparseProbe(*store_, id_, few, Runs(false), o);
  o.balanced = true;
  auto balanced = SparseProbe(*store_, id_, few, Runs(false), o);
  ASSERT_TRUE(plain.ok() && balanced.ok());
  EXPECT_EQ(plain->test_positives.size(), balanced->test_positives.size());
  EXPECT_EQ(plain->latents, balanced->latents);
  EXPECT_GT(balanced->fits[0].intercept, plain->fits[0].intercept + 1.0);
  EXPECT_GE(balanced->fits[0].test_recall, plain->fits[0].test_recall);
}

TEST_F(SparseProbeTest, PooledSequencesAreOneExampleEach) {
  for (ProbePool pool : {ProbePool::kMean, ProbePool::kMax}) {
    for (ProbeSelect select : {ProbeSelect::kByFraction, ProbeSelect::kByMean}) {
      SCOPED_TRACE(testing::Message()
                   << "pool " << static_cast<int>(pool) << " select " << static_cast<int>(select));
      SparseProbeOptions o;
      o.ks = {1, 3};
      o.pool = pool;
      o.select = select;
      o.seed = 3;
      o.balanced = select == ProbeSelect::kByMean;  // the classes' weights reach the fit
      auto got = SparseProbe(*store_, id_, Runs(true), Runs(false), o);
      ASSERT_TRUE(got.ok()) << got.status();
      EXPECT_EQ(got->train_positive + got->test_positive + got->train_negative + got->test_negative,
                kSequences);
      // Sequences are split one by one: a quarter of each class's held out.
      EXPECT_EQ(got->test_positive,
                std::llround(0.25 * (got->train_positive + got->test_positive)));
      for (const RowSpan& held : got->test_positives) EXPECT_EQ(held.count, kContext);
      EXPECT_EQ(got->latents[0], 7);
      EXPECT_EQ(got->fits[0].test_accuracy, 1.0);
      ExpectAsRecomputed(*got, o);
    }
  }
}

TEST_F(SparseProbeTest, BadInputIsRefusedNamingWhatIsWrong) {
  const auto refused = [&](const std::vector<RowSpan>& p, const std::vector<RowSpan>& n,
                           const SparseProbeOptions& o, absl::StatusCode code,
                           const std::string& says) {
    auto got = SparseProbe(*store_, id_, p, n, o);
    ASSERT_FALSE(got.ok()) << says;
    EXPECT_EQ(got.status().code(), code) << got.status();
    EXPECT_NE(got.status().message().find(says), std::string::npos) << got.status();
  };
  const std::vector<RowSpan> two = {{0, 10}, {20, 10}}, other = {{40, 5}, {50, 5}};
  SparseProbeOptions o;
  refused(two, {{25, 10}, {50, 5}}, o, absl::StatusCode::kInvalidArgument,
          "versus_row_ranges[0]: row 25 is in row_ranges[1]");
  refused({{0, 10}}, other, o, absl::StatusCode::kInvalidArgument, "row_ranges: 1 unit");
  refused(two, {{20, 1}, {10, 5}}, o, absl::StatusCode::kInvalidArgument, "versus_row_ranges[1]");
  refused(two, {{kRows - 5, 10}, {0, 1}}, o, absl::StatusCode::kOutOfRange, "versus_row_ranges[0]");
  o.max_rows = 29;
  refused(two, other, o, absl::StatusCode::kResourceExhausted,
          "hold 30 rows, more than max_rows 29");
  o = SparseProbeOptions();
  o.pool = ProbePool::kMean;
  refused({{0, kContext}, {kContext * 2, kContext + 1}},
          {{kContext * 5, kContext}, {kContext * 7, kContext}}, o,
          absl::StatusCode::kInvalidArgument,
          "row_ranges[1]: rows [96, 96 + 49) are not whole sequences of 48");
  o = SparseProbeOptions();
  o.ks = {0};
  refused(two, other, o, absl::StatusCode::kInvalidArgument, "ks[0]: 0");
  o.ks = {kMaxProbeK + 1};
  refused(two, other, o, absl::StatusCode::kInvalidArgument, "ks[0]");
  o.ks = {};
  refused(two, other, o, absl::StatusCode::kInvalidArgument, "ks:");
  o = SparseProbeOptions();
  o.l2 = 0;
  refused(two, other, o, absl::StatusCode::kInvalidArgument, "l2");
  o.l2 = 1;
  o.test_fraction = 1;
  refused(two, other, o, absl::StatusCode::kInvalidArgument, "test_fraction");
  EXPECT_EQ(SparseProbe(*store_, id_ + 100, two, other, SparseProbeOptions()).status().code(),
            absl::StatusCode::kNotFound);
  // No sequences to pool; no latents at all.
  DatasetMeta flat;
  flat.name = "flat";
  flat.kind = DatasetKind::kSparse;
  flat.value_dtype = ValueDtype::kFloat32;
  flat.width = 4;
  flat.encoder = "relu";
  auto flat_id = store_->CreateDataset(flat);
  ASSERT_TRUE(flat_id.ok());
  auto w = store_->OpenWriter(*flat_id);
  ASSERT_TRUE(w.ok());
  std::vector<int64_t> indptr(101, 0);
  std::vector<int32_t> tokens(100, 0), no_indices(1, 0);
  std::vector<float> no_values(1, 0.0f);
  ASSERT_TRUE(
      (*w)->AppendSparse(100, indptr.data(), no_indices.data(), no_values.data(), tokens.data())
          .ok());
  ASSERT_TRUE((*w)->Commit().ok());
  o = SparseProbeOptions();
  o.pool = ProbePool::kMax;
  EXPECT_EQ(SparseProbe(*store_, *flat_id, two, other, o).status().code(),
            absl::StatusCode::kFailedPrecondition);
  // Without any firing, no latent is chosen: the probe is the intercept alone.
  auto silent = SparseProbe(*store_, *flat_id, two, other, SparseProbeOptions());
  ASSERT_TRUE(silent.ok()) << silent.status();
  EXPECT_TRUE(silent->latents.empty());
  EXPECT_TRUE(silent->fits[0].weights.empty());
  DatasetMeta dense;
  dense.name = "dense";
  dense.kind = DatasetKind::kDense;
  dense.value_dtype = ValueDtype::kFloat32;
  dense.width = 4;
  auto dense_id = store_->CreateDataset(dense);
  ASSERT_TRUE(dense_id.ok());
  EXPECT_EQ(SparseProbe(*store_, *dense_id, two, other, SparseProbeOptions()).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace latentd::storage
