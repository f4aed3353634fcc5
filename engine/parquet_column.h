// Reading one integer column of an Apache Parquet file as a stream of values: the token ids of
// a pretokenized Hugging Face dataset (an "input_ids" or "tokens" column of lists, as SAELens'
// pretokenizer, datasets' to_parquet and pyarrow write it), every list of the column in row order
// concatenated. Torch-free and without libarrow: the footer and page headers are read with a
// Thrift compact reader (engine/thrift_compact), pages are decoded here.
//
// Supported, which covers what pyarrow, arrow-rs, parquet-mr, polars and DuckDB write for integer
// columns: data pages v1 and v2; PLAIN, RLE_DICTIONARY / PLAIN_DICTIONARY (with the dictionary
// falling back to PLAIN mid-chunk) and DELTA_BINARY_PACKED values; UNCOMPRESSED, SNAPPY, GZIP,
// ZSTD and LZ4_RAW pages; INT32 and INT64 physical types, signed or annotated unsigned (uint16
// ids are INT32 with an unsigned 16-bit annotation); a column that is a list of integers or a
// plain integer column. An empty or null list holds no value; a null value inside a list (or in
// a plain column) is refused rather than made up.
//
// Open reads the footer and every page header of the column (not the data, except for level
// counts where the header does not say how many values a v1 page holds), so Read can go
// straight to the pages a range needs. Read decompresses and decodes those pages, keeping the
// last page and each chunk's dictionary decoded for the next call; it is safe to call from
// several threads.
//
// Errors name the file (and column, row group, page): INVALID_ARGUMENT for a file that is not
// Parquet, a column that is missing or not integers, an unsupported codec or encoding, a null
// id; DATA_LOSS for a page whose bytes do not decode as its header says.
#ifndef LATENTD_ENGINE_PARQUET_COLUMN_H_
#define LATENTD_ENGINE_PARQUET_COLUMN_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace latentd::engine {

class ParquetIntColumn {
 public:
  // Opens `path`'s top-level column `column`; "" picks "input_ids", else "tokens", else the
  // file's only integer column. NOT_FOUND for a missing file.
  static absl::StatusOr<std::unique_ptr<ParquetIntColumn>> Open(const std::string& path,
                                                                const std::string& column);
  ~ParquetIntColumn();

  const std::string& path() const { return path_; }
  const std::string& column() const { return column_; }
  int64_t num_values() const { return num_values_; }  // the stream's length
  int64_t num_rows() const { return num_rows_; }      // the file's rows (lists)

  // Values [first, first + count) of the stream. OUT_OF_RANGE outside [0, num_values()).
  absl::Status Read(int64_t first, int64_t count, int64_t* out) const;

 private:
  struct Page;
  struct Chunk;
  struct Cache;
  ParquetIntColumn();

  // Reads the page headers of a column chunk into pages_. `without_nulls`: the chunk's
  // statistics say every level entry is a value, so v1 pages need not be decoded to count them.
  absl::Status IndexChunk(int chunk_index, int64_t start, int64_t size, int64_t level_values,
                          bool without_nulls);
  absl::StatusOr<std::string> ReadBytes(int64_t offset, int64_t size) const;
  absl::StatusOr<std::string> Uncompress(const std::string& what, int64_t codec,
                                         std::string compressed, int64_t uncompressed_size) const;
  absl::StatusOr<std::shared_ptr<const std::vector<int64_t>>> Dictionary(int chunk_index) const;
  // The page's values (nulls and empty lists skipped); with values == nullptr only counts them.
  absl::Status DecodePage(const Page& page, std::vector<int64_t>* values, int64_t* count) const;
  std::string PageName(const Page& page) const;

  std::string path_;
  std::string column_;
  int fd_ = -1;
  int physical_type_ = 0;   // 1 INT32, 2 INT64
  bool unsigned_ = false;   // the values are unsigned (INT32 holds uint32 bits)
  int max_definition_ = 0;  // levels of the leaf
  int max_repetition_ = 0;
  int list_definition_ = 0;  // a definition level below this is an empty or null list
  int64_t num_values_ = 0;
  int64_t num_rows_ = 0;
  std::vector<Chunk> chunks_;
  std::vector<Page> pages_;  // data pages in stream order; first_value ascending
  std::unique_ptr<Cache> cache_;
};

}  // namespace latentd::engine

#endif  // LATENTD_ENGINE_PARQUET_COLUMN_H_
