#include "common/arrow_column.h"

#include <algorithm>
#include <cstring>
#include <functional>
#include <optional>
#include <string_view>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/decoded_units.h"
#include "common/random_access_file.h"
#include "common/status_macros.h"

namespace latentd {
namespace {

// Arrow's Type union (Schema.fbs), as far as telling buffers apart needs it.
enum TypeId : int {
  kNull = 1,
  kInt = 2,
  kBinary = 4,
  kUtf8 = 5,
  kList = 12,
  kStruct = 13,
  kUnion = 14,
  kFixedSizeList = 16,
  kMap = 17,
  kLargeBinary = 19,
  kLargeUtf8 = 20,
  kLargeList = 21,
  kRunEndEncoded = 22,
  kBinaryView = 23,
  kUtf8View = 24,
  kListView = 25,
  kLargeListView = 26,
};
enum MessageHeader : int { kSchema = 1, kDictionaryBatch = 2, kRecordBatch = 3 };

constexpr int64_t kMaxMetadata = 64 << 20;

uint64_t LittleEndianAt(const char* p, int bytes) {
  uint64_t v = 0;
  for (int i = bytes - 1; i >= 0; --i) v = (v << 8) | static_cast<uint8_t>(p[i]);
  return v;
}

// A flatbuffer table, every offset checked against the buffer it lives in.
class Flat {
 public:
  struct Vector {
    size_t at = 0;  // of the first element
    uint32_t length = 0;
  };

  static absl::StatusOr<Flat> Root(std::string_view buffer) {
    if (buffer.size() < 4) return Bad("metadata shorter than its root offset");
    return At(buffer, LittleEndianAt(buffer.data(), 4));
  }

  // The scalar in `slot` (`bytes` wide), or `absent`.
  absl::StatusOr<int64_t> Scalar(int slot, int bytes, bool is_signed, int64_t absent) const {
    const uint16_t offset = FieldOffset(slot);
    if (offset == 0) return absent;
    if (offset + bytes > table_size_) return Bad("a field past its table");
    const uint64_t raw = LittleEndianAt(buffer_.data() + table_ + offset, bytes);
    if (!is_signed || bytes == 8) return static_cast<int64_t>(raw);
    const uint64_t sign = uint64_t{1} << (8 * bytes - 1);
    return static_cast<int64_t>((raw ^ sign) - sign);
  }

  absl::StatusOr<std::optional<Flat>> Table(int slot) const {
    ASSIGN_OR_RETURN(std::optional<size_t> target, Indirect(slot));
    if (!target) return std::nullopt;
    ASSIGN_OR_RETURN(Flat table, At(buffer_, *target));
    return table;
  }

  absl::StatusOr<std::string_view> String(int slot) const {
    ASSIGN_OR_RETURN(std::optional<Vector> v, VectorOf(slot, 1));
    if (!v) return std::string_view();
    return buffer_.substr(v->at, v->length);
  }

  absl::StatusOr<std::optional<Vector>> VectorOf(int slot, size_t element_size) const {
    ASSIGN_OR_RETURN(std::optional<size_t> target, Indirect(slot));
    if (!target) return std::nullopt;
    if (*target + 4 > buffer_.size()) return Bad("a vector past the metadata");
    const uint32_t length = static_cast<uint32_t>(LittleEndianAt(buffer_.data() + *target, 4));
    if (length > (buffer_.size() - *target - 4) / element_size) {
      return Bad("a vector longer than the metadata");
    }
    return Vector{*target + 4, length};
  }

  // Element i of a vector of tables.
  absl::StatusOr<Flat> TableIn(const Vector& v, uint32_t i) const {
    const size_t at = v.at + 4 * static_cast<size_t>(i);
    return At(buffer_, at + LittleEndianAt(buffer_.data() + at, 4));
  }

  // Field `field` (int64) of element i of a vector of structs of `struct_size` bytes.
  int64_t StructField(const Vector& v, uint32_t i, size_t struct_size, int field) const {
    return static_cast<int64_t>(
        LittleEndianAt(buffer_.data() + v.at + i * struct_size + 8 * field, 8));
  }

 private:
  static absl::Status Bad(const std::string& why) {
    return absl::InvalidArgumentError(absl::StrCat("corrupt Arrow metadata: ", why));
  }

