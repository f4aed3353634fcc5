#include "storage/latent_stats.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "absl/status/statusor.h"
#include "common/status_macros.h"
#include "storage/byte_io.h"

namespace latentd::storage {
namespace {

// Bounds of a decoded record (LatentStats::Decode): counts up to 2^48 (sums of a few thousand
// such never overflow), bin exponents inside the range where the window arithmetic is exact.
constexpr uint64_t kMaxCount = uint64_t{1} << 48;
constexpr int32_t kMaxBinExponent = 1023;
constexpr int64_t kMaxBinLow = int64_t{1} << 40;

// floor(x / w) as a bin number, clamped to +-2^62: a bin that far out only asks the window for
// more doublings, and converting a larger double would be undefined.
inline int64_t FloorBin(double x, double w) {
  const double q = std::floor(x / w);
  if (!(q > -0x1p62)) return -(int64_t{1} << 62);
  if (q > 0x1p62) return int64_t{1} << 62;
  return static_cast<int64_t>(q);
}

// floor(v / 2^k), also below zero; k >= 63 leaves the sign.
int64_t FloorShift(int64_t v, int k) {
  k = std::min(k, 63);
  return v >= 0 ? v >> k : -((-(v + 1)) >> k) - 1;
}

// 2^e for -1023 < e < 1024, built from its bits (ldexp was a tenth of the commit profile);
// exact, as ldexp is.
inline double PowerOfTwo(int e) {
  const uint64_t bits = static_cast<uint64_t>(e + 1023) << 52;
  double v;
  std::memcpy(&v, &bits, sizeof(v));
  return v;
}

// floor(x) for |x| < 2^62, without the libm call std::floor is on baseline x86-64.
inline int64_t FloorToInt(double x) {
  const int64_t t = static_cast<int64_t>(x);  // rounds toward zero
  return t - (static_cast<double>(t) > x);
}

}  // namespace

double LatentStats::bin_width() const {
  if (bin_exponent > -1023 && bin_exponent < 1024) return PowerOfTwo(bin_exponent);
  return std::ldexp(1.0, bin_exponent);
}

double LatentStats::stddev() const {
  if (firing_count == 0) return 0;
  double m = mean();
  return std::sqrt(std::max(0.0, sum_squares / firing_count - m * m));
}

void LatentStats::Add(float value) {
  const double v = value;
  if (firing_count == 0 && !std::isfinite(v)) {
    // Never stored (the writer rejects these); a window from it would be undefined.
    max = min = value;
    bin_exponent = 0;
    bin_low = 0;
  } else if (firing_count == 0) {
    max = min = value;
    double magnitude = std::max(std::fabs(v), 1e-30);
    bin_exponent = static_cast<int32_t>(std::ceil(std::log2(magnitude / kHistogramBins)));
    bin_low = v < 0 ? static_cast<int64_t>(std::floor(v / bin_width())) : 0;
  } else {
    max = std::max(max, value);
    min = std::min(min, value);
  }
  ++firing_count;
  sum += v;
  sum_squares += v * v;
  if (!std::isfinite(v)) return;  // the writer rejects these; never loop on them
  if (bin_exponent > -1023 && bin_exponent < 1023) {
    // The common case: no re-binning. v * 2^-e equals v / 2^e exactly (a power of two).
    const double scaled = std::floor(v * PowerOfTwo(-bin_exponent));
    if (scaled >= static_cast<double>(bin_low) &&
        scaled < static_cast<double>(bin_low + kHistogramBins)) {
      histogram[static_cast<int>(scaled - static_cast<double>(bin_low))] += 1;
      return;
    }
  }
  FitWindow(v, v);
  const int64_t bin = FloorBin(v, bin_width()) - bin_low;
  histogram[std::clamp<int64_t>(bin, 0, kHistogramBins - 1)] += 1;
}

// Fits the window [bin_low, bin_low + 50) around the occupied bins, lo, hi and 0: slides it when
// that suffices, else doubles the width (merging bin pairs exactly) and retries. The window that
// results is the narrowest at or above the current width, so fitting a batch's extremes first
// ends where fitting its values one by one would.
void LatentStats::FitWindow(double lo, double hi) {
  while (true) {
    const double w = bin_width();
    // Clamped bins under-count the doublings needed, never over-count: the loop goes on until
    // the exact bins fit, so the window ends as narrow as without clamping.
    const int64_t lo_bin = FloorBin(lo, w);
    const int64_t hi_bin = FloorBin(hi, w);
    // The window always covers the occupied bins: inside it there is nothing to do.
    if (lo_bin >= bin_low && hi_bin < bin_low + kHistogramBins) return;
    int64_t first = lo_bin, last = hi_bin;
    for (int i = 0; i < kHistogramBins; ++i) {
      if (histogram[i] == 0) continue;
      first = std::min(first, bin_low + i);
      last = std::max(last, bin_low + i);
    }
    // The fewest doublings after which a slide suffices (bins nest: floor(b / 2^k) is the bin
    // at k doublings), done at once; doubling one at a time would stop there too, since a
    // window that already holds everything is one a slide could reach.
    int k = 0;
    while (FloorShift(last, k) >= std::min<int64_t>(FloorShift(first, k), 0) + kHistogramBins) {
      ++k;
    }
    if (k == 0) {
      const int64_t new_low = std::min<int64_t>(first, 0);
      std::array<int64_t, kHistogramBins> moved{};
      for (int i = 0; i < kHistogramBins; ++i) {
        if (histogram[i]) moved[bin_low + i - new_low] = histogram[i];
      }
      histogram = moved;
      bin_low = new_low;
      return;
    }
    Widen(k);
  }
}

void LatentStats::Widen(int doublings) {
  std::array<int64_t, kHistogramBins> merged{};
  const int64_t merged_low = FloorShift(bin_low, doublings);
  for (int i = 0; i < kHistogramBins; ++i) {
    merged[FloorShift(bin_low + i, doublings) - merged_low] += histogram[i];
  }
  histogram = merged;
  bin_low = merged_low;
  bin_exponent += doublings;
}

void LatentStats::Merge(const LatentStats& later) {
  if (later.firing_count == 0) return;
  if (firing_count == 0) {
    *this = later;
    return;
  }
  const bool binnable = std::isfinite(later.min) && std::isfinite(later.max) &&
                        later.min <= later.max && bin_exponent > -1023 && bin_exponent < 1023 &&
                        later.bin_exponent > -1023 && later.bin_exponent < 1023;
  if (binnable) {
    FitWindow(later.min, later.max);
    // The fitted window is never narrower than later's own (any window holding 0 and later's
    // first value is at least as wide as later started), except after values below 1e-30,
    // where later's start was clamped: widen to it then.
    if (bin_exponent < later.bin_exponent) Widen(later.bin_exponent - bin_exponent);
    const int shift = bin_exponent - later.bin_exponent;
    for (int i = 0; i < kHistogramBins; ++i) {
      if (later.histogram[i] == 0) continue;
      const int64_t bin = FloorShift(later.bin_low + i, shift);
      histogram[std::clamp<int64_t>(bin - bin_low, 0, kHistogramBins - 1)] += later.histogram[i];
    }
  }
  firing_count += later.firing_count;
  sum += later.sum;
  sum_squares += later.sum_squares;
  max = std::max(max, later.max);
  min = std::min(min, later.min);
}

void LatentStats::AddBatch(const float* values, size_t n) {
  size_t i = 0;
  if (n > 0 && firing_count == 0) Add(values[i++]);  // the first value sets the initial width
  if (i >= n) return;
  float lo = values[i], hi = values[i];
  bool finite = true;
  for (size_t j = i; j < n; ++j) {
    lo = std::min(lo, values[j]);
    hi = std::max(hi, values[j]);
    finite &= std::isfinite(values[j]);
  }
  if (!finite || bin_exponent <= -1023 || bin_exponent >= 1023) {
    for (; i < n; ++i) Add(values[i]);
    return;
  }
  FitWindow(lo, hi);
  max = std::max(max, hi);
  min = std::min(min, lo);
  firing_count += static_cast<int64_t>(n - i);
  const double inverse_width = PowerOfTwo(-bin_exponent);  // exact
  double s = sum, ss = sum_squares;
  for (; i < n; ++i) {
    const double v = values[i];
    s += v;
    ss += v * v;
    const int64_t bin = FloorToInt(v * inverse_width) - bin_low;
    histogram[std::clamp<int64_t>(bin, 0, kHistogramBins - 1)] += 1;
  }
  sum = s;
  sum_squares = ss;
}

std::string LatentStats::Encode() const {
  std::string out;
  AppendEncoded(&out);
  return out;
}

void LatentStats::AppendEncoded(std::string* out) const {
  PutRaw<int64_t>(firing_count, out);
  PutRaw<double>(sum, out);
  PutRaw<double>(sum_squares, out);
  PutRaw<float>(max, out);
  PutRaw<float>(min, out);
  PutRaw<int32_t>(bin_exponent, out);
  PutRaw<int64_t>(bin_low, out);
  for (int64_t c : histogram) PutVarint(static_cast<uint64_t>(c), out);
}

absl::Status LatentStats::Decode(absl::string_view in, LatentStats* out) {
  ByteReader rd(in);
  out->firing_count = rd.Raw<int64_t>();
  out->sum = rd.Raw<double>();
  out->sum_squares = rd.Raw<double>();
  out->max = rd.Raw<float>();
  out->min = rd.Raw<float>();
  out->bin_exponent = rd.Raw<int32_t>();
  out->bin_low = rd.Raw<int64_t>();
  uint64_t binned = 0;
  for (int64_t& c : out->histogram) {
    const uint64_t v = rd.Varint();
    binned += std::min(v, kMaxCount + 1);
    c = static_cast<int64_t>(std::min(v, kMaxCount + 1));
  }
  // What every record the writer makes satisfies, and what the arithmetic on records (Merge,
  // the histogram's window) relies on: a corrupt record that passed would otherwise overflow
  // counts or index bins by garbage. The window never starts above bin 0.
  const bool valid = rd.ok() && rd.rest().empty() && out->firing_count >= 0 &&
                     static_cast<uint64_t>(out->firing_count) <= kMaxCount &&
                     binned <= static_cast<uint64_t>(out->firing_count) &&
                     std::isfinite(out->sum) && std::isfinite(out->sum_squares) &&
                     out->sum_squares >= 0 && out->bin_exponent > -kMaxBinExponent &&
                     out->bin_exponent < kMaxBinExponent && out->bin_low <= 0 &&
                     out->bin_low >= -kMaxBinLow &&
                     (out->firing_count == 0 ||
                      (std::isfinite(out->min) && std::isfinite(out->max) && out->min <= out->max));
  if (!valid) return absl::DataLossError("malformed latent statistics record");
  return absl::OkStatus();
}

namespace {

// The order of a top-N list: value descending, then row ascending.
// (A function object, so that sorts and searches inline it.)
struct Better {
  bool operator()(const TopEntry& a, const TopEntry& b) const {
    return a.value != b.value ? a.value > b.value : a.row < b.row;
  }
};

}  // namespace

bool TopRows::Offer(int64_t row, float value, int capacity) {
  if (capacity <= 0) return false;
  const Better better;
  TopEntry e{row, value};
  if (static_cast<int>(entries_.size()) >= capacity && !better(e, entries_.back())) return false;
  if (row <= max_row_) {  // rows arrive ascending, so only a replay can be already here
    for (const TopEntry& x : entries_) {
      if (x.row == row) return false;
    }
  }
  max_row_ = std::max(max_row_, row);
  // e beats a full list's last entry (checked above): drop that one first, so that the vector
  // never grows past `capacity` (its doubling would hold 2x the list for every latent).
  if (static_cast<int>(entries_.size()) >= capacity) entries_.pop_back();
  entries_.insert(std::upper_bound(entries_.begin(), entries_.end(), e, better), e);
  return true;
}

bool TopRows::OfferRun(int64_t row_base, const uint32_t* offsets, const float* values, size_t n,
                       int capacity, float floor) {
  if (capacity <= 0) return false;
  bool changed = false;
  for (size_t i = 0; i < n; ++i) {
    // Below a full list's last value nothing can enter (a tie may: Offer orders it by row).
    const float last = static_cast<int>(entries_.size()) >= capacity
                           ? entries_.back().value
                           : -std::numeric_limits<float>::infinity();
    while (i < n && (values[i] < last || values[i] <= floor)) ++i;
    if (i == n) break;
    changed |= Offer(row_base + offsets[i], values[i], capacity);
  }
  return changed;
}

namespace {

// A top-N list: varint count, then per entry varint row and f32 value; only the entries `keep`
// accepts. (The count is known after the pass: written into a reserved byte.)
template <typename Keep>
void AppendList(const std::vector<TopEntry>& entries, Keep keep, std::string* out) {
  const size_t start = ReserveVarint(1, out);
  uint64_t n = 0;
  for (const TopEntry& e : entries) {
    if (!keep(e)) continue;
    ++n;
    PutVarint(static_cast<uint64_t>(e.row), out);
    PutRaw<float>(e.value, out);
  }
  PatchVarint(start, 1, n, out);
}

// One list of a block: its byte length, then the list; a list with no entry kept is the length
// 0 alone.
template <typename Keep>
void AppendBlockList(const std::vector<TopEntry>& entries, Keep keep, std::string* out) {
  const size_t start = ReserveVarint(2, out);
  AppendList(entries, keep, out);
  if (out->size() - start == 1 && (*out)[start] == 0) out->resize(start);  // count 0
  PatchVarint(start, 2, out->size() - start, out);
}

const auto kKeepAll = [](const TopEntry&) { return true; };

// Appends the entries of one encoded list to *entries. DATA_LOSS when malformed.
absl::Status ParseList(absl::string_view in, std::vector<TopEntry>* entries) {
  ByteReader rd(in);
  const uint64_t n = rd.Varint();
  if (!rd.ok() || n > in.size()) return absl::DataLossError("malformed top-N record");
  // Lists are stored in their order (Better), rows non-negative and values finite, as the
  // writer keeps them; merges and readers rely on it.
  const size_t first = entries->size();
  bool ordered = true;
  for (uint64_t i = 0; i < n && rd.ok(); ++i) {
    const TopEntry e{static_cast<int64_t>(rd.Varint()), rd.Raw<float>()};
    ordered &= e.row >= 0 && std::isfinite(e.value) &&
               (entries->size() == first || Better()(entries->back(), e));
    entries->push_back(e);
  }
  if (!rd.ok() || !rd.rest().empty() || !ordered) {
    return absl::DataLossError("malformed top-N record");
  }
  return absl::OkStatus();
}

// Calls visit(i, list_bytes) for each list of a block body; the number of lists, or DATA_LOSS.
template <typename Visit>
absl::StatusOr<int32_t> ForEachTopList(absl::string_view in, Visit visit) {
  ByteReader rd(in);
  int32_t i = 0;
  while (!rd.rest().empty()) {
    const uint64_t len = rd.Varint();
    if (!rd.ok() || len > rd.rest().size()) return absl::DataLossError("malformed top-N block");
    absl::Status s = visit(i++, rd.rest().substr(0, len));
    if (!s.ok()) return s;
    rd.Skip(len);
  }
  return i;
}

}  // namespace

std::string TopRows::Encode() const {
  std::string out;
  AppendList(entries_, kKeepAll, &out);
  return out;
}

absl::Status TopRows::Decode(absl::string_view in, TopRows* out) {
  out->entries_.clear();
  out->max_row_ = -1;
  RETURN_IF_ERROR(ParseList(in, &out->entries_));
  for (const TopEntry& e : out->entries_) out->max_row_ = std::max(out->max_row_, e.row);
  return absl::OkStatus();
}

std::string EncodeTopBlock(const TopRows* lists, int32_t n) {
  std::string out;
  for (int32_t i = 0; i < n; ++i) AppendBlockList(lists[i].entries(), kKeepAll, &out);
  return out;
}

namespace {

// ForEachTopList over a block that must hold exactly n lists.
template <typename Visit>
absl::Status ForEachListOfBlock(absl::string_view in, int32_t n, Visit visit) {
  auto lists = ForEachTopList(in, [&](int32_t i, absl::string_view list) {
    if (i >= n) return absl::DataLossError("malformed top-N block: too many lists");
    return visit(i, list);
  });
  if (!lists.ok()) return lists.status();
  if (*lists != n) return absl::DataLossError("malformed top-N block: too few lists");
  return absl::OkStatus();
}

}  // namespace

absl::Status DecodeTopBlock(absl::string_view in, TopRows* out, int32_t n) {
  return ForEachListOfBlock(in, n, [&](int32_t i, absl::string_view list) {
    out[i] = TopRows();
    return list.empty() ? absl::OkStatus() : TopRows::Decode(list, &out[i]);
  });
}

absl::Status DecodeTopBlockList(absl::string_view in, int32_t n, int32_t index, TopRows* out) {
  *out = TopRows();
  return ForEachListOfBlock(in, n, [&](int32_t i, absl::string_view list) {
    return i != index || list.empty() ? absl::OkStatus() : TopRows::Decode(list, out);
  });
}

std::string EncodeTopDelta(const TopRows* lists, int32_t n, int capacity, int64_t min_row) {
  std::string out;
  PutVarint(static_cast<uint64_t>(capacity), &out);
  for (int32_t i = 0; i < n; ++i) {
    if (lists[i].max_row() < min_row) {  // nothing new in this list: skip the scan
      PutVarint(0, &out);
      continue;
    }
    AppendBlockList(
        lists[i].entries(), [min_row](const TopEntry& e) { return e.row >= min_row; }, &out);
  }
  return out;
}

absl::Status MergeTopBlocks(const absl::string_view* base,
                            const std::vector<absl::string_view>& operands, bool as_operand,
                            std::string* out) {
  int64_t capacity = -1;  // every operand of a dataset carries the same
  std::vector<absl::string_view> bodies;
  bodies.reserve(operands.size() + 1);
  if (base != nullptr) bodies.push_back(*base);
  for (absl::string_view op : operands) {
    ByteReader rd(op);
    const uint64_t cap = rd.Varint();
    if (!rd.ok() || cap > (uint64_t{1} << 31)) {
      return absl::DataLossError("malformed top-N operand");
    }
    if (capacity >= 0 && static_cast<int64_t>(cap) != capacity) {
      return absl::DataLossError("top-N merge: operands of different capacities");
    }
    capacity = static_cast<int64_t>(cap);
    bodies.push_back(rd.rest());
  }
  // Every list's entries from every input. The first input's part of each list is sorted
  // already; first_run marks where it ends.
  std::vector<std::vector<TopEntry>> lists;
  std::vector<size_t> first_run;
  int32_t latents = -1;  // every input must hold this many lists
  for (absl::string_view body : bodies) {
    auto n = ForEachTopList(body, [&](int32_t i, absl::string_view bytes) {
      if (static_cast<size_t>(i) >= lists.size()) lists.resize(i + 1);
      return bytes.empty() ? absl::OkStatus() : ParseList(bytes, &lists[i]);
    });
    if (!n.ok()) return n.status();
    if (latents >= 0 && *n != latents) {
      return absl::DataLossError("top-N merge: blocks of different latent counts");
    }
    if (first_run.empty()) {
      for (const std::vector<TopEntry>& list : lists) first_run.push_back(list.size());
    }
    latents = *n;
  }
  out->clear();
  if (as_operand) PutVarint(static_cast<uint64_t>(std::max<int64_t>(capacity, 0)), out);
  std::vector<TopEntry> merged;
  for (size_t i = 0; i < lists.size(); ++i) {
    std::vector<TopEntry>& list = lists[i];
    // Sort what the later inputs added (a few entries each), then merge it with the first run.
    const auto mid = list.begin() + static_cast<std::ptrdiff_t>(first_run[i]);
    std::sort(mid, list.end(), Better());
    merged.resize(list.size());
    std::merge(list.begin(), mid, mid, list.end(), merged.begin(), Better());
    list.swap(merged);
    // A replayed operand repeats (row, value) pairs, which the merge puts side by side.
    list.erase(std::unique(list.begin(), list.end(),
                           [](const TopEntry& a, const TopEntry& b) {
                             return a.row == b.row && a.value == b.value;
                           }),
               list.end());
    if (capacity >= 0 && static_cast<int64_t>(list.size()) > capacity) list.resize(capacity);
    AppendBlockList(list, kKeepAll, out);
  }
  return absl::OkStatus();
}

std::string EncodeStatsBlock(const LatentStats* stats, int32_t n) {
  std::string out;
  for (int32_t l = 0; l < n; ++l) {
    if (stats[l].firing_count == 0) {
      PutVarint(0, &out);
      continue;
    }
    const size_t start = ReserveVarint(2, &out);  // records are 44 to ~550 bytes
    stats[l].AppendEncoded(&out);
    PatchVarint(start, 2, out.size() - start, &out);
  }
  return out;
}

namespace {

// Calls visit(i, record_bytes) for each record of a statistics block (at most `capacity`);
// the number of records, or DATA_LOSS.
template <typename Visit>
absl::StatusOr<int32_t> ForEachStatsRecord(absl::string_view in, int32_t capacity, Visit visit) {
  ByteReader rd(in);
  int32_t count = 0;
  while (!rd.rest().empty()) {
    const uint64_t len = rd.Varint();
    if (!rd.ok() || len > rd.rest().size() || count == capacity) {
      return absl::DataLossError("malformed latent statistics block");
    }
    RETURN_IF_ERROR(visit(count++, rd.rest().substr(0, len)));
    rd.Skip(len);
  }
  return count;
}

// Decodes the records of a block into out[0, count), count <= capacity.
absl::StatusOr<int32_t> DecodeStatsRecords(absl::string_view in, LatentStats* out,
                                           int32_t capacity) {
  return ForEachStatsRecord(in, capacity, [&](int32_t i, absl::string_view record) {
    out[i] = LatentStats();
    return record.empty() ? absl::OkStatus() : LatentStats::Decode(record, &out[i]);
  });
}

}  // namespace

absl::Status DecodeStatsBlockRecord(absl::string_view in, int32_t n, int32_t index,
                                    LatentStats* out) {
  *out = LatentStats();
  ASSIGN_OR_RETURN(
      const int32_t count, ForEachStatsRecord(in, n, [&](int32_t i, absl::string_view record) {
        return i != index || record.empty() ? absl::OkStatus() : LatentStats::Decode(record, out);
      }));
  if (count != n) return absl::DataLossError("malformed latent statistics block");
  return absl::OkStatus();
}

absl::Status DecodeStatsBlock(absl::string_view in, LatentStats* out, int32_t n) {
  ASSIGN_OR_RETURN(const int32_t count, DecodeStatsRecords(in, out, n));
  if (count != n) return absl::DataLossError("malformed latent statistics block");
  return absl::OkStatus();
}

StatsDeltaBuilder::StatsDeltaBuilder(int32_t block_size) : block_size_(block_size) {}

void StatsDeltaBuilder::Add(int32_t offset, const LatentStats& delta, const float* values) {
  ++entries_;
  PutVarint(static_cast<uint64_t>(offset), &body_);
  PutVarint(static_cast<uint64_t>(delta.firing_count), &body_);
  if (delta.firing_count <= kRawStatsValues) {
    for (int64_t i = 0; i < delta.firing_count; ++i) PutRaw<float>(values[i], &body_);
    return;
  }
  const size_t start = ReserveVarint(2, &body_);
  delta.AppendEncoded(&body_);
  PatchVarint(start, 2, body_.size() - start, &body_);
}

std::string StatsDeltaBuilder::Finish() {
  std::string out;
  PutVarint(static_cast<uint64_t>(block_size_), &out);
  PutVarint(entries_, &out);
  out += body_;
  body_.clear();
  entries_ = 0;
  return out;
}

absl::Status MergeStatsBlocks(const absl::string_view* base,
                              const std::vector<absl::string_view>& operands, std::string* out) {
  const absl::Status malformed = absl::DataLossError("malformed latent statistics operand");
  std::vector<LatentStats> block(kLatentsPerBlock);
  bool sized = base != nullptr;
  if (sized) {
    ASSIGN_OR_RETURN(const int32_t count,
                     DecodeStatsRecords(*base, block.data(), kLatentsPerBlock));
    block.resize(count);
  }
  float raw[kRawStatsValues];
  for (absl::string_view op : operands) {
    ByteReader rd(op);
    const uint64_t n = rd.Varint();
    const uint64_t entries = rd.Varint();
    if (!rd.ok() || n == 0 || n > static_cast<uint64_t>(kLatentsPerBlock)) return malformed;
    if (!sized) {
      block.resize(n);
      sized = true;
    }
    if (n != block.size()) return malformed;
    for (uint64_t e = 0; e < entries; ++e) {
      const uint64_t offset = rd.Varint();
      const uint64_t count = rd.Varint();
      if (!rd.ok() || offset >= n) return malformed;
      LatentStats delta;
      if (count <= kRawStatsValues) {
        bool finite = true;
        for (uint64_t i = 0; i < count; ++i) {
          raw[i] = rd.Raw<float>();
          finite &= std::isfinite(raw[i]);
        }
        if (!rd.ok() || !finite) return malformed;  // the writer stores finite values only
        delta.AddBatch(raw, count);
      } else {
        const uint64_t len = rd.Varint();
        if (!rd.ok() || len > rd.rest().size()) return malformed;
        RETURN_IF_ERROR(LatentStats::Decode(rd.rest().substr(0, len), &delta));
        rd.Skip(len);
        if (delta.firing_count != static_cast<int64_t>(count)) return malformed;
      }
      block[offset].Merge(delta);
    }
    if (!rd.ok() || !rd.rest().empty()) return malformed;
  }
  *out = EncodeStatsBlock(block.data(), static_cast<int32_t>(block.size()));
  return absl::OkStatus();
}

}  // namespace latentd::storage
