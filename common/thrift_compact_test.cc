#include "common/thrift_compact.h"

#include <string>

#include "gtest/gtest.h"

namespace latentd {
namespace {

using std::string_literals::operator""s;

TEST(ThriftCompactTest, ReadsEveryKindAsAGeneratedReaderWould) {
  // Field 1 i32 = -3 (zigzag 5); field 2 bool true; field 4 (delta 2) binary "ab";
  // field 300 (long form, zigzag 600 = 0xd8 0x04) i64 = 1 << 40;
  // field 301 list<i32> [1, 2]; field 302 struct {1: i16 7}; field 303 map<binary, i32> {"k": 9};
  // field 304 double 1.5; field 305 list<bool> [true, false]; stop.
  const std::string bytes = "\x15\x05"s + "\x11"s +
                            "\x28\x02"
                            "ab"s +
                            "\x06\xd8\x04"s + "\x80\x80\x80\x80\x80\x40"s + "\x19\x25\x02\x04"s +
                            "\x1c\x14\x0e\x00"s + "\x1b\x01\x85\x01k\x12"s +
                            "\x17\x00\x00\x00\x00\x00\x00\xf8\x3f"s + "\x19\x21\x01\x02"s +
                            "\x00"s + "trailing";
  size_t consumed = 0;
  absl::StatusOr<ThriftValue> v = ParseThriftStruct(bytes, &consumed);
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(consumed, bytes.size() - 8);
  EXPECT_EQ(v->IntField(1, 0), -3);
  EXPECT_EQ(v->IntField(2, 0), 1);
  ASSERT_NE(v->Field(4), nullptr);
  EXPECT_EQ(v->Field(4)->binary, "ab");
  EXPECT_EQ(v->IntField(300, 0), int64_t{1} << 40);
  const ThriftValue* list = v->Field(301);
  ASSERT_NE(list, nullptr);
  ASSERT_EQ(list->elements.size(), 2u);
  EXPECT_EQ(list->elements[1].integer, 2);
  ASSERT_NE(v->Field(302), nullptr);
  EXPECT_EQ(v->Field(302)->IntField(1, 0), 7);
  const ThriftValue* map = v->Field(303);
  ASSERT_NE(map, nullptr);
  ASSERT_EQ(map->elements.size(), 2u);
  EXPECT_EQ(map->elements[0].binary, "k");
  EXPECT_EQ(map->elements[1].integer, 9);
  EXPECT_EQ(v->Field(304)->real, 1.5);
  ASSERT_EQ(v->Field(305)->elements.size(), 2u);
  EXPECT_EQ(v->Field(305)->elements[0].integer, 1);
  EXPECT_EQ(v->Field(305)->elements[1].integer, 0);
  EXPECT_EQ(v->Field(5), nullptr);
  EXPECT_EQ(v->IntField(5, -1), -1);
  EXPECT_EQ(v->IntField(4, -1), -1);  // a binary is not an integer
}

TEST(ThriftCompactTest, TruncationIsOutOfRangeSoACallerCanReadMore) {
  const std::string bytes =
      "\x15\x05\x28\x05"
      "ab"s;  // a 5-byte binary with 2 bytes left
  size_t consumed = 0;
  EXPECT_TRUE(absl::IsOutOfRange(ParseThriftStruct(bytes, &consumed).status()));
  EXPECT_TRUE(absl::IsOutOfRange(ParseThriftStruct("\x15"s, &consumed).status()));
  EXPECT_TRUE(absl::IsOutOfRange(ParseThriftStruct("", &consumed).status()));
}

TEST(ThriftCompactTest, HostileHeadersAreRefusedWithoutExhaustingMemoryOrStack) {
  size_t consumed = 0;
  // A list claiming 2^40 elements in four bytes.
  EXPECT_TRUE(absl::IsInvalidArgument(
      ParseThriftStruct("\x19\xf5\x80\x80\x80\x80\x80\x20\x00"s, &consumed).status()));
  // A map claiming a million entries.
  EXPECT_TRUE(
      absl::IsInvalidArgument(ParseThriftStruct("\x1b\xc0\x84\x3d\x55\x00"s, &consumed).status()));
  // Structs nested 10000 deep.
  std::string deep(10000, '\x1c');
  EXPECT_TRUE(absl::IsInvalidArgument(ParseThriftStruct(deep, &consumed).status()));
  // An unknown type id and an endless varint.
  EXPECT_TRUE(absl::IsInvalidArgument(ParseThriftStruct("\x1d\x00"s, &consumed).status()));
  EXPECT_TRUE(absl::IsInvalidArgument(
      ParseThriftStruct("\x16" + std::string(12, '\xff') + "\x01", &consumed).status()));
}

TEST(ThriftCompactTest, WhatTheWriterWritesTheReaderReads) {
  ThriftWriter w;
  w.I32(1, -7);
  w.I64(2, int64_t{1} << 50);
  w.Binary(4, "name");
  w.Bool(5, true);
  w.BeginStruct(40);  // a jump past 15: the long field header
  w.I32(1, 3);
  w.EndStruct();
  w.BeginList(41, ThriftWriter::Element::kStruct, 20);  // 15 or more: the long list header
  for (int i = 0; i < 20; ++i) {
    w.BeginListStruct();
    w.I64(3, -i);
    w.EndStruct();
  }
  w.BeginList(42, ThriftWriter::Element::kBinary, 2);
  w.ListBinary("a");
  w.ListBinary("bc");
  w.BeginList(43, ThriftWriter::Element::kI32, 1);
  w.ListI32(-2);
  const std::string bytes = w.Finish();
  size_t consumed = 0;
  absl::StatusOr<ThriftValue> v = ParseThriftStruct(bytes, &consumed);
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(consumed, bytes.size());
  EXPECT_EQ(v->IntField(1, 0), -7);
  EXPECT_EQ(v->IntField(2, 0), int64_t{1} << 50);
  EXPECT_EQ(v->Field(4)->binary, "name");
  EXPECT_EQ(v->IntField(5, 0), 1);
  EXPECT_EQ(v->Field(40)->IntField(1, 0), 3);
  ASSERT_EQ(v->Field(41)->elements.size(), 20u);
  EXPECT_EQ(v->Field(41)->elements[19].IntField(3, 0), -19);
  EXPECT_EQ(v->Field(42)->elements[1].binary, "bc");
  EXPECT_EQ(v->Field(43)->elements[0].integer, -2);
}

}  // namespace
}  // namespace latentd
