#include "storage/sparse_probe.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <numeric>
#include <random>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "common/status_macros.h"

namespace latentd::storage {
namespace {

// Rows one ReadRowSet covers at most: a window's CSR stays a few MiB at common widths.
constexpr int64_t kReadWindowRows = 16384;

absl::Status CheckOptions(const SparseProbeOptions& o) {
  if (o.ks.empty() || static_cast<int32_t>(o.ks.size()) > kMaxProbeKs) {
    return absl::InvalidArgumentError(
        absl::StrCat("ks: ", o.ks.size(), " probe sizes; give 1 to ", kMaxProbeKs));
  }
  for (size_t i = 0; i < o.ks.size(); ++i) {
    if (o.ks[i] < 1 || o.ks[i] > kMaxProbeK) {
      return absl::InvalidArgumentError(
          absl::StrCat("ks[", i, "]: ", o.ks[i], " outside [1, ", kMaxProbeK, "]"));
    }
  }
  if (!(o.test_fraction > 0 && o.test_fraction < 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("test_fraction: ", o.test_fraction, " outside (0, 1)"));
  }
  if (!(o.l2 > 0) || !std::isfinite(o.l2)) {
    return absl::InvalidArgumentError(
        absl::StrCat("l2: ", o.l2, " is not a positive number (the fit needs the penalty)"));
  }
  if (o.max_rows < 1 || o.max_rows > kMaxProbeRows) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_rows: ", o.max_rows, " outside [1, ", kMaxProbeRows, "]"));
  }
  return absl::OkStatus();
}

// INVALID_ARGUMENT at the first row both classes hold: a row labelled both ways.
absl::Status CheckDisjoint(const std::vector<RowSpan>& positives,
                           const std::vector<RowSpan>& negatives) {
  size_t i = 0, j = 0;
  while (i < positives.size() && j < negatives.size()) {
    const RowSpan& p = positives[i];
    const RowSpan& n = negatives[j];
    const int64_t lo = std::max(p.start, n.start);
    if (lo < std::min(p.start + p.count, n.start + n.count)) {
      return absl::InvalidArgumentError(
          absl::StrCat("versus_row_ranges[", j, "]: row ", lo, " is in row_ranges[", i,
                       "] too; a row is a positive or a negative, not both"));
    }
    if (p.start + p.count < n.start + n.count) {
      ++i;
    } else {
      ++j;
    }
  }
  return absl::OkStatus();
}

// A span of rows of one class on one side of the split: one example per row, or (pooled) one
// sequence, one example.
struct Unit {
  RowSpan rows;
  uint8_t positive = 0;
  uint8_t test = 0;
};

// The units of one class: its spans, or (pooled) each sequence of them. INVALID_ARGUMENT naming
// `field`[i] for a pooled span that is not whole sequences.
absl::StatusOr<std::vector<RowSpan>> UnitsOf(const std::vector<RowSpan>& spans, bool pooled,
                                             int64_t context_length, absl::string_view field) {
  if (!pooled) return spans;
  std::vector<RowSpan> sequences;
  for (size_t i = 0; i < spans.size(); ++i) {
    const RowSpan& s = spans[i];
    if (s.start % context_length != 0 || s.count % context_length != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          field, "[", i, "]: rows [", s.start, ", ", s.start, " + ", s.count,
          ") are not whole sequences of ", context_length, " rows, which pooling needs"));
    }
    for (int64_t at = s.start; at < s.start + s.count; at += context_length) {
      sequences.push_back({at, context_length});
    }
  }
  return sequences;
}

// Splits a class's units at random: round(test_fraction * n) of them, at least one and at most
// n - 1, to the test side. The shuffle is Fisher-Yates on a 64-bit Mersenne Twister (its
// output is fixed by the standard; std's distributions are not).
absl::Status Split(const std::vector<RowSpan>& units, uint8_t positive, double test_fraction,
                   std::mt19937_64* rng, absl::string_view field, std::vector<Unit>* out) {
  const int64_t n = static_cast<int64_t>(units.size());
  if (n < 2) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": ", n, n == 1 ? " unit" : " units",
                     " (a span, or a sequence when pooled); a train/test split needs at least 2"));
  }
  std::vector<int64_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  for (int64_t i = n - 1; i > 0; --i) std::swap(order[i], order[(*rng)() % (i + 1)]);
  const int64_t held = std::min<int64_t>(
      n - 1, std::max<int64_t>(1, std::llround(test_fraction * static_cast<double>(n))));
  for (int64_t i = 0; i < n; ++i) {
    out->push_back({units[order[i]], positive, static_cast<uint8_t>(i < held ? 1 : 0)});
  }
  return absl::OkStatus();
}

