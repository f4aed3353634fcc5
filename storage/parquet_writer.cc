#include "storage/parquet_writer.h"

#include <unistd.h>
#include <zstd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "common/thrift_compact.h"

namespace latentd::storage {
namespace {

// parquet.thrift's values used here.
constexpr int32_t kTypeInt32 = 1, kTypeInt64 = 2, kTypeFloat = 4;
constexpr int32_t kRequired = 0, kOptional = 1, kRepeated = 2;
constexpr int32_t kConvertedList = 3;
constexpr int32_t kEncodingPlain = 0, kEncodingRle = 3;
constexpr int32_t kCodecZstd = 6;
constexpr int kZstdLevel = 3;
// A list column's levels: optional group (1) > repeated group (2) > required element.
constexpr uint32_t kDefinitionEmpty = 1, kDefinitionValue = 2;

int32_t PhysicalType(ParquetField::Type type) {
  switch (type) {
    case ParquetField::Type::kInt32:
      return kTypeInt32;
    case ParquetField::Type::kInt64:
      return kTypeInt64;
    case ParquetField::Type::kFloat:
      return kTypeFloat;
  }
  return kTypeInt32;
}

int ValueBytes(ParquetField::Type type) { return type == ParquetField::Type::kInt64 ? 8 : 4; }

void PutU32(uint32_t v, std::string* out) {
  for (int i = 0; i < 4; ++i) out->push_back(static_cast<char>(v >> (8 * i)));
}

// The RLE half of Parquet's RLE / bit-packed hybrid: runs of one value, merged as they come.
class RunWriter {
 public:
  explicit RunWriter(int bit_width) : bytes_per_value_((bit_width + 7) / 8) {}
  void Add(uint32_t value, uint64_t count) {
    if (count == 0) return;
    if (count_ > 0 && value != value_) Flush();
    value_ = value;
    count_ += count;
  }
  // The runs, after a 4-byte length (how a v1 page stores its levels).
  std::string Finish() {
    Flush();
    std::string out;
    PutU32(static_cast<uint32_t>(runs_.size()), &out);
    return out + runs_;
  }

