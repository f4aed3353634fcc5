#include "common/npy_header.h"

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

}  // namespace
}  // namespace latentd