// One example's latents and values.
using Entries = std::vector<std::pair<int32_t, float>>;

// Reads the rows of `units` (ascending, not overlapping) in windows of at most kReadWindowRows,
// decoding only their rows, and calls visit(unit, entries) for each example in row order: each
// row, or (pooled) each unit's rows pooled.
template <typename Visit>
absl::Status ForEachExample(const ChunkStore& store, uint64_t id, int32_t width,
                            const std::vector<Unit>& units, ProbePool pool, Visit visit) {
  std::vector<float> pooled(pool == ProbePool::kNone ? 0 : width, 0.0f);
  std::vector<int32_t> touched;  // latents with a pooled value in the unit so far
  Entries entries;
  std::vector<uint64_t> keep;
  size_t first = 0;  // the first unit not wholly visited
  int64_t next_row = units.empty() ? 0 : units[0].rows.start;
  while (first < units.size()) {
    const int64_t lo = std::max(next_row, units[first].rows.start);
    int64_t hi = lo;  // past the last row of a unit in [lo, lo + kReadWindowRows)
    keep.assign((kReadWindowRows + 63) / 64, 0);
    for (size_t u = first; u < units.size() && units[u].rows.start < lo + kReadWindowRows; ++u) {
      const int64_t begin = std::max(lo, units[u].rows.start);
      hi = std::min(lo + kReadWindowRows, units[u].rows.start + units[u].rows.count);
      for (int64_t row = begin; row < hi; ++row) {
        keep[(row - lo) >> 6] |= uint64_t{1} << ((row - lo) & 63);
      }
    }
    ASSIGN_OR_RETURN(const CsrRows read, store.ReadRowSet(id, lo, hi - lo, keep));
    for (; first < units.size() && units[first].rows.start < hi; ++first) {
      const Unit& unit = units[first];
      const int64_t unit_end = unit.rows.start + unit.rows.count;
      for (int64_t row = std::max(lo, unit.rows.start); row < std::min(hi, unit_end); ++row) {
        const int64_t at = row - lo;
        if (pool == ProbePool::kNone) {
          entries.clear();
          for (int64_t e = read.indptr[at]; e < read.indptr[at + 1]; ++e) {
            entries.emplace_back(read.indices[e], read.values[e]);
          }
          visit(unit, entries);
          continue;
        }
        for (int64_t e = read.indptr[at]; e < read.indptr[at + 1]; ++e) {
          float& slot = pooled[read.indices[e]];
          if (slot == 0.0f) touched.push_back(read.indices[e]);
          slot = pool == ProbePool::kMean ? slot + read.values[e] : std::max(slot, read.values[e]);
        }
      }
      if (unit_end > hi) break;  // the unit goes on in the next window
      if (pool != ProbePool::kNone) {
        entries.clear();
        // A mean divides by every row of the sequence, those where the latent is silent too.
        const float rows = pool == ProbePool::kMean ? static_cast<float>(unit.rows.count) : 1.0f;
        for (int32_t latent : touched) {
          if (pooled[latent] != 0.0f) entries.emplace_back(latent, pooled[latent] / rows);
          pooled[latent] = 0.0f;
        }
        touched.clear();
        visit(unit, entries);
      }
    }
    next_row = hi;
  }
  return absl::OkStatus();
}

