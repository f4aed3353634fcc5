// Reading Apache Thrift's compact protocol (what Parquet's footer and page headers are written
// in) into a small generic tree: a struct is its fields by id, lists and maps their elements,
// integers widened to int64. The caller picks the fields it knows and ignores the rest, as a
// generated Thrift reader would, so a file written by a newer writer (fields we do not know)
// still reads.
//
// The input is untrusted: every length is checked against the bytes left, nesting is bounded
// (64 levels) and element counts are bounded by the bytes left, so a hostile header cannot
// exhaust the stack or memory. A violation is INVALID_ARGUMENT; running out of bytes is
// OUT_OF_RANGE (the caller may read more and retry).
#ifndef LATENTD_COMMON_THRIFT_COMPACT_H_
#define LATENTD_COMMON_THRIFT_COMPACT_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"

namespace latentd {

struct ThriftValue {
  enum class Kind { kBool, kInt, kDouble, kBinary, kList, kMap, kStruct };
  Kind kind = Kind::kInt;
  int64_t integer = 0;  // kBool (0 / 1) and kInt (byte, i16, i32, i64)
  double real = 0;
  std::string binary;
  std::vector<ThriftValue> elements;  // kList (and sets); kMap: key, value, key, value, ...
  std::vector<std::pair<int16_t, ThriftValue>> fields;  // kStruct, in wire order

  // The struct field with this id, or nullptr.
  const ThriftValue* Field(int16_t id) const;
  // The field's integer (a bool reads as 0 / 1), or `absent` when the field is missing or of
  // another kind.
  int64_t IntField(int16_t id, int64_t absent) const;
};

// Parses one struct starting at bytes[0]; *consumed is how many bytes it took.
absl::StatusOr<ThriftValue> ParseThriftStruct(std::string_view bytes, size_t* consumed);

// Writes Thrift's compact protocol: fields in increasing id order within each struct (what the
// short field header needs), structs and lists nested by Begin/End calls. The counterpart of
// ParseThriftStruct, for Parquet's footer and page headers.
class ThriftWriter {
 public:
  void BeginStruct(int16_t id);  // a struct field; the outermost struct is implicit
  void EndStruct();              // writes its stop byte
  void I32(int16_t id, int32_t v);
  void I64(int16_t id, int64_t v);
  void Bool(int16_t id, bool v);
  void Binary(int16_t id, std::string_view v);
  // A list field of `count` elements of `type`: kStruct elements each between
  // BeginListStruct/EndStruct, kBinary elements by ListBinary, kI32 by ListI32.
  enum class Element : uint8_t { kI32 = 5, kBinary = 8, kStruct = 12 };
  void BeginList(int16_t id, Element type, uint32_t count);
  void BeginListStruct();
  void ListBinary(std::string_view v);
  void ListI32(int32_t v);
  // A list element that is a whole struct another ThriftWriter wrote (its Finish()).
  void RawListStruct(std::string_view encoded) { out_.append(encoded.data(), encoded.size()); }
  // The bytes, once the outermost struct is done (its stop byte added here).
  std::string Finish();

 private:
  void FieldHeader(int16_t id, uint8_t type);
  void Varint(uint64_t v);
  std::string out_;
  std::vector<int16_t> last_ids_ = {0};  // per open struct
};

}  // namespace latentd

#endif  // LATENTD_COMMON_THRIFT_COMPACT_H_
