#include "common/npy_header.h"

#include <cstdint>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace latentd {
namespace {

TEST(NpyHeaderTest, AsNumpyWritesIt) {
  // numpy.save(f, numpy.zeros(3, numpy.uint16)) writes exactly this header.
  std::string expected("\x93NUMPY\x01\x00\x76\x00", 10);
  expected += "{'descr': '<u2', 'fortran_order': False, 'shape': (3,), }";
  expected.append(128 - expected.size() - 1, ' ');
  expected += "\n";
  EXPECT_EQ(NpyHeader("<u2", {3}), expected);
  EXPECT_EQ(NpyHeader("<f4", {2, 5}).substr(10, 59),
            "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 5), }");
}

TEST(NpyHeaderTest, ReservesRoomForAShapeLearnedLater) {
  const std::string placeholder = NpyHeader("<i4", {0}, 192);
  EXPECT_EQ(placeholder.size(), 192u);
  EXPECT_EQ(NpyHeader("<i4", {int64_t{1} << 40}, placeholder.size()).size(), 192u);
  EXPECT_EQ(NpyHeader("<i4", {0}, 130).size(), 192u);  // rounded up to 64
}

TEST(NpyHeaderTest, ParsesWhatNumpyWrites) {
  for (const std::vector<int64_t>& shape : {std::vector<int64_t>{7}, {2, 5}, {}}) {
    const std::string header = NpyHeader("<f8", shape);
    NpyArrayInfo info;
    uint64_t data_at = 0;
    ASSERT_TRUE(ParseNpyHeader(header + "data", "x.npy", &info, &data_at).ok());
    EXPECT_EQ(info.descr, "<f8");
    EXPECT_EQ(info.item_size, 8);
    EXPECT_EQ(info.shape, shape);
    EXPECT_FALSE(info.fortran_order);
    EXPECT_EQ(data_at, header.size());
  }
  // Version 2 keeps the header length in 4 bytes.
  std::string v2("\x93NUMPY\x02\x00", 8);
  const std::string dict = "{'descr': '<i4', 'fortran_order': True, 'shape': (3, 4), }\n";
  v2.push_back(static_cast<char>(dict.size()));
  v2.append(3, '\0');
  v2 += dict;
  NpyArrayInfo info;
  uint64_t data_at = 0;
  ASSERT_TRUE(ParseNpyHeader(v2, "v2.npy", &info, &data_at).ok());
  EXPECT_TRUE(info.fortran_order);
  EXPECT_EQ(info.shape, (std::vector<int64_t>{3, 4}));
  EXPECT_EQ(data_at, v2.size());
  // Not one: named in the error.
  const absl::Status bad = ParseNpyHeader("PK\x03\x04 a zip", "w.npy", &info, &data_at);
  EXPECT_EQ(bad.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.message().find("w.npy: not an .npy array"), std::string::npos) << bad;
}

}  // namespace
}  // namespace latentd
