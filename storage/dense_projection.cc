#include "storage/dense_projection.h"

#include <algorithm>
#include <cmath>
#include <queue>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace latentd::storage {
namespace {

// Floats decoded per read of the scan (16 MB).
constexpr int64_t kScanFloats = int64_t{1} << 22;

// a . b over n floats, in kLanes independent partial sums, which the compiler may keep in
// vector registers (one running sum fixes the order of the additions, and so scalar code).
float Dot(const float* a, const float* b, int32_t n) {
  constexpr int kLanes = 8;
  float lanes[kLanes] = {};
  int32_t k = 0;
  for (; k + kLanes <= n; k += kLanes) {
    for (int l = 0; l < kLanes; ++l) lanes[l] += a[k + l] * b[k + l];
  }
  float sum = 0;
  for (; k < n; ++k) sum += a[k] * b[k];
  for (float lane : lanes) sum += lane;
  return sum;
}

absl::Status CheckDirection(const std::vector<float>& direction, int32_t width) {
  if (static_cast<int64_t>(direction.size()) != width) {
    return absl::InvalidArgumentError(
        absl::StrCat("direction: ", direction.size(), " values; the dataset's rows have ", width));
  }
  bool any = false;
  for (size_t i = 0; i < direction.size(); ++i) {
    if (!std::isfinite(direction[i])) {
      return absl::InvalidArgumentError(
          absl::StrCat("direction[", i, "]: ", direction[i], " is not finite"));
    }
    any = any || direction[i] != 0.0f;
  }
  if (!any) return absl::InvalidArgumentError("direction: all zeros, no direction to project on");
  return absl::OkStatus();
}

// The first n candidates in the order `before` (a strict total order on row offsets), in that
// order: one pass over them with a heap of n, whose top is the last kept.
template <typename Before, typename ForEachCandidate>
std::vector<int64_t> Best(size_t n, Before before, ForEachCandidate for_each_candidate) {
  std::priority_queue<int64_t, std::vector<int64_t>, Before> kept(before);
  for_each_candidate([&](int64_t i) {
    if (kept.size() < n) {
      kept.push(i);
    } else if (before(i, kept.top())) {
      kept.pop();
      kept.push(i);
    }
  });
  std::vector<int64_t> out;
  out.reserve(kept.size());
  for (; !kept.empty(); kept.pop()) out.push_back(kept.top());
  std::reverse(out.begin(), out.end());
  return out;
}

}  // namespace

absl::Status CheckProjectionOptions(const ProjectionOptions& o) {
  const auto outside = [](const char* field, int64_t value, int64_t lo, int64_t hi) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": ", value, " outside [", lo, ", ", hi, "]"));
  };
  if (o.top_n < 1 || o.top_n > kMaxProjectionTop) {
    return outside("top_n", o.top_n, 1, kMaxProjectionTop);
  }
  if (o.bins < 1 || o.bins > kMaxProjectionBins) {
    return outside("bins", o.bins, 1, kMaxProjectionBins);
  }
  if (o.context_before < 0 || o.context_before > kMaxProjectionContext) {
    return outside("context_before", o.context_before, 0, kMaxProjectionContext);
  }
  if (o.context_after < 0 || o.context_after > kMaxProjectionContext) {
    return outside("context_after", o.context_after, 0, kMaxProjectionContext);
  }
  return absl::OkStatus();
}

