#include "common/thrift_compact.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace latentd {
namespace {

// Compact protocol type ids (Thrift's TCompactProtocol).
enum : uint8_t {
  kStop = 0,
  kTrue = 1,
  kFalse = 2,
  kByte = 3,
  kI16 = 4,
  kI32 = 5,
  kI64 = 6,
  kDouble = 7,
  kBinary = 8,
  kList = 9,
  kSet = 10,
  kMap = 11,
  kStruct = 12,
};

constexpr int kMaxDepth = 64;

class Parser {
 public:
  explicit Parser(std::string_view bytes) : bytes_(bytes) {}
  size_t position() const { return at_; }

  absl::Status Struct(int depth, ThriftValue* out) {
    if (depth > kMaxDepth) return absl::InvalidArgumentError("thrift: nested deeper than 64");
    out->kind = ThriftValue::Kind::kStruct;
    int16_t last_id = 0;
    while (true) {
      ASSIGN_OR_RETURN(uint8_t header, Byte());
      const uint8_t type = header & 0x0f;
      if (type == kStop) return absl::OkStatus();
      int16_t id;
      if ((header >> 4) != 0) {
        id = static_cast<int16_t>(last_id + (header >> 4));
      } else {
        ASSIGN_OR_RETURN(uint64_t raw, Varint());
        id = static_cast<int16_t>(ZigZag(raw));
      }
      last_id = id;
      ThriftValue value;
      if (type == kTrue || type == kFalse) {
        value.kind = ThriftValue::Kind::kBool;
        value.integer = type == kTrue ? 1 : 0;
      } else {
        RETURN_IF_ERROR(Value(type, depth, &value));
      }
      out->fields.emplace_back(id, std::move(value));
    }
  }

 private:
  absl::StatusOr<uint8_t> Byte() {
    if (at_ >= bytes_.size()) return absl::OutOfRangeError("thrift: truncated");
    return static_cast<uint8_t>(bytes_[at_++]);
  }

  absl::StatusOr<uint64_t> Varint() {
    uint64_t v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      ASSIGN_OR_RETURN(uint8_t b, Byte());
      v |= static_cast<uint64_t>(b & 0x7f) << shift;
      if ((b & 0x80) == 0) return v;
    }
    return absl::InvalidArgumentError("thrift: varint longer than 10 bytes");
  }

  static int64_t ZigZag(uint64_t v) {
    return static_cast<int64_t>(v >> 1) ^ -static_cast<int64_t>(v & 1);
  }

  // Every element takes at least one byte on the wire, so a count above the bytes left is a lie.
  absl::Status CheckCount(uint64_t count) const {
    if (count > bytes_.size() - at_) {
      return absl::InvalidArgumentError(absl::StrCat(
          "thrift: a container of ", count, " elements in ", bytes_.size() - at_, " bytes"));
    }
    return absl::OkStatus();
  }

  absl::Status Value(uint8_t type, int depth, ThriftValue* out) {
    switch (type) {
      case kTrue:
      case kFalse: {  // a bool inside a list or map is a whole byte
        ASSIGN_OR_RETURN(uint8_t b, Byte());
        out->kind = ThriftValue::Kind::kBool;
        out->integer = b == kTrue ? 1 : 0;
        return absl::OkStatus();
      }
      case kByte: {
        ASSIGN_OR_RETURN(uint8_t b, Byte());
        out->kind = ThriftValue::Kind::kInt;
        out->integer = static_cast<int8_t>(b);
        return absl::OkStatus();
      }
      case kI16:
      case kI32:
      case kI64: {
        ASSIGN_OR_RETURN(uint64_t raw, Varint());
        out->kind = ThriftValue::Kind::kInt;
        out->integer = ZigZag(raw);
        return absl::OkStatus();
      }
      case kDouble: {
        if (bytes_.size() - at_ < 8) return absl::OutOfRangeError("thrift: truncated");
        uint64_t bits = 0;
        for (int i = 7; i >= 0; --i) bits = (bits << 8) | static_cast<uint8_t>(bytes_[at_ + i]);
        at_ += 8;
        out->kind = ThriftValue::Kind::kDouble;
        std::memcpy(&out->real, &bits, 8);
        return absl::OkStatus();
      }
      case kBinary: {
        ASSIGN_OR_RETURN(uint64_t size, Varint());
        if (size > bytes_.size() - at_) return absl::OutOfRangeError("thrift: truncated");
        out->kind = ThriftValue::Kind::kBinary;
        out->binary.assign(bytes_.substr(at_, size));
        at_ += size;
        return absl::OkStatus();
      }
      case kList:
      case kSet: {
        ASSIGN_OR_RETURN(uint8_t header, Byte());
        uint64_t count = header >> 4;
        if (count == 15) {
          ASSIGN_OR_RETURN(count, Varint());
        }
        RETURN_IF_ERROR(CheckCount(count));
        out->kind = ThriftValue::Kind::kList;
        out->elements.resize(count);
        for (ThriftValue& e : out->elements) {
          RETURN_IF_ERROR(Value(header & 0x0f, depth + 1, &e));
        }
        return absl::OkStatus();
      }
      case kMap: {
        ASSIGN_OR_RETURN(uint64_t count, Varint());
        out->kind = ThriftValue::Kind::kMap;
        if (count == 0) return absl::OkStatus();
        RETURN_IF_ERROR(CheckCount(count));
        ASSIGN_OR_RETURN(uint8_t types, Byte());
        out->elements.resize(2 * count);
        for (uint64_t i = 0; i < count; ++i) {
          RETURN_IF_ERROR(Value(types >> 4, depth + 1, &out->elements[2 * i]));
          RETURN_IF_ERROR(Value(types & 0x0f, depth + 1, &out->elements[2 * i + 1]));
        }
        return absl::OkStatus();
      }
      case kStruct:
        return Struct(depth + 1, out);
      default:
        return absl::InvalidArgumentError(
            absl::StrCat("thrift: unknown type ", static_cast<int>(type)));
    }
  }

