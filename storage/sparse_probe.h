// k-sparse probing (SAEBench's measure of how well an SAE's latents isolate a concept, and a
// user's question "do k latents tell my labelled rows from the others?") over a SPARSE dataset,
// inside the daemon: the rows never cross the wire. Each class's units (the spans given, or
// with pooling each sequence) are split at random into train and test, so that no span lends
// rows to both sides; latents are chosen on the train examples alone; then for each k a
// logistic regression on the first k chosen latents' values is fitted on the train examples
// and scored on the held-out ones.
#ifndef LATENTD_STORAGE_SPARSE_PROBE_H_
#define LATENTD_STORAGE_SPARSE_PROBE_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "storage/chunk_store.h"
#include "storage/latents_on_rows.h"

namespace latentd::storage {

// Bounds of SparseProbeOptions.
inline constexpr int32_t kMaxProbeK = 256;
inline constexpr int32_t kMaxProbeKs = 32;
inline constexpr int64_t kMaxProbeRows = int64_t{1} << 24;

// What one example is.
enum class ProbePool {
  kNone,  // every row of a span is an example
  // Every sequence (context_length rows; the spans must hold whole sequences) is one example,
  // its latent values averaged over its rows (a row where a latent is silent counts 0), as
  // SAEBench classifies documents.
  kMean,
  kMax,  // ... or their largest value on any of its rows (0 when silent on all)
};

// How the latents a probe may use are chosen, on the train examples only.
enum class ProbeSelect {
  // By the largest difference between the shares of the classes' train rows they fire on,
  // either sign (a latent that marks the negatives tells the classes apart as well; calling
  // the other class positive chooses the same latents). Rows even when pooled: nearly every
  // latent fires somewhere in a long sequence. Ties by latent index; a latent with no
  // difference is never chosen.
  kByFraction,
  // By the largest difference of their mean values between the classes, either sign, over the
  // examples as fitted (pooled or not): SAEBench's rule. Ties by latent index; a latent with
  // no difference is never chosen.
  kByMean,
};

struct SparseProbeOptions {
  // The probe sizes, each in [1, kMaxProbeK], at most kMaxProbeKs of them; fitted in ascending
  // order, repeats dropped. Default 1, 2, 5, 10, 20.
  std::vector<int32_t> ks = {1, 2, 5, 10, 20};
  // The share of each class's units held out for testing, in (0, 1): round(test_fraction * n),
  // yet at least one unit on each side (each class needs 2 units). Default 0.25.
  double test_fraction = 0.25;
  uint64_t seed = 0;  // of the split (the same seed, spans and options: the same answer)
  // The L2 penalty on the weights of the standardized latent values (scikit-learn's 1 / C; the
  // intercept is not penalized): > 0 and finite. Default 1.
  double l2 = 1.0;
  ProbePool pool = ProbePool::kNone;
  ProbeSelect select = ProbeSelect::kByFraction;
  // Weigh each class's examples by n / (2 n_class) in the fit (FitLogistic), so that a rare
  // label is not traded away for the majority's accuracy. Default false.
  bool balanced = false;
  // The rows of both classes together, all read, at most this many, in [1, kMaxProbeRows]
  // (RESOURCE_EXHAUSTED with both numbers beyond). Default 2^20.
  int64_t max_rows = int64_t{1} << 20;
};

// The probe of one k.
struct ProbeFit {
  int32_t k = 0;  // as asked; it uses min(k, latents chosen) latents: weights.size()
  double train_accuracy = 0;
  double test_accuracy = 0;
  double test_precision = 0;  // of the test examples it calls positive, the share that are
  double test_recall = 0;     // of the positive test examples, the share it calls positive
  double test_f1 = 0;         // 0 when it finds no positive test example
  // The mean of its recall on the positive and on the negative test examples: 0.5 for a probe
  // that calls everything one class, however rare the other (accuracy then reads as the
  // majority's share).
  double test_balanced_accuracy = 0;
  // Per latent of SparseProbeResult::latents (in that order), the logistic weight per unit of
  // latent value, and the intercept: it calls an example positive where
  // sum weights[i] * value(latents[i]) + intercept > 0.
  std::vector<double> weights;
  double intercept = 0;
};

struct SparseProbeResult {
  std::vector<int32_t> latents;  // chosen, best first; at most the largest k
  std::vector<ProbeFit> fits;    // one per k, ascending
  // Examples (rows, or sequences when pooled) on each side of the split.
  int64_t train_positive = 0;
  int64_t train_negative = 0;
  int64_t test_positive = 0;
  int64_t test_negative = 0;
  int64_t rows_read = 0;  // every row of both classes
  // The units held out, ascending (pooled: a span per sequence): where to look for the
  // examples a probe gets wrong.
  std::vector<RowSpan> test_positives;
  std::vector<RowSpan> test_negatives;
};

// Probes how well the rows of `positives` are told from those of `negatives` (each as
// LatentsInRowSpans takes spans: ascending, not overlapping, committed). INVALID_ARGUMENT naming
// the field for bad options, bad spans (row_ranges[i] / versus_row_ranges[i]), a row in both
// classes, a class with fewer than 2 units, or (pooled) a span that does not hold whole
// sequences; OUT_OF_RANGE for a span past the committed rows; RESOURCE_EXHAUSTED for more than
// max_rows rows; FAILED_PRECONDITION for a DENSE dataset or pooling without sequences; NOT_FOUND;
// DATA_LOSS naming what is damaged.
absl::StatusOr<SparseProbeResult> SparseProbe(const ChunkStore& store, uint64_t id,
                                              const std::vector<RowSpan>& positives,
                                              const std::vector<RowSpan>& negatives,
                                              const SparseProbeOptions& options);

// Labelled examples as sparse rows: what FitLogistic fits.
struct LabelledExamples {
  std::vector<int64_t> indptr{0};  // example i's entries: [indptr[i], indptr[i + 1])
  std::vector<int32_t> columns;    // each entry's column (>= 0; any order within an example)
  std::vector<double> values;
  std::vector<uint8_t> labels;  // per example, 1 positive, 0 negative

  int64_t size() const { return static_cast<int64_t>(labels.size()); }
};

struct LogisticFit {
  std::vector<double> weights;  // per column, per unit of the column's raw value
  double intercept = 0;
  int32_t iterations = 0;  // Newton steps taken
};

// The L2-penalized logistic regression of the labels on columns [0, `columns`) of the examples
// (entries of later columns are ignored): the log loss summed over the examples plus
// l2 / 2 |w|^2, w the weights of the columns standardized to unit standard deviation over the
// examples (a constant column keeps its scale), the intercept unpenalized; scikit-learn's
// LogisticRegression with C = 1 / l2 on standardized features has the same optimum (centering
// only moves the intercept). Newton's method until no step passes 1e-10 (at most 100 steps),
// the logits clipped at +-50 so that separable classes keep finite weights. l2 > 0. balanced:
// each example's loss weighted by n / (2 n_its_class), scikit-learn's class_weight="balanced",
// so that a rare class counts as much as a common one.
LogisticFit FitLogistic(const LabelledExamples& examples, int32_t columns, double l2,
                        bool balanced = false);

}  // namespace latentd::storage

#endif  // LATENTD_STORAGE_SPARSE_PROBE_H_
