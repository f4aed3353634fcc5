// Writing Parquet files of per-row values and per-row lists, the layout export writes for pandas,
// polars, DuckDB and the Hugging Face Hub: each column is INT32, INT64 or FLOAT, either one
// value a row (required) or a list a row (Arrow's LIST layout: an optional group of a repeated
// group of required elements, so an empty list is a list, not a null). Data pages v1, PLAIN
// values, RLE levels, ZSTD pages; one page per column per row group; footer key-value metadata.
//
// Write rows with AppendRowGroup (rows in one group share its pages: choose groups of about a
// million values), then Finish. Nothing is valid until Finish returns OK (the footer comes last),
// so a caller writes to a temporary name and renames.
#ifndef LATENTD_STORAGE_PARQUET_WRITER_H_
#define LATENTD_STORAGE_PARQUET_WRITER_H_

#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"

namespace latentd::storage {

struct ParquetField {
  enum class Type { kInt32, kInt64, kFloat };
  std::string name;
  Type type = Type::kInt32;
  bool list = false;  // a list a row, else one value a row
};

class ParquetWriter {
 public:
  // A column's data for one row group: `count` values (int32_t, int64_t or float by the field's
  // type) and, for a list field, rows + 1 offsets into them (offsets[0] == 0, ascending,
  // offsets[rows] == count).
  struct ColumnData {
    const void* values = nullptr;
    int64_t count = 0;
    const int64_t* offsets = nullptr;
  };

  // PERMISSION_DENIED when `path` cannot be created.
  static absl::StatusOr<std::unique_ptr<ParquetWriter>> Create(
      const std::string& path, std::vector<ParquetField> fields,
      std::vector<std::pair<std::string, std::string>> metadata);
  ~ParquetWriter();

  // INVALID_ARGUMENT for data that does not fit the fields (a count or offsets off);
  // RESOURCE_EXHAUSTED when the disk refuses the bytes.
  absl::Status AppendRowGroup(int64_t rows, const std::vector<ColumnData>& columns);
  // The footer; the file is flushed, synced and closed.
  absl::Status Finish();

 private:
  struct ChunkMeta;
  ParquetWriter() = default;
  absl::Status Write(const std::string& bytes);

  std::string path_;
  std::FILE* file_ = nullptr;
  int64_t offset_ = 0;
  std::vector<ParquetField> fields_;
  std::vector<std::pair<std::string, std::string>> metadata_;
  int64_t rows_ = 0;
  // Per row group: its rows, its bytes, and each column chunk's metadata.
  struct Group {
    int64_t rows = 0;
    int64_t bytes = 0;
    std::vector<std::string> chunks;  // ColumnChunk structs, encoded
  };
  std::vector<Group> groups_;
};

}  // namespace latentd::storage

#endif  // LATENTD_STORAGE_PARQUET_WRITER_H_
