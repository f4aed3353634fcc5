#include "engine/train_data.h"

#include <algorithm>
#include <cstring>
#include <numeric>
#include <random>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace latentd::engine {
namespace {

// splitmix64: a well-mixed 64-bit seed for each (seed, epoch, window), independent of the C++
// library's distribution implementations (we shuffle with our own Fisher-Yates below).
uint64_t Mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

template <typename T>
void Shuffle(std::vector<T>* items, uint64_t seed) {
  std::mt19937_64 rng(seed);
  for (size_t i = items->size(); i > 1; --i) {
    const size_t j = static_cast<size_t>(rng() % i);
    std::swap((*items)[i - 1], (*items)[j]);
  }
}

}  // namespace

ShuffledRowStream::ShuffledRowStream(DenseRowSource* source, ShuffledRowStreamOptions options)
    : source_(source), options_(options) {
  options_.window_chunks = std::max(options_.window_chunks, 1);
  starts_ = source_->chunk_starts();
  if (starts_.empty() || starts_.front() != 0) starts_.insert(starts_.begin(), 0);
  starts_.push_back(source_->num_rows());
}

absl::Status ShuffledRowStream::LoadWindow(int64_t epoch, int64_t in_epoch_position) {
  const int64_t num_chunks = static_cast<int64_t>(starts_.size()) - 1;
  if (epoch != epoch_order_epoch_) {
    epoch_order_.resize(num_chunks);
    std::iota(epoch_order_.begin(), epoch_order_.end(), 0);
    Shuffle(&epoch_order_, Mix(options_.seed ^ Mix(static_cast<uint64_t>(epoch))));
    window_offsets_.clear();
    int64_t offset = 0;
    for (int64_t c = 0; c < num_chunks; ++c) {
      if (c % options_.window_chunks == 0) window_offsets_.push_back(offset);
      const int64_t chunk = epoch_order_[c];
      offset += starts_[chunk + 1] - starts_[chunk];
    }
    epoch_order_epoch_ = epoch;
  }
  const int64_t w =
      std::upper_bound(window_offsets_.begin(), window_offsets_.end(), in_epoch_position) -
      window_offsets_.begin() - 1;
  if (window_.epoch == epoch && window_.index == w) return absl::OkStatus();
  const int64_t width = source_->width();
  int64_t rows = 0;
  const int64_t first = w * options_.window_chunks;
  const int64_t last = std::min<int64_t>(first + options_.window_chunks, num_chunks);
  std::vector<RowRange> chunks;
  for (int64_t c = first; c < last; ++c) {
    const int64_t chunk = epoch_order_[c];
    chunks.push_back({starts_[chunk], starts_[chunk + 1] - starts_[chunk]});
    rows += chunks.back().count;
  }
  std::vector<float> raw(rows * width);
  RETURN_IF_ERROR(source_->ReadRanges(chunks, raw.data()));
  std::vector<int64_t> order(rows);
  std::iota(order.begin(), order.end(), 0);
  Shuffle(&order, Mix(options_.seed ^ Mix(static_cast<uint64_t>(epoch) * 0x100000001ULL +
                                          static_cast<uint64_t>(w) + 1)));
  window_.rows.resize(rows * width);
  for (int64_t i = 0; i < rows; ++i) {
    std::memcpy(window_.rows.data() + i * width, raw.data() + order[i] * width,
                sizeof(float) * width);
  }
  window_.epoch = epoch;
  window_.index = w;
  window_.first_position = window_offsets_[w];
  window_.num_rows = rows;
  return absl::OkStatus();
}

absl::Status ShuffledRowStream::Read(int64_t position, int64_t count, float* out) {
  const int64_t total = source_->num_rows();
  const int64_t width = source_->width();
  if (total <= 0) return absl::FailedPreconditionError("the dataset has no rows");
  if (position < 0) return absl::OutOfRangeError(absl::StrCat("position ", position));
  while (count > 0) {
    const int64_t epoch = position / total;
    const int64_t in_epoch = position % total;
    RETURN_IF_ERROR(LoadWindow(epoch, in_epoch));
    const int64_t offset = in_epoch - window_.first_position;
    const int64_t take = std::min(count, window_.num_rows - offset);
    std::memcpy(out, window_.rows.data() + offset * width, sizeof(float) * take * width);
    out += take * width;
    position += take;
    count -= take;
  }
  return absl::OkStatus();
}

}  // namespace latentd::engine