// Latents by the gap, either sign, between the classes' train examples, largest first (ties by
// index), at most `limit`, none without a gap: of their mean values over the examples as fitted
// (kByMean), or of the share of rows they fire on (kByFraction, rows even when pooled: a latent
// fires somewhere in nearly every long sequence). Either sign, so that which class is called
// positive does not change the latents a probe may use.
absl::StatusOr<std::vector<int32_t>> ChooseLatents(const ChunkStore& store, uint64_t id,
                                                   int32_t width, const std::vector<Unit>& train,
                                                   ProbePool pool, ProbeSelect select,
                                                   int32_t limit) {
  const bool by_mean = select == ProbeSelect::kByMean;
  std::vector<double> sums[2] = {std::vector<double>(width, 0.0), std::vector<double>(width, 0.0)};
  int64_t examples[2] = {0, 0};
  const auto add = [&](const Unit& unit, const Entries& row) {
    ++examples[unit.positive];
    for (const auto& [latent, value] : row) sums[unit.positive][latent] += by_mean ? value : 1.0;
  };
  RETURN_IF_ERROR(ForEachExample(store, id, width, train, by_mean ? pool : ProbePool::kNone, add));
  std::vector<double> gap(width);
  for (int32_t l = 0; l < width; ++l) {
    gap[l] = std::abs(sums[1][l] / examples[1] - sums[0][l] / examples[0]);
  }
  std::vector<int32_t> order(width);
  std::iota(order.begin(), order.end(), 0);
  const int32_t take = std::min(limit, width);
  std::partial_sort(order.begin(), order.begin() + take, order.end(), [&gap](int32_t a, int32_t b) {
    return gap[a] > gap[b] || (gap[a] == gap[b] && a < b);
  });
  order.resize(take);
  while (!order.empty() && !(gap[order.back()] > 0)) order.pop_back();
  return order;
}

// Solves a x = b for the n x n row-major `a` by Gaussian elimination with partial pivoting (a
// pivot of 0 taken as 1e-300: the step along it is then whatever b asks).
std::vector<double> Solve(std::vector<double> a, std::vector<double> b, int n) {
  for (int c = 0; c < n; ++c) {
    int pivot = c;
    for (int r = c + 1; r < n; ++r) {
      if (std::abs(a[r * n + c]) > std::abs(a[pivot * n + c])) pivot = r;
    }
    if (pivot != c) {
      for (int k = 0; k < n; ++k) std::swap(a[c * n + k], a[pivot * n + k]);
      std::swap(b[c], b[pivot]);
    }
    if (a[c * n + c] == 0) a[c * n + c] = 1e-300;
    for (int r = c + 1; r < n; ++r) {
      const double f = a[r * n + c] / a[c * n + c];
      if (f == 0) continue;
      for (int k = c; k < n; ++k) a[r * n + k] -= f * a[c * n + k];
      b[r] -= f * b[c];
    }
  }
  std::vector<double> x(n);
  for (int r = n - 1; r >= 0; --r) {
    double s = b[r];
    for (int k = r + 1; k < n; ++k) s -= a[r * n + k] * x[k];
    x[r] = s / a[r * n + r];
  }
  return x;
}

// The value of sum weights[c] * x[c] + intercept for example i (columns below weights.size()).
double Logit(const LabelledExamples& x, int64_t i, const std::vector<double>& weights,
             double intercept) {
  double z = intercept;
  const int32_t columns = static_cast<int32_t>(weights.size());
  for (int64_t e = x.indptr[i]; e < x.indptr[i + 1]; ++e) {
    if (x.columns[e] < columns) z += weights[x.columns[e]] * x.values[e];
  }
  return z;
}

// The probe `fitted` on the first weights.size() columns, scored on the train and the test
// examples.
ProbeFit Score(LogisticFit fitted, int32_t k, const LabelledExamples& train,
               const LabelledExamples& test) {
  ProbeFit fit;
  fit.k = k;
  int64_t train_right = 0;
  for (int64_t i = 0; i < train.size(); ++i) {
    const bool said = Logit(train, i, fitted.weights, fitted.intercept) > 0;
    train_right += said == (train.labels[i] == 1);
  }
  // The held-out examples counted by what the probe said and what they are.
  int64_t held[2][2] = {{0, 0}, {0, 0}};  // [called positive][is positive]
  for (int64_t i = 0; i < test.size(); ++i) {
    const bool said = Logit(test, i, fitted.weights, fitted.intercept) > 0;
    ++held[said][test.labels[i]];
  }
  const int64_t true_positive = held[1][1], true_negative = held[0][0];
  const int64_t positives = held[0][1] + held[1][1], negatives = held[0][0] + held[1][0];
  fit.train_accuracy = static_cast<double>(train_right) / train.size();
  fit.test_accuracy = static_cast<double>(true_positive + true_negative) / test.size();
  fit.test_precision =
      static_cast<double>(true_positive) / std::max<int64_t>(1, held[1][0] + held[1][1]);
  fit.test_recall = static_cast<double>(true_positive) / std::max<int64_t>(1, positives);
  fit.test_balanced_accuracy =
      (fit.test_recall + static_cast<double>(true_negative) / std::max<int64_t>(1, negatives)) / 2;
  fit.test_f1 = true_positive == 0 ? 0.0
                                   : 2 * fit.test_precision * fit.test_recall /
                                         (fit.test_precision + fit.test_recall);
  fit.weights = std::move(fitted.weights);
  fit.intercept = fitted.intercept;
  return fit;
}

}  // namespace

