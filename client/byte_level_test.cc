#include "client/byte_level.h"

#include "gtest/gtest.h"

namespace latentd::client {
namespace {

TEST(ByteLevelTest, EveryByteRoundTripsThroughItsPrintableSpelling) {
  std::string all;
  for (int b = 0; b < 256; ++b) all.push_back(static_cast<char>(b));
  const std::string spelled = ByteLevelEncode(all);
  EXPECT_FALSE(FirstInvalidUtf8(spelled).has_value());
  EXPECT_EQ(ByteLevelDecode(spelled), all);
  EXPECT_EQ(ByteLevelEncode(" "), "\u0120");   // GPT-2's Ġ
  EXPECT_EQ(ByteLevelEncode("\n"), "\u010A");  // Ċ
  EXPECT_EQ(ByteLevelEncode("a!~"), "a!~");
  EXPECT_EQ(ByteLevelDecode("\u4E2D"), std::nullopt);  // outside the alphabet
}

TEST(ByteLevelTest, Utf8) {
  std::string s;
  for (uint32_t cp : {0x41u, 0xE9u, 0x4E2Du, 0x1F917u}) AppendUtf8(cp, &s);
  EXPECT_EQ(s, "A\u00E9\u4E2D\U0001F917");
  EXPECT_EQ(DecodeUtf8(s, 1), std::make_pair(0xE9u, size_t{2}));
  EXPECT_EQ(DecodeUtf8(s, 6), std::make_pair(0x1F917u, size_t{4}));
  EXPECT_EQ(FirstInvalidUtf8(s), std::nullopt);
  EXPECT_EQ(PreviousCodePointStart(s, s.size()), 6u);  // the emoji's first byte
  EXPECT_EQ(PreviousCodePointStart(s, 3), 1u);         // é
  EXPECT_EQ(PreviousCodePointStart(s, 1), 0u);
  EXPECT_EQ(FirstInvalidUtf8("ok\xC0\x80"), 2u);    // overlong
  EXPECT_EQ(FirstInvalidUtf8("\xED\xA0\x80"), 0u);  // a surrogate
  EXPECT_EQ(FirstInvalidUtf8("ab\xE4\xB8"), 2u);    // truncated
}

}  // namespace
}  // namespace latentd::client
