#include "storage/crc32c.h"

#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace latentd::storage {
namespace {

TEST(Crc32c, KnownVectors) {
  // RFC 3720 (iSCSI) test vectors and the common "123456789" check value.
  EXPECT_EQ(Crc32c("123456789", 9), 0xe3069283u);
  std::vector<uint8_t> zeros(32, 0), ones(32, 0xff), inc(32);
  for (int i = 0; i < 32; ++i) inc[i] = static_cast<uint8_t>(i);
  EXPECT_EQ(Crc32c(zeros.data(), 32), 0x8a9136aau);
  EXPECT_EQ(Crc32c(ones.data(), 32), 0x62a8ab43u);
  EXPECT_EQ(Crc32c(inc.data(), 32), 0x46dd794eu);
}

TEST(Crc32c, HardwareMatchesPortableAndExtendIsIncremental) {
  std::mt19937 rng(7);
  std::string data(10007, '\0');
  for (char& c : data) c = static_cast<char>(rng());
  // Around the hardware path's 3 x 1024-byte interleaved blocks, and several of them.
  for (size_t len : {0, 1, 7, 8, 9, 63, 64, 1000, 3071, 3072, 3073, 6144, 6151, 9216, 10007}) {
    EXPECT_EQ(Crc32c(data.data(), len), Crc32cExtendPortable(0, data.data(), len)) << len;
  }
  uint32_t whole = Crc32c(data.data(), data.size());
  uint32_t part = Crc32cExtend(Crc32c(data.data(), 4321), data.data() + 4321, data.size() - 4321);
  EXPECT_EQ(whole, part);
  for (size_t cut : {1, 3072, 3500}) {  // a nonzero state entering the interleaved blocks
    EXPECT_EQ(Crc32cExtend(Crc32c(data.data(), cut), data.data() + cut, data.size() - cut),
              Crc32cExtendPortable(0, data.data(), data.size()))
        << cut;
  }
  data[5000] ^= 1;
  EXPECT_NE(Crc32c(data.data(), data.size()), whole);
}

}  // namespace
}  // namespace latentd::storage