absl::StatusOr<Projection> ProjectDenseRows(const ChunkStore& store, uint64_t id,
                                            const std::vector<float>& direction,
                                            const ProjectionOptions& options) {
  RETURN_IF_ERROR(CheckProjectionOptions(options));
  ASSIGN_OR_RETURN(const DatasetRecord rec, store.GetRecord(id));
  if (rec.meta.kind != DatasetKind::kDense) {
    return absl::FailedPreconditionError(
        absl::StrCat("dataset ", id,
                     " is SPARSE: a direction is projected on the hidden states of a DENSE one"));
  }
  const int32_t width = rec.meta.width;
  RETURN_IF_ERROR(CheckDirection(direction, width));
  int64_t row_count = options.row_count;
  RETURN_IF_ERROR(CheckRowRange(rec, options.row_start, &row_count));
  if (row_count > kMaxProjectionRows) {
    return absl::ResourceExhaustedError(
        absl::StrCat("row_count: ", row_count, " rows, more than the ", kMaxProjectionRows,
                     " one projection scans; project a range of them (row_start, row_count)"));
  }
  const int64_t start = options.row_start;
  const bool cosine = options.measure == ProjectionMeasure::kCosine;
  double direction_norm = 0;
  for (float v : direction) direction_norm += static_cast<double>(v) * v;
  direction_norm = std::sqrt(direction_norm);

  // Every row's projection and token, p[i] and tokens[i] of row start + i: the windows are
  // cut from them (reading a window's tokens again would read its chunk's values again).
  std::vector<float> p(row_count);
  std::vector<int32_t> tokens;
  tokens.reserve(row_count);
  std::vector<float> values;
  std::vector<int32_t> block_tokens;
  const int64_t block = std::max<int64_t>(1, kScanFloats / width);
  for (int64_t done = 0; done < row_count;) {
    const int64_t n = std::min(block, row_count - done);
    RETURN_IF_ERROR(store.ReadDense(id, start + done, n, &values, &block_tokens));
    tokens.insert(tokens.end(), block_tokens.begin(), block_tokens.end());
    for (int64_t r = 0; r < n; ++r) {
      const float* x = values.data() + r * width;
      const float dot = Dot(x, direction.data(), width);
      if (!cosine) {
        p[done + r] = dot;
        continue;
      }
      const float squares = Dot(x, x, width);
      p[done + r] =
          squares > 0 ? static_cast<float>(dot / (std::sqrt(squares) * direction_norm)) : 0.0f;
    }
    done += n;
  }

  Projection out;
  out.rows = row_count;
  out.histogram.assign(options.bins, 0);
  if (row_count == 0) return out;
  const auto [lo, hi] = std::minmax_element(p.begin(), p.end());
  out.min = *lo;
  out.max = *hi;
  double sum = 0;
  for (float v : p) sum += v;
  out.mean = sum / row_count;
  double squares = 0;
  for (float v : p) squares += (v - out.mean) * (v - out.mean);
  out.stddev = std::sqrt(squares / row_count);
  out.bin_width = (static_cast<double>(out.max) - out.min) / options.bins;
  for (float v : p) {
    const int64_t b = out.bin_width > 0 ? static_cast<int64_t>((v - out.min) / out.bin_width) : 0;
    ++out.histogram[std::min<int64_t>(b, options.bins - 1)];
  }

  // Sequence boundaries in the scanned rows: every context_length rows of the dataset (none
  // when it has no sequences).
  const int64_t sequence = rec.meta.context_length;
  const auto sequence_start = [&](int64_t i) {  // the first scanned row of i's sequence
    return sequence > 0 ? std::max<int64_t>(0, (start + i) / sequence * sequence - start) : 0;
  };
  const auto sequence_end = [&](int64_t i) {  // past its last scanned row
    return sequence > 0 ? std::min(row_count, ((start + i) / sequence + 1) * sequence - start)
                        : row_count;
  };
  const auto listed = [&](bool largest) {
    const auto before = [&p, largest](int64_t a, int64_t b) {
      if (p[a] != p[b]) return largest ? p[a] > p[b] : p[a] < p[b];
      return a < b;
    };
    return Best(options.top_n, before, [&](const auto& visit) {
      if (!options.distinct_sequences) {
        for (int64_t i = 0; i < row_count; ++i) visit(i);
        return;
      }
      for (int64_t first = 0; first < row_count; first = sequence_end(first)) {
        int64_t best = first;
        for (int64_t i = first + 1; i < sequence_end(first); ++i) {
          if (before(i, best)) best = i;
        }
        visit(best);
      }
    });
  };
  for (const bool largest : {true, false}) {
    std::vector<TopActivationContext>& list = largest ? out.largest : out.smallest;
    for (int64_t i : listed(largest)) {
      TopActivationContext& t = list.emplace_back();
      t.row = start + i;
      t.value = p[i];
      const int64_t first = std::max(i - options.context_before, sequence_start(i));
      const int64_t last = std::min(i + options.context_after, sequence_end(i) - 1);
      t.token_id = tokens[i];
      t.context_start_row = start + first;
      t.context_token_ids.assign(tokens.begin() + first, tokens.begin() + last + 1);
      t.context_values.assign(p.begin() + first, p.begin() + last + 1);
    }
  }
  return out;
}

}  // namespace latentd::storage