LogisticFit FitLogistic(const LabelledExamples& x, int32_t columns, double l2, bool balanced) {
  const int64_t n = x.size();
  const int d = columns + 1;  // the weights, then the intercept
  // Each class's weight in the loss: 1, or n / (2 n_class) (scikit-learn's "balanced").
  double class_weight[2] = {1.0, 1.0};
  if (balanced) {
    const int64_t positives = std::count(x.labels.begin(), x.labels.end(), 1);
    for (int label = 0; label < 2; ++label) {
      const int64_t in_class = label == 1 ? positives : n - positives;
      if (in_class > 0) class_weight[label] = static_cast<double>(n) / (2.0 * in_class);
    }
  }
  // Each column's standard deviation over the examples (the silent ones count 0).
  std::vector<double> sum(columns, 0.0), sum_sq(columns, 0.0), scale(columns, 1.0);
  for (size_t e = 0; e < x.columns.size(); ++e) {
    if (x.columns[e] < columns) {
      sum[x.columns[e]] += x.values[e];
      sum_sq[x.columns[e]] += x.values[e] * x.values[e];
    }
  }
  for (int32_t c = 0; c < columns && n > 0; ++c) {
    const double mean = sum[c] / n;
    const double variance = sum_sq[c] / n - mean * mean;
    if (variance > 1e-24 * std::max(1.0, sum_sq[c] / n)) scale[c] = std::sqrt(variance);
  }
  // w: the standardized weights, then the intercept.
  std::vector<double> w(d, 0.0), gradient(d), hessian(static_cast<size_t>(d) * d);
  std::vector<std::pair<int32_t, double>> row;  // an example's standardized entries
  LogisticFit fit;
  for (; fit.iterations < 100;) {
    std::fill(gradient.begin(), gradient.end(), 0.0);
    std::fill(hessian.begin(), hessian.end(), 0.0);
    for (int64_t i = 0; i < n; ++i) {
      row.clear();
      double z = w[columns];
      for (int64_t e = x.indptr[i]; e < x.indptr[i + 1]; ++e) {
        if (x.columns[e] >= columns) continue;
        row.emplace_back(x.columns[e], x.values[e] / scale[x.columns[e]]);
        z += w[x.columns[e]] * row.back().second;
      }
      const double p = 1.0 / (1.0 + std::exp(-std::clamp(z, -50.0, 50.0)));
      const double weight = class_weight[x.labels[i]];
      const double residual = weight * (p - x.labels[i]);
      const double curvature = weight * p * (1.0 - p);
      gradient[columns] += residual;
      hessian[static_cast<size_t>(columns) * d + columns] += curvature;
      for (const auto& [c, v] : row) {
        gradient[c] += residual * v;
        hessian[static_cast<size_t>(c) * d + columns] += curvature * v;
        hessian[static_cast<size_t>(columns) * d + c] += curvature * v;
        for (const auto& [c2, v2] : row) {
          hessian[static_cast<size_t>(c) * d + c2] += curvature * v * v2;
        }
      }
    }
    for (int c = 0; c < d; ++c) {
      if (c < columns) {
        gradient[c] += l2 * w[c];
        hessian[static_cast<size_t>(c) * d + c] += l2;
      }
      hessian[static_cast<size_t>(c) * d + c] += 1e-12;
    }
    const std::vector<double> step = Solve(hessian, gradient, d);
    double largest = 0;
    for (int c = 0; c < d; ++c) {
      w[c] -= step[c];
      largest = std::max(largest, std::abs(step[c]));
    }
    ++fit.iterations;
    if (!(largest >= 1e-10)) break;  // converged (or NaN: no further step helps)
  }
  fit.weights.resize(columns);
  for (int32_t c = 0; c < columns; ++c) fit.weights[c] = w[c] / scale[c];
  fit.intercept = w[columns];
  return fit;
}

