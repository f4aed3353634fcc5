#include "storage/reconstruction_fit.h"

#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "storage/byte_io.h"
#include "storage/crc32c.h"

namespace latentd::storage {

absl::StatusOr<ReconstructionFit> ReconstructionFit::FromSums(const double* sums, int64_t n) {
  if (n < 4 || n - 4 > kMaxFitDimensions) {
    return absl::InvalidArgumentError(
        absl::StrCat("reconstruction sums: ", n, " values, not 4 + at most ", kMaxFitDimensions));
  }
  ReconstructionFit fit;
  fit.squared_error = sums[0];
  fit.sum_squares = sums[1];
  fit.cosine_sum = sums[2];
  if (!(sums[3] >= 0) || sums[3] != std::floor(sums[3]) || sums[3] > 1e18) {
    return absl::InvalidArgumentError(absl::StrCat("reconstruction sums: row count ", sums[3]));
  }
  fit.rows = static_cast<int64_t>(sums[3]);
  fit.sum_x.assign(sums + 4, sums + n);
  return fit;
}

absl::Status ReconstructionFit::Add(const ReconstructionFit& other) {
  if (other.rows == 0) return absl::OkStatus();
  if (rows > 0 && sum_x.size() != other.sum_x.size()) {
    return absl::InvalidArgumentError(absl::StrCat("reconstruction sums of ", other.sum_x.size(),
                                                   " dimensions added to ", sum_x.size()));
  }
  rows += other.rows;
  squared_error += other.squared_error;
  sum_squares += other.sum_squares;
  cosine_sum += other.cosine_sum;
  sum_x.resize(other.sum_x.size(), 0.0);
  for (size_t i = 0; i < sum_x.size(); ++i) sum_x[i] += other.sum_x[i];
  return absl::OkStatus();
}

double ReconstructionFit::explained_variance() const {
  if (rows == 0) return 0;
  double mean_part = 0;  // ||sum x||^2 / rows: what the mean takes out of sum ||x||^2
  for (double v : sum_x) mean_part += v * v;
  const double total = sum_squares - mean_part / static_cast<double>(rows);
  return total > 0 ? 1.0 - squared_error / total : 0.0;
}

double ReconstructionFit::mse() const {
  return rows > 0 && !sum_x.empty()
             ? squared_error / (static_cast<double>(rows) * static_cast<double>(sum_x.size()))
             : 0.0;
}

double ReconstructionFit::mean_cosine() const {
  return rows > 0 ? cosine_sum / static_cast<double>(rows) : 0.0;
}

namespace {

// Layouts: 2: version, rows, the three sums, d, sum_x, then a CRC32C of everything before it.
// 1 (main for a few hours of 2026-12-04): the same fields, with or (earlier) without the CRC.
constexpr uint8_t kUnchecked = 1;
constexpr uint8_t kChecked = 2;
// Bytes of layout 1 without its CRC for d dimensions.
constexpr size_t UncheckedSize(uint32_t d) { return 1 + 8 * 4 + 4 + size_t{8} * d; }

}  // namespace

std::string ReconstructionFit::Encode() const {
  std::string out;
  PutRaw<uint8_t>(kChecked, &out);
  PutRaw<int64_t>(rows, &out);
  PutRaw<double>(squared_error, &out);
  PutRaw<double>(sum_squares, &out);
  PutRaw<double>(cosine_sum, &out);
  PutRaw<uint32_t>(static_cast<uint32_t>(sum_x.size()), &out);
  for (double v : sum_x) PutRaw<double>(v, &out);
  PutRaw<uint32_t>(Crc32c(out.data(), out.size()), &out);
  return out;
}

absl::StatusOr<ReconstructionFit> ReconstructionFit::Decode(absl::string_view bytes) {
  if (bytes.empty()) return absl::DataLossError("malformed reconstruction totals");
  const uint8_t version = static_cast<uint8_t>(bytes[0]);
  bool has_crc = version == kChecked;
  if (version == kUnchecked && bytes.size() >= UncheckedSize(0)) {
    uint32_t d = 0;
    std::memcpy(&d, bytes.data() + 1 + 8 * 4, sizeof(d));
    has_crc = d <= kMaxFitDimensions && bytes.size() == UncheckedSize(d) + sizeof(uint32_t);
  }
  if (has_crc) {
    // Sums read back wrong would be a quality figure that lies: a checksum, like the chunks'.
    uint32_t crc = 0;
    if (bytes.size() < 1 + sizeof(crc)) {
      return absl::DataLossError("malformed reconstruction totals");
    }
    std::memcpy(&crc, bytes.data() + bytes.size() - sizeof(crc), sizeof(crc));
    bytes.remove_suffix(sizeof(crc));
    if (Crc32c(bytes.data(), bytes.size()) != crc) {
      return absl::DataLossError("reconstruction totals fail their checksum");
    }
  }
  if (version != kChecked && version != kUnchecked) {
    return absl::DataLossError("malformed reconstruction totals");
  }
  ByteReader rd(bytes);
  rd.Skip(1);
  ReconstructionFit fit;
  fit.rows = rd.Raw<int64_t>();
  fit.squared_error = rd.Raw<double>();
  fit.sum_squares = rd.Raw<double>();
  fit.cosine_sum = rd.Raw<double>();
  const uint32_t d = rd.Raw<uint32_t>();
  if (!rd.ok() || fit.rows < 0 || d > kMaxFitDimensions || rd.rest().size() != d * sizeof(double)) {
    return absl::DataLossError("malformed reconstruction totals");
  }
  fit.sum_x.resize(d);
  for (uint32_t i = 0; i < d; ++i) fit.sum_x[i] = rd.Raw<double>();
  return fit;
}

latentd::v1::SaeFit ToSaeFit(const ReconstructionFit& fit) {
  latentd::v1::SaeFit out;
  if (fit.rows == 0) return out;
  out.set_rows(fit.rows);
  out.set_explained_variance(fit.explained_variance());
  out.set_mse(fit.mse());
  out.set_cosine_similarity(fit.mean_cosine());
  return out;
}

}  // namespace latentd::storage