  static absl::StatusOr<Flat> At(std::string_view buffer, uint64_t table) {
    if (table + 4 > buffer.size()) return Bad("a table past the metadata");
    const int64_t back = static_cast<int32_t>(LittleEndianAt(buffer.data() + table, 4));
    const int64_t vtable = static_cast<int64_t>(table) - back;
    if (vtable < 0 || vtable + 4 > static_cast<int64_t>(buffer.size())) {
      return Bad("a vtable outside the metadata");
    }
    Flat flat;
    flat.buffer_ = buffer;
    flat.table_ = table;
    flat.vtable_ = static_cast<size_t>(vtable);
    flat.vtable_size_ = static_cast<uint16_t>(LittleEndianAt(buffer.data() + vtable, 2));
    flat.table_size_ = static_cast<uint16_t>(LittleEndianAt(buffer.data() + vtable + 2, 2));
    if (flat.vtable_size_ < 4 || flat.vtable_ + flat.vtable_size_ > buffer.size() ||
        table + flat.table_size_ > buffer.size()) {
      return Bad("a table or vtable past the metadata");
    }
    return flat;
  }

  uint16_t FieldOffset(int slot) const {
    const size_t at = 4 + 2 * static_cast<size_t>(slot);
    if (at + 2 > vtable_size_) return 0;
    return static_cast<uint16_t>(LittleEndianAt(buffer_.data() + vtable_ + at, 2));
  }

  // Where an offset field points (uoffset from the field's own position).
  absl::StatusOr<std::optional<size_t>> Indirect(int slot) const {
    const uint16_t offset = FieldOffset(slot);
    if (offset == 0) return std::nullopt;
    if (offset + 4 > table_size_) return Bad("a field past its table");
    const size_t at = table_ + offset;
    const uint64_t target = at + LittleEndianAt(buffer_.data() + at, 4);
    if (target >= buffer_.size()) return Bad("an offset past the metadata");
    return static_cast<size_t>(target);
  }

