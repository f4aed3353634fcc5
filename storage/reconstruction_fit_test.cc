#include "storage/reconstruction_fit.h"

#include <cmath>
#include <random>

#include "gtest/gtest.h"
#include "storage/crc32c.h"

namespace latentd::storage {
namespace {

// Rows x and x_hat of d = 3, and their figures computed the textbook way.
struct Rows {
  std::vector<std::vector<double>> x, x_hat;
};

Rows MakeRows(int n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<double> g(0.5, 2.0);
  Rows r;
  for (int i = 0; i < n; ++i) {
    std::vector<double> x(3), h(3);
    for (int j = 0; j < 3; ++j) x[j] = g(rng), h[j] = x[j] + 0.3 * g(rng);
    r.x.push_back(x);
    r.x_hat.push_back(h);
  }
  return r;
}

// The sums of rows [begin, end), as the engine sends them.
ReconstructionFit Sums(const Rows& r, int begin, int end) {
  std::vector<double> s(4 + 3, 0.0);
  for (int i = begin; i < end; ++i) {
    double dot = 0, nx = 0, nh = 0;
    for (int j = 0; j < 3; ++j) {
      const double e = r.x[i][j] - r.x_hat[i][j];
      s[0] += e * e;
      s[1] += r.x[i][j] * r.x[i][j];
      dot += r.x[i][j] * r.x_hat[i][j];
      nx += r.x[i][j] * r.x[i][j];
      nh += r.x_hat[i][j] * r.x_hat[i][j];
      s[4 + j] += r.x[i][j];
    }
    s[2] += dot / std::sqrt(nx * nh);
    s[3] += 1;
  }
  auto fit = ReconstructionFit::FromSums(s.data(), static_cast<int64_t>(s.size()));
  EXPECT_TRUE(fit.ok()) << fit.status();
  return *fit;
}

TEST(ReconstructionFitTest, BatchesAddUpToTheFiguresOfAllRows) {
  const Rows r = MakeRows(50, 3);
  double sse = 0, sst = 0;
  std::vector<double> mean(3, 0.0);
  for (int i = 0; i < 50; ++i) {
    for (int j = 0; j < 3; ++j) mean[j] += r.x[i][j] / 50;
  }
  for (int i = 0; i < 50; ++i) {
    for (int j = 0; j < 3; ++j) {
      sse += std::pow(r.x[i][j] - r.x_hat[i][j], 2);
      sst += std::pow(r.x[i][j] - mean[j], 2);
    }
  }
  ReconstructionFit total;
  for (auto [begin, end] : {std::pair{0, 7}, std::pair{7, 8}, std::pair{8, 50}}) {
    ASSERT_TRUE(total.Add(Sums(r, begin, end)).ok());
  }
  EXPECT_EQ(total.rows, 50);
  EXPECT_NEAR(total.explained_variance(), 1 - sse / sst, 1e-12);
  EXPECT_NEAR(total.mse(), sse / 150, 1e-12);
  EXPECT_NEAR(total.mean_cosine(), Sums(r, 0, 50).cosine_sum / 50, 1e-12);
  EXPECT_GT(total.explained_variance(), 0.8);

  // Nothing counted: zeros, not NaN.
  EXPECT_EQ(ReconstructionFit().explained_variance(), 0);
  EXPECT_EQ(ReconstructionFit().mse(), 0);
  EXPECT_EQ(ReconstructionFit().mean_cosine(), 0);
  // Dimensions must agree.
  ReconstructionFit wider = total;
  wider.sum_x.push_back(0);
  EXPECT_EQ(total.Add(wider).code(), absl::StatusCode::kInvalidArgument);
}

TEST(ReconstructionFitTest, EncodesAndRejectsWhatItDidNotWrite) {
  const ReconstructionFit fit = Sums(MakeRows(9, 4), 0, 9);
  auto back = ReconstructionFit::Decode(fit.Encode());
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->rows, 9);
  EXPECT_EQ(back->squared_error, fit.squared_error);
  EXPECT_EQ(back->sum_x, fit.sum_x);
  const std::string bytes = fit.Encode();
  for (size_t cut = 0; cut < bytes.size(); ++cut) {
    EXPECT_EQ(ReconstructionFit::Decode(bytes.substr(0, cut)).status().code(),
              absl::StatusCode::kDataLoss)
        << cut;
  }
  EXPECT_EQ(ReconstructionFit::Decode(bytes + "x").status().code(), absl::StatusCode::kDataLoss);
  // Totals written before they carried a checksum (layout 1: the same fields, no CRC) still
  // read.
  std::string unchecked = bytes.substr(0, bytes.size() - 4);
  unchecked[0] = 1;
  auto legacy = ReconstructionFit::Decode(unchecked);
  ASSERT_TRUE(legacy.ok()) << legacy.status();
  EXPECT_EQ(legacy->rows, 9);
  EXPECT_EQ(legacy->sum_x, fit.sum_x);
  std::string checked_v1 = unchecked;  // and layout 1 with the CRC, as written a while
  const uint32_t crc = Crc32c(checked_v1.data(), checked_v1.size());
  checked_v1.append(reinterpret_cast<const char*>(&crc), sizeof(crc));
  auto legacy_crc = ReconstructionFit::Decode(checked_v1);
  ASSERT_TRUE(legacy_crc.ok()) << legacy_crc.status();
  EXPECT_EQ(legacy_crc->squared_error, fit.squared_error);
  checked_v1[3] ^= 0x10;
  EXPECT_EQ(ReconstructionFit::Decode(checked_v1).status().code(), absl::StatusCode::kDataLoss);
  for (size_t i = 0; i < bytes.size(); ++i) {  // any byte changed: the checksum catches it
    std::string flipped = bytes;
    flipped[i] = static_cast<char>(flipped[i] ^ 0x10);
    EXPECT_EQ(ReconstructionFit::Decode(flipped).status().code(), absl::StatusCode::kDataLoss) << i;
  }

  const double bad_rows[] = {0, 0, 0, 1.5};
  EXPECT_EQ(ReconstructionFit::FromSums(bad_rows, 4).status().code(),
            absl::StatusCode::kInvalidArgument);
  const double negative[] = {0, 0, 0, -1};
  EXPECT_EQ(ReconstructionFit::FromSums(negative, 4).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ReconstructionFit::FromSums(bad_rows, 3).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace latentd::storage
