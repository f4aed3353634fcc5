#include "common/big_endian.h"

#include <string>

#include "gtest/gtest.h"

namespace latentd {
namespace {

TEST(BigEndian, RoundTripsAndSortsNumerically) {
  std::string a, b;
  AppendBigEndian64(255, &a);
  AppendBigEndian64(256, &b);
  EXPECT_LT(a, b);  // bytewise order equals numeric order
  EXPECT_EQ(ReadBigEndian64(a.data()), 255u);
  EXPECT_EQ(ReadBigEndian64(b.data()), 256u);
  std::string c;
  AppendBigEndian32(0xdeadbeef, &c);
  ASSERT_EQ(c.size(), 4u);
  EXPECT_EQ(static_cast<unsigned char>(c[0]), 0xde);
  EXPECT_EQ(ReadBigEndian32(c.data()), 0xdeadbeefu);
}

}  // namespace
}  // namespace latentd