  std::string_view buffer_;
  size_t table_ = 0, vtable_ = 0;
  uint16_t vtable_size_ = 0, table_size_ = 0;
};

// One field of the schema, flattened depth-first as record batches lay out nodes and buffers.
struct FlatField {
  std::string top;  // the top-level column it belongs to
  int type = 0;
  bool dictionary = false;
  int bit_width = 0;  // kInt
  bool is_signed = true;
  int32_t list_size = 0;  // kFixedSizeList
  int node = 0;           // its FieldNode
  int buffer = 0;         // its first buffer
  int children = 0;
};

// Buffers a field of this type has in a record batch (Arrow's columnar format, version 5).
absl::StatusOr<int> BufferCount(const FlatField& f, const Flat& type_table) {
  if (f.dictionary) return 2;  // the indices: validity, data
  switch (f.type) {
    case kNull:
    case kRunEndEncoded:
      return 0;
    case kStruct:
    case kFixedSizeList:
      return 1;
    case kBinary:
    case kUtf8:
    case kLargeBinary:
    case kLargeUtf8:
    case kListView:
    case kLargeListView:
      return 3;
    case kUnion: {
      ASSIGN_OR_RETURN(int64_t mode, type_table.Scalar(0, 2, true, 0));
      return mode == 1 ? 2 : 1;  // dense: types and offsets; sparse: types
    }
    case kBinaryView:
    case kUtf8View:
      return absl::InvalidArgumentError("string view columns are not read");
    default:
      return 2;  // validity and data or offsets
  }
}

absl::Status Walk(const Flat& field, const std::string& top, int depth, int* node, int* buffer,
                  std::vector<FlatField>* out) {
  if (depth > 64) return absl::InvalidArgumentError("corrupt Arrow schema: nested too deep");
  FlatField f;
  ASSIGN_OR_RETURN(std::string_view name, field.String(0));
  f.top = top.empty() ? std::string(name) : top;
  ASSIGN_OR_RETURN(int64_t type, field.Scalar(2, 1, false, 0));
  f.type = static_cast<int>(type);
  ASSIGN_OR_RETURN(std::optional<Flat> type_table, field.Table(3));
  ASSIGN_OR_RETURN(std::optional<Flat> dictionary, field.Table(4));
  f.dictionary = dictionary.has_value();
  if (type_table && f.type == kInt) {
    ASSIGN_OR_RETURN(int64_t bits, type_table->Scalar(0, 4, true, 0));
    ASSIGN_OR_RETURN(int64_t is_signed, type_table->Scalar(1, 1, false, 0));
    f.bit_width = static_cast<int>(bits);
    f.is_signed = is_signed != 0;
  }
  if (type_table && f.type == kFixedSizeList) {
    ASSIGN_OR_RETURN(int64_t size, type_table->Scalar(0, 4, true, 0));
    f.list_size = static_cast<int32_t>(size);
  }
  f.node = (*node)++;
  f.buffer = *buffer;
  ASSIGN_OR_RETURN(int count, BufferCount(f, type_table ? *type_table : field));
  *buffer += count;
  ASSIGN_OR_RETURN(std::optional<Flat::Vector> children, field.VectorOf(5, 4));
  f.children = children && !f.dictionary ? static_cast<int>(children->length) : 0;
  out->push_back(f);
  for (int c = 0; c < f.children; ++c) {
    ASSIGN_OR_RETURN(Flat child, field.TableIn(*children, c));
    RETURN_IF_ERROR(Walk(child, f.top, depth + 1, node, buffer, out));
  }
  return absl::OkStatus();
}

}  // namespace

// Where one record batch keeps the column (offsets absolute in the file).
struct ArrowColumn::Batch {
  int index = 0;
  int64_t rows = 0;
  int64_t validity_at = 0, validity_bytes = 0;  // of the list (or plain column); 0: all valid
  int64_t offsets_at = 0, offsets_bytes = 0;    // kList / kLargeList
  int64_t values_at = 0, values_bytes = 0;
  int64_t child_length = 0;             // ids in the values buffer
  int64_t first_value = 0, values = 0;  // its ids' place in the stream
};

// A batch's values: ids (kIntegers) or documents (kText).
struct ArrowColumn::Decoded {
  std::vector<int64_t> ids;
  std::vector<std::string> texts;
};

struct ArrowColumn::Cache {
  DecodedUnits<Batch, Decoded> batches;
};

ArrowColumn::ArrowColumn() : cache_(std::make_unique<Cache>()) {}

ArrowColumn::~ArrowColumn() = default;

absl::StatusOr<std::string> ArrowColumn::ReadBytes(int64_t offset, int64_t size) const {
  return file_->Read(offset, size);
}

std::string ArrowColumn::BatchName(const Batch& batch) const {
  return absl::StrCat(path_, ": column ", column_, ", record batch ", batch.index);
}

absl::Status ArrowColumn::ForEachSpan(const Batch& batch,
                                      const std::function<void(int64_t, int64_t)>& span) const {
  auto loss = [&](const std::string& why) {
    return absl::DataLossError(absl::StrCat(BatchName(batch), ": ", why));
  };
  if (layout_ == Layout::kPlain) {
    span(0, batch.rows);
    return absl::OkStatus();
  }
  ASSIGN_OR_RETURN(std::string validity, ReadBytes(batch.validity_at, batch.validity_bytes));
  ASSIGN_OR_RETURN(std::string offsets, ReadBytes(batch.offsets_at, batch.offsets_bytes));
  if (!validity.empty() && static_cast<uint64_t>(batch.rows) > validity.size() * 8) {
    return loss("a validity bitmap shorter than its rows");
  }
  const int offset_width = layout_ == Layout::kLargeList ? 8 : 4;
  if (layout_ != Layout::kFixedSizeList &&
      static_cast<uint64_t>(batch.rows + 1) * offset_width > offsets.size()) {
    return loss("an offsets buffer shorter than its rows");
  }
  for (int64_t row = 0; row < batch.rows; ++row) {
    if (!validity.empty() && ((validity[row / 8] >> (row % 8)) & 1) == 0) continue;
    int64_t begin, end;
    if (layout_ == Layout::kFixedSizeList) {
      begin = row * list_size_;
      end = begin + list_size_;
    } else if (offset_width == 4) {
      begin = static_cast<int32_t>(LittleEndianAt(offsets.data() + row * 4, 4));
      end = static_cast<int32_t>(LittleEndianAt(offsets.data() + (row + 1) * 4, 4));
    } else {
      begin = static_cast<int64_t>(LittleEndianAt(offsets.data() + row * 8, 8));
      end = static_cast<int64_t>(LittleEndianAt(offsets.data() + (row + 1) * 8, 8));
    }
    if (begin < 0 || end < begin || end > batch.child_length) {
      return loss(
          absl::StrCat("row ", row, " spans ids [", begin, ", ", end, ") of ", batch.child_length));
    }
    span(begin, end);
  }
  return absl::OkStatus();
}

absl::Status ArrowColumn::DecodeBatch(const Batch& batch, Decoded* out) const {
  ASSIGN_OR_RETURN(std::string values, ReadBytes(batch.values_at, batch.values_bytes));
  const int width = bit_width_ / 8;
  if (static_cast<uint64_t>(batch.child_length) * width > values.size()) {
    return absl::DataLossError(absl::StrCat(BatchName(batch), ": ", batch.child_length,
                                            " values in a buffer of ", values.size(), " bytes"));
  }
  if (kind_ == Kind::kText) {
    out->texts.reserve(batch.values);
    RETURN_IF_ERROR(ForEachSpan(batch, [&](int64_t begin, int64_t end) {
      out->texts.emplace_back(values, begin, end - begin);
    }));
  } else {
    out->ids.reserve(batch.values);
    const uint64_t sign = is_signed_ && width < 8 ? uint64_t{1} << (8 * width - 1) : 0;
    RETURN_IF_ERROR(ForEachSpan(batch, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) {
        const uint64_t raw = LittleEndianAt(values.data() + i * width, width);
        out->ids.push_back(static_cast<int64_t>((raw ^ sign) - sign));
      }
    }));
  }
  const size_t decoded = kind_ == Kind::kText ? out->texts.size() : out->ids.size();
  if (static_cast<int64_t>(decoded) != batch.values) {
    return absl::DataLossError(absl::StrCat(BatchName(batch), ": ", decoded, " values, ",
                                            batch.values, " when the file was opened"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<ArrowColumn>> ArrowColumn::Open(const std::string& path,
                                                               const std::string& column,
                                                               Kind kind) {
  std::unique_ptr<ArrowColumn> file(new ArrowColumn());
  file->path_ = path;
  file->kind_ = kind;
  ASSIGN_OR_RETURN(file->file_, RandomAccessFile::Open(path));
  file->file_size_ = file->file_->size();
  auto bad = [&path](const std::string& why) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": ", why));
  };
  // Metadata errors carry no file name; add it.
  auto named = [&path](const absl::Status& status) {
    return absl::Status(status.code(), absl::StrCat(path, ": ", status.message()));
  };

  int64_t at = 0;
  if (file->file_size_ >= 8) {
    ASSIGN_OR_RETURN(std::string magic, file->ReadBytes(0, 8));
    if (magic.compare(0, 6, "ARROW1") == 0) at = 8;  // the file format: a stream after 8 bytes
  }
  std::vector<FlatField> fields;
  std::vector<std::string> tops;
  const FlatField* leaf = nullptr;  // the ids' Int field
  const FlatField* top = nullptr;   // the chosen column
  bool schema_seen = false;
  int batch_index = 0;
  // Reads the schema's fields and chooses the column.
  auto take_schema = [&](const Flat& schema) -> absl::Status {
    schema_seen = true;
    absl::StatusOr<std::optional<Flat::Vector>> list = schema.VectorOf(1, 4);
    if (!list.ok()) return named(list.status());
    int node = 0, buffer = 0;
    for (uint32_t i = 0; *list && i < (*list)->length; ++i) {
      absl::StatusOr<Flat> field = schema.TableIn(**list, i);
      if (!field.ok()) return named(field.status());
      const size_t first = fields.size();
      absl::Status walked = Walk(*field, "", 0, &node, &buffer, &fields);
      if (!walked.ok()) return named(walked);
      tops.push_back(fields[first].top);
    }
    // Choose the column: a list of integers, or integers.
    auto ids_of = [&fields](size_t f) -> const FlatField* {
      const FlatField& field = fields[f];
      if (field.type == kInt && !field.dictionary) return &field;
      if ((field.type == kList || field.type == kLargeList || field.type == kFixedSizeList) &&
          !field.dictionary && f + 1 < fields.size() && fields[f + 1].type == kInt &&
          !fields[f + 1].dictionary) {
        return &fields[f + 1];
      }
      return nullptr;
    };
    std::vector<size_t> top_index;
    for (size_t f = 0; f < fields.size(); ++f) {
      if (f == 0 || fields[f].top != fields[f - 1].top) top_index.push_back(f);
    }
    std::string chosen = column;
    if (chosen.empty() && kind == Kind::kText) chosen = "text";
    if (chosen.empty()) {
      for (const char* usual : {"input_ids", "tokens"}) {
        if (std::find(tops.begin(), tops.end(), usual) != tops.end()) {
          chosen = usual;
          break;
        }
      }
    }
    if (chosen.empty()) {
      std::vector<std::string> integer_columns;
      for (size_t f : top_index) {
        if (ids_of(f) != nullptr) integer_columns.push_back(fields[f].top);
      }
      if (integer_columns.size() != 1) {
        return bad(absl::StrCat("no input_ids or tokens column, and ", integer_columns.size(),
                                " integer columns to choose from (its columns: ",
                                absl::StrJoin(tops, ", "), "); name the column"));
      }
      chosen = integer_columns[0];
    }
    for (size_t f : top_index) {
      if (fields[f].top == chosen) top = &fields[f];
    }
    if (top == nullptr) {
      return bad(
          absl::StrCat("no column ", chosen, " (its columns: ", absl::StrJoin(tops, ", "), ")"));
    }
    if (kind == Kind::kText) {
      // A string column is its own leaf: validity, offsets, then the bytes.
      const bool text = top->type == kUtf8 || top->type == kBinary;
      const bool large_text = top->type == kLargeUtf8 || top->type == kLargeBinary;
      if ((!text && !large_text) || top->dictionary) {
        return bad(absl::StrCat(
            "column ", chosen, " holds ",
            top->dictionary ? "dictionary-encoded values" : absl::StrCat("Arrow type ", top->type),
            ", not text"));
      }
      leaf = top;
      file->column_ = chosen;
      file->layout_ = large_text ? Layout::kLargeList : Layout::kList;
      file->bit_width_ = 8;
      return absl::OkStatus();
    }
    leaf = ids_of(top - fields.data());
    if (top->dictionary) {
      return bad(absl::StrCat("column ", chosen,
                              " is dictionary-encoded; write the ids plainly (or as Parquet)"));
    }
    if (leaf == nullptr) {
      return bad(absl::StrCat("column ", chosen, " holds ",
                              top->type == kUtf8 || top->type == kLargeUtf8
                                  ? "text (`latentctl tokenize` turns text into ids)"
                                  : absl::StrCat("Arrow type ", top->type),
                              ", not integer token ids (a list of integers, or integers)"));
    }
    if (leaf->bit_width != 8 && leaf->bit_width != 16 && leaf->bit_width != 32 &&
        leaf->bit_width != 64) {
      return bad(absl::StrCat("column ", chosen, ": integers of ", leaf->bit_width, " bits"));
    }
    file->column_ = chosen;
    file->layout_ = top->type == kList            ? Layout::kList
                    : top->type == kLargeList     ? Layout::kLargeList
                    : top->type == kFixedSizeList ? Layout::kFixedSizeList
                                                  : Layout::kPlain;
    file->list_size_ = top->list_size;
    if (file->layout_ == Layout::kFixedSizeList && file->list_size_ <= 0) {
      return bad(absl::StrCat("column ", chosen, ": fixed-size lists of ", file->list_size_));
    }
    file->bit_width_ = leaf->bit_width;
    file->is_signed_ = leaf->is_signed;
    return absl::OkStatus();
  };
  if (at == 8 && file->file_size_ >= 18) {
    // The file format: ... footer, its int32 length, "ARROW1". Its schema comes first.
    ASSIGN_OR_RETURN(std::string tail, file->ReadBytes(file->file_size_ - 10, 10));
    const int64_t footer_length = static_cast<int32_t>(LittleEndianAt(tail.data(), 4));
    if (tail.compare(4, 6, "ARROW1") == 0 && footer_length > 0 &&
        footer_length <= std::min<int64_t>(kMaxMetadata, file->file_size_ - 18)) {
      ASSIGN_OR_RETURN(std::string footer,
                       file->ReadBytes(file->file_size_ - 10 - footer_length, footer_length));
      absl::StatusOr<Flat> root = Flat::Root(footer);
      if (!root.ok()) return named(root.status());
      absl::StatusOr<std::optional<Flat>> schema = root->Table(1);
      if (!schema.ok()) return named(schema.status());
      if (*schema) RETURN_IF_ERROR(take_schema(**schema));
    }
  }
  while (at + 4 <= file->file_size_) {
    ASSIGN_OR_RETURN(std::string prefix, file->ReadBytes(at, 4));
    int64_t length = static_cast<int32_t>(LittleEndianAt(prefix.data(), 4));
    at += 4;
    if (length == -1) {  // the continuation marker, then the length
      if (at + 4 > file->file_size_) break;
      ASSIGN_OR_RETURN(prefix, file->ReadBytes(at, 4));
      length = static_cast<int32_t>(LittleEndianAt(prefix.data(), 4));
      at += 4;
    }
    if (length == 0) break;  // end of stream
    if (length < 0 || length > kMaxMetadata || length > file->file_size_ - at) {
      return bad(schema_seen ? absl::StrCat("a message of ", length, " bytes at offset ", at - 4)
                             : "not an Arrow IPC file (stream or Feather v2)");
    }
    ASSIGN_OR_RETURN(std::string metadata, file->ReadBytes(at, length));
    at += length;
    absl::StatusOr<Flat> message = Flat::Root(metadata);
    if (!message.ok()) {
      return schema_seen ? named(message.status())
                         : bad("not an Arrow IPC file (stream or Feather v2)");
    }
    ASSIGN_OR_RETURN(int64_t header_type, message->Scalar(1, 1, false, 0));
    ASSIGN_OR_RETURN(std::optional<Flat> header, message->Table(2));
    ASSIGN_OR_RETURN(int64_t body_length, message->Scalar(3, 8, true, 0));
    if (!header || body_length < 0 || body_length > file->file_size_ - at) {
      return bad(absl::StrCat("a message whose body of ", body_length, " bytes at offset ", at,
                              " runs past the file"));
    }
    const int64_t body = at;
    at += body_length;
    if (header_type == kSchema) {
      // The file format keeps its schema in the footer too (Arrow's JavaScript writer only
      // there); one schema is read, from wherever it comes first.
      if (!schema_seen) RETURN_IF_ERROR(take_schema(*header));
      continue;
    }
    if (header_type != kRecordBatch) continue;  // dictionaries of other columns
    if (!schema_seen) return bad("a record batch before the schema");
    const std::string what = absl::StrCat("record batch ", batch_index);
    auto batch_error = [&](const std::string& why) {
      return absl::DataLossError(absl::StrCat(path, ": ", what, ": ", why));
    };
    ASSIGN_OR_RETURN(std::optional<Flat> compression, header->Table(3));
    if (compression) {
      return bad(
          "its record batches are compressed (Feather's default LZ4 or ZSTD); write it "
          "uncompressed (compression=\"uncompressed\") or as Parquet");
    }
    absl::StatusOr<std::optional<Flat::Vector>> nodes = header->VectorOf(1, 16);
    absl::StatusOr<std::optional<Flat::Vector>> buffers = header->VectorOf(2, 16);
    if (!nodes.ok()) return named(nodes.status());
    if (!buffers.ok()) return named(buffers.status());
    const int needed_node = leaf->node;
    // The ids' data buffer comes last (a string column's bytes, after its offsets).
    const int values_buffer = kind == Kind::kText ? top->buffer + 2 : leaf->buffer + 1;
    const int needed_buffer = values_buffer;
    if (!*nodes || !*buffers || static_cast<int>((*nodes)->length) <= needed_node ||
        static_cast<int>((*buffers)->length) <= needed_buffer) {
      return batch_error("fewer nodes or buffers than the schema has fields");
    }
    auto node_length = [&](int n) { return header->StructField(**nodes, n, 16, 0); };
    auto node_nulls = [&](int n) { return header->StructField(**nodes, n, 16, 1); };
    auto buffer_at = [&](int b, int64_t* where, int64_t* bytes) -> absl::Status {
      const int64_t offset = header->StructField(**buffers, b, 16, 0);
      const int64_t length = header->StructField(**buffers, b, 16, 1);
      if (offset < 0 || length < 0 || offset > body_length - length) {
        return batch_error(absl::StrCat("buffer ", b, " of ", length, " bytes at ", offset,
                                        " outside its body of ", body_length));
      }
      *where = body + offset;
      *bytes = length;
      return absl::OkStatus();
    };
    Batch batch;
    batch.index = batch_index++;
    batch.rows = node_length(top->node);
    if (batch.rows < 0) return batch_error("a negative row count");
    if (kind == Kind::kIntegers && node_nulls(leaf->node) != 0) {
      return bad(absl::StrCat(what, ": ", node_nulls(leaf->node),
                              " null ids; token ids must not be null"));
    }
    int64_t unused = 0;
    if (node_nulls(top->node) > 0) {
      RETURN_IF_ERROR(buffer_at(top->buffer, &batch.validity_at, &batch.validity_bytes));
    } else {
      RETURN_IF_ERROR(buffer_at(top->buffer, &unused, &unused));
    }
    if (file->layout_ == Layout::kList || file->layout_ == Layout::kLargeList) {
      RETURN_IF_ERROR(buffer_at(top->buffer + 1, &batch.offsets_at, &batch.offsets_bytes));
    }
    RETURN_IF_ERROR(buffer_at(values_buffer, &batch.values_at, &batch.values_bytes));
    batch.child_length = kind == Kind::kText ? batch.values_bytes : node_length(leaf->node);
    // Every count is bounded by the buffers that hold it, so nothing below allocates or loops
    // past what the file holds.
    const int width = file->bit_width_ / 8;
    if (batch.child_length < 0 || batch.child_length > batch.values_bytes / width) {
      return batch_error(
          absl::StrCat(batch.child_length, " ids in a buffer of ", batch.values_bytes, " bytes"));
    }
    const int64_t row_ceiling =
        file->layout_ == Layout::kPlain ? batch.child_length
        : file->layout_ == Layout::kFixedSizeList
            ? batch.child_length / file->list_size_
            : batch.offsets_bytes / (file->layout_ == Layout::kLargeList ? 8 : 4) - 1;
    if (batch.rows > row_ceiling) {
      return batch_error(absl::StrCat(batch.rows, " rows where its buffers hold ",
                                      std::max<int64_t>(row_ceiling, 0)));
    }
    // Count the ids from the offsets and validity: which of the child's ids the rows hold (for
    // text, each valid row is a document).
    int64_t values = 0;
    const bool documents = kind == Kind::kText;
    RETURN_IF_ERROR(file->ForEachSpan(batch, [&values, documents](int64_t begin, int64_t end) {
      values += documents ? 1 : end - begin;
    }));
    batch.values = values;
    batch.first_value = file->num_values_;
    file->num_values_ += batch.values;
    file->num_rows_ += batch.rows;
    file->batches_.push_back(batch);
  }
  if (!schema_seen) return bad("not an Arrow IPC file (stream or Feather v2): no schema");
  return file;
}