 private:
  void Flush() {
    if (count_ == 0) return;
    uint64_t header = count_ << 1;
    while (header >= 0x80) {
      runs_.push_back(static_cast<char>((header & 0x7f) | 0x80));
      header >>= 7;
    }
    runs_.push_back(static_cast<char>(header));
    for (int i = 0; i < bytes_per_value_; ++i)
      runs_.push_back(static_cast<char>(value_ >> (8 * i)));
    count_ = 0;
  }
  int bytes_per_value_;
  uint32_t value_ = 0;
  uint64_t count_ = 0;
  std::string runs_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<ParquetWriter>> ParquetWriter::Create(
    const std::string& path, std::vector<ParquetField> fields,
    std::vector<std::pair<std::string, std::string>> metadata) {
  std::unique_ptr<ParquetWriter> writer(new ParquetWriter());
  writer->path_ = path;
  writer->fields_ = std::move(fields);
  writer->metadata_ = std::move(metadata);
  writer->file_ = std::fopen(path.c_str(), "wb");
  if (writer->file_ == nullptr) {
    return absl::PermissionDeniedError(
        absl::StrCat("cannot create ", path, ": ", std::strerror(errno)));
  }
  RETURN_IF_ERROR(writer->Write("PAR1"));
  return writer;
}

ParquetWriter::~ParquetWriter() {
  if (file_ != nullptr) std::fclose(file_);
}

absl::Status ParquetWriter::Write(const std::string& bytes) {
  if (std::fwrite(bytes.data(), 1, bytes.size(), file_) != bytes.size()) {
    return absl::ResourceExhaustedError(
        absl::StrCat("writing ", path_, ": ", std::strerror(errno)));
  }
  offset_ += static_cast<int64_t>(bytes.size());
  return absl::OkStatus();
}

absl::Status ParquetWriter::AppendRowGroup(int64_t rows, const std::vector<ColumnData>& columns) {
  if (columns.size() != fields_.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat(columns.size(), " columns for ", fields_.size(), " fields"));
  }
  Group group;
  group.rows = rows;
  for (size_t c = 0; c < fields_.size(); ++c) {
    const ParquetField& field = fields_[c];
    const ColumnData& data = columns[c];
    const int width = ValueBytes(field.type);
    // The page: levels (list fields), then the values, PLAIN.
    std::string body;
    int64_t level_values = data.count;
    int64_t empty_lists = 0;
    if (field.list) {
      if (data.offsets == nullptr || data.offsets[0] != 0 || data.offsets[rows] != data.count) {
        return absl::InvalidArgumentError(absl::StrCat(
            "column ", field.name, ": offsets do not span its ", data.count, " values"));
      }
      RunWriter repetition(1), definition(2);
      for (int64_t row = 0; row < rows; ++row) {
        const int64_t n = data.offsets[row + 1] - data.offsets[row];
        if (n < 0) {
          return absl::InvalidArgumentError(
              absl::StrCat("column ", field.name, ": offsets descend at row ", row));
        }
        repetition.Add(0, 1);
        repetition.Add(1, n > 0 ? n - 1 : 0);
        if (n == 0) {
          definition.Add(kDefinitionEmpty, 1);
          ++empty_lists;
        } else {
          definition.Add(kDefinitionValue, n);
        }
      }
      level_values = data.count + empty_lists;
      body = repetition.Finish() + definition.Finish();
    } else if (data.count != rows) {
      return absl::InvalidArgumentError(
          absl::StrCat("column ", field.name, ": ", data.count, " values for ", rows, " rows"));
    }
    body.append(static_cast<const char*>(data.values), data.count * width);
    std::string compressed(ZSTD_compressBound(body.size()), '\0');
    const size_t n =
        ZSTD_compress(compressed.data(), compressed.size(), body.data(), body.size(), kZstdLevel);
    if (ZSTD_isError(n)) {
      return absl::InternalError(absl::StrCat("zstd: ", ZSTD_getErrorName(n)));
    }
    compressed.resize(n);

    ThriftWriter header;
    header.I32(1, 0);  // DATA_PAGE
    header.I32(2, static_cast<int32_t>(body.size()));
    header.I32(3, static_cast<int32_t>(compressed.size()));
    header.BeginStruct(5);
    header.I32(1, static_cast<int32_t>(level_values));
    header.I32(2, kEncodingPlain);
    header.I32(3, kEncodingRle);
    header.I32(4, kEncodingRle);
    header.EndStruct();
    const std::string header_bytes = header.Finish();
    const int64_t page_offset = offset_;
    RETURN_IF_ERROR(Write(header_bytes));
    RETURN_IF_ERROR(Write(compressed));
    const int64_t uncompressed_total = static_cast<int64_t>(header_bytes.size() + body.size());
    group.bytes += uncompressed_total;

    ThriftWriter chunk;
    chunk.I64(2, page_offset);  // file_offset
    chunk.BeginStruct(3);       // ColumnMetaData
    chunk.I32(1, PhysicalType(field.type));
    chunk.BeginList(2, ThriftWriter::Element::kI32, 2);
    chunk.ListI32(kEncodingPlain);
    chunk.ListI32(kEncodingRle);
    chunk.BeginList(3, ThriftWriter::Element::kBinary, field.list ? 3 : 1);
    chunk.ListBinary(field.name);
    if (field.list) {
      chunk.ListBinary("list");
      chunk.ListBinary("element");
    }
    chunk.I32(4, kCodecZstd);
    chunk.I64(5, level_values);
    chunk.I64(6, uncompressed_total);
    chunk.I64(7, static_cast<int64_t>(header_bytes.size() + compressed.size()));
    chunk.I64(9, page_offset);
    chunk.BeginStruct(12);  // Statistics: entries without a value (empty lists)
    chunk.I64(3, empty_lists);
    chunk.EndStruct();
    chunk.EndStruct();
    group.chunks.push_back(chunk.Finish());
  }
  rows_ += rows;
  groups_.push_back(std::move(group));
  return absl::OkStatus();
}

absl::Status ParquetWriter::Finish() {
  ThriftWriter footer;
  footer.I32(1, 1);  // version
  // The schema, depth first: the root, then each field (a list field as three elements).
  uint32_t elements = 1;
  for (const ParquetField& field : fields_) elements += field.list ? 3 : 1;
  footer.BeginList(2, ThriftWriter::Element::kStruct, elements);
  footer.BeginListStruct();
  footer.Binary(4, "schema");
  footer.I32(5, static_cast<int32_t>(fields_.size()));
  footer.EndStruct();
  for (const ParquetField& field : fields_) {
    footer.BeginListStruct();
    if (field.list) {
      footer.I32(3, kOptional);
      footer.Binary(4, field.name);
      footer.I32(5, 1);
      footer.I32(6, kConvertedList);
      footer.BeginStruct(10);  // logicalType: LIST
      footer.BeginStruct(3);
      footer.EndStruct();
      footer.EndStruct();
      footer.EndStruct();
      footer.BeginListStruct();
      footer.I32(3, kRepeated);
      footer.Binary(4, "list");
      footer.I32(5, 1);
      footer.EndStruct();
      footer.BeginListStruct();
    }
    footer.I32(1, PhysicalType(field.type));
    footer.I32(3, kRequired);
    footer.Binary(4, field.list ? "element" : field.name);
    footer.EndStruct();
  }
  footer.I64(3, rows_);
  footer.BeginList(4, ThriftWriter::Element::kStruct, static_cast<uint32_t>(groups_.size()));
  for (const Group& group : groups_) {
    footer.BeginListStruct();
    footer.BeginList(1, ThriftWriter::Element::kStruct, static_cast<uint32_t>(group.chunks.size()));
    for (const std::string& chunk : group.chunks) footer.RawListStruct(chunk);
    footer.I64(2, group.bytes);
    footer.I64(3, group.rows);
    footer.EndStruct();
  }
  footer.BeginList(5, ThriftWriter::Element::kStruct, static_cast<uint32_t>(metadata_.size()));
  for (const auto& [key, value] : metadata_) {
    footer.BeginListStruct();
    footer.Binary(1, key);
    footer.Binary(2, value);
    footer.EndStruct();
  }
  footer.Binary(6, "latentd");
  const std::string bytes = footer.Finish();
  RETURN_IF_ERROR(Write(bytes));
  std::string tail;
  PutU32(static_cast<uint32_t>(bytes.size()), &tail);
  RETURN_IF_ERROR(Write(tail + "PAR1"));
  const bool flushed = std::fflush(file_) == 0 && fsync(fileno(file_)) == 0;
  const int closed = std::fclose(file_);
  file_ = nullptr;
  if (!flushed || closed != 0) {
    return absl::ResourceExhaustedError(
        absl::StrCat("writing ", path_, ": ", std::strerror(errno)));
  }
  return absl::OkStatus();
}

}  // namespace latentd::storage