absl::StatusOr<SparseProbeResult> SparseProbe(const ChunkStore& store, uint64_t id,
                                              const std::vector<RowSpan>& positives,
                                              const std::vector<RowSpan>& negatives,
                                              const SparseProbeOptions& options) {
  RETURN_IF_ERROR(CheckOptions(options));
  ASSIGN_OR_RETURN(const DatasetRecord rec, store.GetSparseRecord(id));
  RETURN_IF_ERROR(CheckRowSpans(positives, rec, "row_ranges"));
  RETURN_IF_ERROR(CheckRowSpans(negatives, rec, "versus_row_ranges"));
  RETURN_IF_ERROR(CheckDisjoint(positives, negatives));
  int64_t rows = 0;
  for (const auto* spans : {&positives, &negatives}) {
    for (const RowSpan& s : *spans) rows += s.count;  // within the committed rows: no overflow
  }
  if (rows > options.max_rows) {
    return absl::ResourceExhaustedError(
        absl::StrCat("the two classes hold ", rows, " rows, more than max_rows ", options.max_rows,
                     " (at most ", kMaxProbeRows, "): raise it or name fewer rows"));
  }
  const bool pooled = options.pool != ProbePool::kNone;
  if (pooled && rec.meta.context_length < 1) {
    return absl::FailedPreconditionError(
        absl::StrCat("pool: dataset ", id, " has no sequences (context_length 0) to pool over"));
  }
  std::vector<int32_t> ks = options.ks;
  std::sort(ks.begin(), ks.end());
  ks.erase(std::unique(ks.begin(), ks.end()), ks.end());

  // The split: positives first, then negatives, from one generator.
  std::mt19937_64 rng(options.seed);
  std::vector<Unit> units;
  ASSIGN_OR_RETURN(const std::vector<RowSpan> positive_units,
                   UnitsOf(positives, pooled, rec.meta.context_length, "row_ranges"));
  RETURN_IF_ERROR(Split(positive_units, 1, options.test_fraction, &rng, "row_ranges", &units));
  ASSIGN_OR_RETURN(const std::vector<RowSpan> negative_units,
                   UnitsOf(negatives, pooled, rec.meta.context_length, "versus_row_ranges"));
  RETURN_IF_ERROR(
      Split(negative_units, 0, options.test_fraction, &rng, "versus_row_ranges", &units));
  std::sort(units.begin(), units.end(),
            [](const Unit& a, const Unit& b) { return a.rows.start < b.rows.start; });

  SparseProbeResult result;
  result.rows_read = rows;
  std::vector<Unit> train;
  for (const Unit& u : units) {
    if (!u.test) {
      train.push_back(u);
    } else {
      (u.positive ? result.test_positives : result.test_negatives).push_back(u.rows);
    }
  }
  ASSIGN_OR_RETURN(result.latents, ChooseLatents(store, id, rec.meta.width, train, options.pool,
                                                 options.select, ks.back()));

  // Every example's values of the chosen latents, column i being latents[i].
  std::vector<int32_t> column_of(rec.meta.width, -1);
  for (size_t i = 0; i < result.latents.size(); ++i) {
    column_of[result.latents[i]] = static_cast<int32_t>(i);
  }
  LabelledExamples sides[2];  // train, test
  const auto add_example = [&](const Unit& unit, const Entries& row) {
    LabelledExamples& side = sides[unit.test];
    for (const auto& [latent, value] : row) {
      if (column_of[latent] < 0) continue;
      side.columns.push_back(column_of[latent]);
      side.values.push_back(value);
    }
    side.indptr.push_back(static_cast<int64_t>(side.columns.size()));
    side.labels.push_back(unit.positive);
  };
  RETURN_IF_ERROR(ForEachExample(store, id, rec.meta.width, units, options.pool, add_example));
  for (int side = 0; side < 2; ++side) {
    const int64_t positive = std::count(sides[side].labels.begin(), sides[side].labels.end(), 1);
    (side == 0 ? result.train_positive : result.test_positive) = positive;
    (side == 0 ? result.train_negative : result.test_negative) = sides[side].size() - positive;
  }

  for (int32_t k : ks) {
    const int32_t used = std::min<int32_t>(k, static_cast<int32_t>(result.latents.size()));
    result.fits.push_back(
        Score(FitLogistic(sides[0], used, options.l2, options.balanced), k, sides[0], sides[1]));
  }
  return result;
}

}  // namespace latentd::storage