absl::Status ArrowColumn::ForEachBatch(
    int64_t first, int64_t count,
    const std::function<void(const Decoded&, int64_t, int64_t)>& take) const {
  return cache_->batches.ForEach(
      batches_, num_values_, path_, first, count,
      [this](const Batch& batch, Decoded* decoded) { return DecodeBatch(batch, decoded); }, take);
}

absl::Status ArrowColumn::Read(int64_t first, int64_t count, int64_t* out) const {
  if (kind_ != Kind::kIntegers) {
    return absl::FailedPreconditionError(
        absl::StrCat(path_, ": column ", column_, " is not integers"));
  }
  return ForEachBatch(first, count, [&out](const Decoded& values, int64_t offset, int64_t n) {
    std::copy(values.ids.begin() + offset, values.ids.begin() + offset + n, out);
    out += n;
  });
}

absl::Status ArrowColumn::ReadText(int64_t first, int64_t count,
                                   std::vector<std::string>* out) const {
  if (kind_ != Kind::kText) {
    return absl::FailedPreconditionError(absl::StrCat(path_, ": column ", column_, " is not text"));
  }
  out->clear();
  return ForEachBatch(first, count, [out](const Decoded& values, int64_t offset, int64_t n) {
    out->insert(out->end(), values.texts.begin() + offset, values.texts.begin() + offset + n);
  });
}

}  // namespace latentd
