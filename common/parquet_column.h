// Reading one column of an Apache Parquet file as a stream of values. Two kinds:
// - kIntegers: the token ids of a pretokenized Hugging Face dataset (an "input_ids" or "tokens"
//   column of lists, as SAELens' pretokenizer, datasets' to_parquet and pyarrow write it), every
//   list of the column in row order concatenated; a plain integer column is one id per row.
//   INT32 or INT64, signed or annotated unsigned (uint16 ids are INT32 with an unsigned 16-bit
//   annotation). An empty or null list holds no value; a null value inside a list (or in a plain
//   column) is refused rather than made up.
// - kText: a string column (BYTE_ARRAY), one document per row (FineWeb's, RedPajama's,
//   Wikipedia's "text"); a null row is no document.
// Torch-free and without libarrow: the footer and page headers are read with a Thrift compact
// reader (common/thrift_compact), pages are decoded here.
//
// Supported, which covers what pyarrow, arrow-rs, parquet-mr, polars and DuckDB write: data
// pages v1 and v2; PLAIN and dictionary values (RLE_DICTIONARY / PLAIN_DICTIONARY, with the
// dictionary falling back to PLAIN mid-chunk); integers also DELTA_BINARY_PACKED and
// BYTE_STREAM_SPLIT, text also DELTA_LENGTH_BYTE_ARRAY and DELTA_BYTE_ARRAY; UNCOMPRESSED,
// SNAPPY, GZIP, ZSTD and LZ4_RAW pages.
//
// Open reads the footer and every page header of the column (not the data, except for level
// counts where the header does not say how many values a v1 page holds), so Read can go
// straight to the pages a range needs. Read decompresses and decodes those pages, keeping the
// last page and each chunk's dictionary decoded for the next call; it is safe to call from
// several threads.
//
// Errors name the file (and column, row group, page): INVALID_ARGUMENT for a file that is not
// Parquet, a column that is missing or of the other kind, an unsupported codec or encoding, a
// null id; DATA_LOSS for a page whose bytes do not decode as its header says.
#ifndef LATENTD_COMMON_PARQUET_COLUMN_H_
#define LATENTD_COMMON_PARQUET_COLUMN_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"

namespace latentd {

class ParquetPageReader;  // parquet_column.cc
class RandomAccessFile;

class ParquetColumn {
 public:
  // kFloats: a FLOAT column or list of FLOATs, values as they are (what export writes).
  enum class Kind { kIntegers, kText, kFloats };

  // Opens `path`'s top-level column `column` of this kind; "" picks, for kIntegers,
  // "input_ids", else "tokens", else the file's only integer column; for kText, "text".
  // NOT_FOUND for a missing file.
  static absl::StatusOr<std::unique_ptr<ParquetColumn>> Open(const std::string& path,
                                                             const std::string& column,
                                                             Kind kind = Kind::kIntegers);
  ~ParquetColumn();

  const std::string& path() const { return path_; }
  const std::string& column() const { return column_; }
  int64_t num_values() const { return num_values_; }  // the stream's length
  int64_t num_rows() const { return num_rows_; }      // the file's rows
  // The footer's key-value metadata (pandas' and Arrow's schemas, an exporter's own).
  const std::vector<std::pair<std::string, std::string>>& metadata() const { return metadata_; }

  // Values [first, first + count) of the stream. OUT_OF_RANGE outside [0, num_values()),
  // FAILED_PRECONDITION on a column of the other kind.
  absl::Status Read(int64_t first, int64_t count, int64_t* out) const;
  absl::Status ReadText(int64_t first, int64_t count, std::vector<std::string>* out) const;
  absl::Status ReadFloats(int64_t first, int64_t count, float* out) const;

 private:
  struct Page;
  struct Chunk;
  struct Values;
  struct Cache;
  ParquetColumn();

  // Reads the page headers of a column chunk into pages_. `without_nulls`: the chunk's
  // statistics say every level entry is a value, so v1 pages need not be decoded to count them.
  absl::Status IndexChunk(int chunk_index, int64_t start, int64_t size, int64_t level_values,
                          bool without_nulls);
  absl::StatusOr<std::string> ReadBytes(int64_t offset, int64_t size) const;
  absl::StatusOr<std::string> Uncompress(const std::string& what, int64_t codec,
                                         std::string compressed, int64_t uncompressed_size) const;
  absl::StatusOr<std::shared_ptr<const Values>> Dictionary(int chunk_index) const;
  // The page's values (nulls and empty lists skipped); with values == nullptr only counts them.
  absl::Status DecodePage(const Page& page, Values* values, int64_t* count) const;
  // n values of `encoding` from `reader` (dictionary indices look in chunk `chunk`'s dictionary;
  // chunk -1 is the dictionary page itself).
  absl::Status DecodeValues(ParquetPageReader& reader, int64_t encoding, int64_t n, int chunk,
                            Values* out) const;
  // Calls take(values, offset, n) for the part of each page that [first, first + count) covers.
  absl::Status ForEachPage(int64_t first, int64_t count,
                           const std::function<void(const Values&, int64_t, int64_t)>& take) const;
  std::string PageName(const Page& page) const;

  std::string path_;
  std::string column_;
  std::unique_ptr<RandomAccessFile> file_;
  Kind kind_ = Kind::kIntegers;
  int physical_type_ = 0;   // 1 INT32, 2 INT64, 6 BYTE_ARRAY
  bool unsigned_ = false;   // the values are unsigned (INT32 holds uint32 bits)
  int max_definition_ = 0;  // levels of the leaf
  int max_repetition_ = 0;
  // A definition level below this is an empty or null list (or, for text, a null row): no value.
  int list_definition_ = 0;
  int64_t num_values_ = 0;
  int64_t num_rows_ = 0;
  std::vector<std::pair<std::string, std::string>> metadata_;
  std::vector<Chunk> chunks_;
  std::vector<Page> pages_;  // data pages in stream order; first_value ascending
  std::unique_ptr<Cache> cache_;
};

}  // namespace latentd

#endif  // LATENTD_COMMON_PARQUET_COLUMN_H_
