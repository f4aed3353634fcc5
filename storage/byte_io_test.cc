#include "storage/byte_io.h"

#include <string>

#include "gtest/gtest.h"

namespace latentd::storage {
namespace {

TEST(ByteIo, FieldsRoundTripAndOverrunsAreSticky) {
  std::string out;
  PutRaw<uint32_t>(0xdeadbeef, &out);
  PutVarint(300, &out);
  PutString("abc", &out);
  ByteReader rd(out);
  EXPECT_EQ(rd.Raw<uint32_t>(), 0xdeadbeefu);
  EXPECT_EQ(rd.Varint(), 300u);
  EXPECT_TRUE(rd.ok());
  EXPECT_EQ(rd.rest().size(), 7u);
  rd.Skip(7);
  EXPECT_EQ(rd.Varint(), 0u);  // past the end
  EXPECT_FALSE(rd.ok());
}

// A patched varint reads back as the canonical one, whatever was reserved, and the bytes after
// it keep their order.
TEST(ByteIo, PatchedVarintEqualsAPlainOne) {
  for (int guess : {1, 2, 3}) {
    for (uint64_t value : {uint64_t{0}, uint64_t{127}, uint64_t{128}, uint64_t{16383},
                           uint64_t{16384}, uint64_t{1} << 40}) {
      std::string patched = "head";
      const size_t start = ReserveVarint(guess, &patched);
      patched += "payload";
      PatchVarint(start, guess, value, &patched);
      std::string plain = "head";
      PutVarint(value, &plain);
      plain += "payload";
      EXPECT_EQ(patched, plain) << "guess " << guess << " value " << value;
    }
  }
}

}  // namespace
}  // namespace latentd::storage