  std::string_view bytes_;
  size_t at_ = 0;
};

}  // namespace

const ThriftValue* ThriftValue::Field(int16_t id) const {
  for (const auto& [field_id, value] : fields) {
    if (field_id == id) return &value;
  }
  return nullptr;
}

int64_t ThriftValue::IntField(int16_t id, int64_t absent) const {
  const ThriftValue* f = Field(id);
  if (f == nullptr || (f->kind != Kind::kInt && f->kind != Kind::kBool)) return absent;
  return f->integer;
}

void ThriftWriter::Varint(uint64_t v) {
  while (v >= 0x80) {
    out_.push_back(static_cast<char>((v & 0x7f) | 0x80));
    v >>= 7;
  }
  out_.push_back(static_cast<char>(v));
}

void ThriftWriter::FieldHeader(int16_t id, uint8_t type) {
  const int delta = id - last_ids_.back();
  if (delta > 0 && delta <= 15) {
    out_.push_back(static_cast<char>((delta << 4) | type));
  } else {
    out_.push_back(static_cast<char>(type));
    Varint((static_cast<uint64_t>(id) << 1) ^ static_cast<uint64_t>(id >> 15));
  }
  last_ids_.back() = id;
}

void ThriftWriter::BeginStruct(int16_t id) {
  FieldHeader(id, kStruct);
  last_ids_.push_back(0);
}

void ThriftWriter::EndStruct() {
  out_.push_back(static_cast<char>(kStop));
  last_ids_.pop_back();
}

void ThriftWriter::I32(int16_t id, int32_t v) {
  FieldHeader(id, kI32);
  Varint((static_cast<uint64_t>(v) << 1) ^ static_cast<uint64_t>(static_cast<int64_t>(v) >> 63));
}

void ThriftWriter::I64(int16_t id, int64_t v) {
  FieldHeader(id, kI64);
  Varint((static_cast<uint64_t>(v) << 1) ^ static_cast<uint64_t>(v >> 63));
}

void ThriftWriter::Bool(int16_t id, bool v) { FieldHeader(id, v ? kTrue : kFalse); }

void ThriftWriter::Binary(int16_t id, std::string_view v) {
  FieldHeader(id, kBinary);
  ListBinary(v);
}

void ThriftWriter::BeginList(int16_t id, Element type, uint32_t count) {
  FieldHeader(id, kList);
  const uint8_t element = static_cast<uint8_t>(type);
  if (count < 15) {
    out_.push_back(static_cast<char>((count << 4) | element));
  } else {
    out_.push_back(static_cast<char>(0xf0 | element));
    Varint(count);
  }
}

void ThriftWriter::BeginListStruct() { last_ids_.push_back(0); }

void ThriftWriter::ListBinary(std::string_view v) {
  Varint(v.size());
  out_.append(v.data(), v.size());
}

void ThriftWriter::ListI32(int32_t v) {
  Varint((static_cast<uint64_t>(v) << 1) ^ static_cast<uint64_t>(static_cast<int64_t>(v) >> 63));
}

std::string ThriftWriter::Finish() {
  out_.push_back(static_cast<char>(kStop));
  return std::move(out_);
}

absl::StatusOr<ThriftValue> ParseThriftStruct(std::string_view bytes, size_t* consumed) {
  Parser parser(bytes);
  ThriftValue root;
  RETURN_IF_ERROR(parser.Struct(0, &root));
  *consumed = parser.position();
  return root;
}

}  // namespace latentd
