#include "storage/latent_stats.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "storage/byte_io.h"

namespace latentd::storage {
namespace {

int64_t FloorDiv2(int64_t v) { return v >= 0 ? v / 2 : -((-v + 1) / 2); }

}  // namespace

// 2^e built from its bits (ldexp was a tenth of the commit profile); exact, as ldexp is.
double LatentStats::bin_width() const {
  if (bin_exponent > -1023 && bin_exponent < 1024) {
    const uint64_t bits = static_cast<uint64_t>(bin_exponent + 1023) << 52;
    double w;
    std::memcpy(&w, &bits, sizeof(w));
    return w;
  }
  return std::ldexp(1.0, bin_exponent);
}

double LatentStats::stddev() const {
  if (firing_count == 0) return 0;
  double m = mean();
  return std::sqrt(std::max(0.0, sum_squares / firing_count - m * m));
}

void LatentStats::Add(float value) {
  const double v = value;
  if (firing_count == 0) {
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
    const uint64_t bits = static_cast<uint64_t>(1023 - bin_exponent) << 52;
    double inverse_width;
    std::memcpy(&inverse_width, &bits, sizeof(inverse_width));
    const double scaled = std::floor(v * inverse_width);
    if (scaled >= static_cast<double>(bin_low) &&
        scaled < static_cast<double>(bin_low + kHistogramBins)) {
      histogram[static_cast<int>(scaled - static_cast<double>(bin_low))] += 1;
      return;
    }
  }
  // Fit the window [bin_low, bin_low + 50) around the occupied bins, the new value and 0:
  // slide it when that suffices, else double the width (merging bin pairs exactly) and retry.
  while (true) {
    const int64_t vb = static_cast<int64_t>(std::floor(v / bin_width()));
    int64_t first = vb, last = vb;
    for (int i = 0; i < kHistogramBins; ++i) {
      if (histogram[i] == 0) continue;
      first = std::min(first, bin_low + i);
      last = std::max(last, bin_low + i);
    }
    const int64_t new_low = std::min<int64_t>(first, 0);
    if (last < new_low + kHistogramBins) {
      if (new_low != bin_low) {
        std::array<int64_t, kHistogramBins> moved{};
        for (int i = 0; i < kHistogramBins; ++i) {
          if (histogram[i]) moved[bin_low + i - new_low] = histogram[i];
        }
        histogram = moved;
        bin_low = new_low;
      }
      break;
    }
    std::array<int64_t, kHistogramBins> merged{};
    const int64_t merged_low = FloorDiv2(bin_low);
    for (int i = 0; i < kHistogramBins; ++i) {
      merged[FloorDiv2(bin_low + i) - merged_low] += histogram[i];
    }
    histogram = merged;
    bin_low = merged_low;
    ++bin_exponent;
  }
  int bin = static_cast<int>(std::floor(v / bin_width()) - bin_low);
  histogram[std::clamp(bin, 0, kHistogramBins - 1)] += 1;
}

std::string LatentStats::Encode() const {
  std::string out;
  PutRaw<int64_t>(firing_count, &out);
  PutRaw<double>(sum, &out);
  PutRaw<double>(sum_squares, &out);
  PutRaw<float>(max, &out);
  PutRaw<float>(min, &out);
  PutRaw<int32_t>(bin_exponent, &out);
  PutRaw<int64_t>(bin_low, &out);
  for (int64_t c : histogram) PutVarint(static_cast<uint64_t>(c), &out);
  return out;
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
  for (int64_t& c : out->histogram) c = static_cast<int64_t>(rd.Varint());
  if (!rd.ok() || !rd.rest().empty()) {
    return absl::DataLossError("malformed latent statistics record");
  }
  return absl::OkStatus();
}

bool TopRows::Offer(int64_t row, float value, int capacity) {
  if (capacity <= 0) return false;
  auto better = [](const TopEntry& a, const TopEntry& b) {
    return a.value != b.value ? a.value > b.value : a.row < b.row;
  };
  TopEntry e{row, value};
  if (static_cast<int>(entries_.size()) >= capacity && !better(e, entries_.back())) return false;
  if (row <= max_row_) {  // rows arrive ascending, so only a replay can be already here
    for (const TopEntry& x : entries_) {
      if (x.row == row) return false;
    }
  }
  max_row_ = std::max(max_row_, row);
  entries_.insert(std::upper_bound(entries_.begin(), entries_.end(), e, better), e);
  if (static_cast<int>(entries_.size()) > capacity) entries_.pop_back();
  return true;
}

static int VarintBytes(uint64_t v) {
  int n = 1;
  while (v >= 0x80) v >>= 7, ++n;
  return n;
}

std::string TopRows::Encode() const {
  std::string out;
  AppendEncoded(&out);
  return out;
}

size_t TopRows::EncodedSize() const {
  size_t n = VarintBytes(entries_.size()) + 4 * entries_.size();
  for (const TopEntry& e : entries_) n += VarintBytes(static_cast<uint64_t>(e.row));
  return n;
}

void TopRows::AppendEncoded(std::string* out) const {
  const size_t at = out->size();
  out->resize(at + EncodedSize());
  char* p = &(*out)[at];
  auto varint = [&p](uint64_t v) {
    while (v >= 0x80) {
      *p++ = static_cast<char>(v | 0x80);
      v >>= 7;
    }
    *p++ = static_cast<char>(v);
  };
  varint(entries_.size());
  for (const TopEntry& e : entries_) {
    varint(static_cast<uint64_t>(e.row));
    std::memcpy(p, &e.value, 4);
    p += 4;
  }
}

absl::Status TopRows::Decode(absl::string_view in, TopRows* out) {
  ByteReader rd(in);
  out->entries_.clear();
  out->max_row_ = -1;
  const uint64_t n = rd.Varint();
  if (!rd.ok() || n > in.size()) return absl::DataLossError("malformed top-N record");
  for (uint64_t i = 0; i < n && rd.ok(); ++i) {
    const int64_t row = static_cast<int64_t>(rd.Varint());
    const float value = rd.Raw<float>();
    out->entries_.push_back({row, value});
    out->max_row_ = std::max(out->max_row_, row);
  }
  if (!rd.ok() || !rd.rest().empty()) return absl::DataLossError("malformed top-N record");
  return absl::OkStatus();
}

}  // namespace latentd::storage
