#include "common/byte_size.h"

#include "gtest/gtest.h"

namespace latentd {
namespace {

TEST(ByteSizeTest, PicksTheUnitThatKeepsTheFigureReadable) {
  EXPECT_EQ(ByteSize(0), "0 B");
  EXPECT_EQ(ByteSize(999), "999 B");
  EXPECT_EQ(ByteSize(196608), "196.6 kB");
  EXPECT_EQ(ByteSize(17.04e6), "17.0 MB");
  EXPECT_EQ(ByteSize(999.9e6), "999.9 MB");
  EXPECT_EQ(ByteSize(1.52e9), "1.52 GB");
  EXPECT_EQ(ByteSize(34.4e9), "34.40 GB");
}

}  // namespace
}  // namespace latentd
