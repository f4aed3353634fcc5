#include "engine/dense_row_source.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace latentd::engine {

InMemoryDenseRowSource::InMemoryDenseRowSource(std::vector<float> values, int64_t width,
                                               int64_t chunk_rows)
    : values_(std::move(values)),
      width_(width),
      chunk_rows_(std::max<int64_t>(chunk_rows, 1)),
      num_rows_(width > 0 ? static_cast<int64_t>(values_.size()) / width : 0) {}

absl::Status DenseRowSource::ReadRanges(const std::vector<RowRange>& ranges, float* out) {
  for (const RowRange& range : ranges) {
    RETURN_IF_ERROR(Read(range.start, range.count, out));
    out += range.count * width();
  }
  return absl::OkStatus();
}

std::vector<int64_t> EvenChunkStarts(int64_t num_rows, int64_t chunk_rows) {
  std::vector<int64_t> starts;
  for (int64_t row = 0; row < num_rows; row += chunk_rows) starts.push_back(row);
  return starts;
}

std::vector<int64_t> InMemoryDenseRowSource::chunk_starts() const {
  return EvenChunkStarts(num_rows_, chunk_rows_);
}

absl::Status InMemoryDenseRowSource::Read(int64_t row_start, int64_t row_count, float* out) {
  if (row_start < 0 || row_count < 0 || row_start + row_count > num_rows_) {
    return absl::OutOfRangeError(absl::StrCat("rows [", row_start, ", ", row_start + row_count,
                                              ") past the end (", num_rows_, " rows)"));
  }
  std::memcpy(out, values_.data() + row_start * width_, sizeof(float) * row_count * width_);
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<SideBySideDenseRowSource>> SideBySideDenseRowSource::Create(
    std::vector<std::unique_ptr<DenseRowSource>> sources) {
  if (sources.empty()) return absl::InvalidArgumentError("no source to put side by side");
  for (size_t i = 1; i < sources.size(); ++i) {
    if (sources[i]->num_rows() != sources[0]->num_rows()) {
      return absl::InvalidArgumentError(absl::StrCat("source ", i, " holds ",
                                                     sources[i]->num_rows(), " rows, source 0 ",
                                                     sources[0]->num_rows()));
    }
  }
  return std::unique_ptr<SideBySideDenseRowSource>(
      new SideBySideDenseRowSource(std::move(sources)));
}

SideBySideDenseRowSource::SideBySideDenseRowSource(
    std::vector<std::unique_ptr<DenseRowSource>> sources)
    : sources_(std::move(sources)) {
  for (const auto& source : sources_) width_ += source->width();
}

absl::Status SideBySideDenseRowSource::Read(int64_t row_start, int64_t row_count, float* out) {
  int64_t offset = 0;  // of the current source's values within a row
  for (const auto& source : sources_) {
    const int64_t w = source->width();
    part_.resize(row_count * w);
    RETURN_IF_ERROR(source->Read(row_start, row_count, part_.data()));
    for (int64_t r = 0; r < row_count; ++r) {
      std::memcpy(out + r * width_ + offset, part_.data() + r * w, sizeof(float) * w);
    }
    offset += w;
  }
  return absl::OkStatus();
}

}  // namespace latentd::engine
