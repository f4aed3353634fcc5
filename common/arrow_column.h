// Reading one column of an Apache Arrow IPC file as a stream of values. kIntegers: the token ids
// of a dataset Hugging Face `datasets` tokenized and wrote to disk (save_to_disk's
// data-00000-of-00001.arrow, the cache files of load_dataset and map), an "input_ids" or
// "tokens" column of lists, every list in row order concatenated. kText: a string column
// (Utf8, LargeUtf8, Binary), one document a row, null rows none (`latentctl tokenize`). Both IPC
// framings are read: the stream format (what `datasets` writes) and the file format (Feather v2,
// "ARROW1"). Torch-free and without libarrow: the flatbuffer metadata is read here, bounds-checked.
//
// The column may be a List, LargeList or FixedSizeList of integers, or a plain integer column
// (one id per row); 8 to 64 bits, signed or unsigned. A null or empty list holds no id; a null
// id is refused rather than made up. Compressed bodies (Feather's default LZ4) and
// dictionary-encoded token columns are INVALID_ARGUMENT saying how to write the file instead.
//
// Open reads every message's metadata and each record batch's list offsets (4 or 8 bytes a row),
// not the ids; Read reads the batches a range covers, keeping the last one decoded. Safe to call
// from several threads. Errors name the file, column and record batch: INVALID_ARGUMENT for what
// is not such a file or column, DATA_LOSS for a batch whose buffers contradict its metadata.
#ifndef LATENTD_COMMON_ARROW_COLUMN_H_
#define LATENTD_COMMON_ARROW_COLUMN_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace latentd {

class RandomAccessFile;

class ArrowColumn {
 public:
  enum class Kind { kIntegers, kText };

  // Opens `path`'s top-level column `column`; "" picks, for kIntegers, "input_ids", else
  // "tokens", else the file's only integer (or list of integers) column; for kText, "text".
  // NOT_FOUND for a missing file.
  static absl::StatusOr<std::unique_ptr<ArrowColumn>> Open(const std::string& path,
                                                           const std::string& column,
                                                           Kind kind = Kind::kIntegers);
  ~ArrowColumn();

  const std::string& path() const { return path_; }
  const std::string& column() const { return column_; }
  int64_t num_values() const { return num_values_; }  // the stream's length
  int64_t num_rows() const { return num_rows_; }

  // Values [first, first + count) of the stream. OUT_OF_RANGE outside [0, num_values()),
  // FAILED_PRECONDITION on a column of the other kind.
  absl::Status Read(int64_t first, int64_t count, int64_t* out) const;
  absl::Status ReadText(int64_t first, int64_t count, std::vector<std::string>* out) const;

 private:
  struct Batch;
  struct Decoded;
  struct Cache;
  ArrowColumn();

  absl::StatusOr<std::string> ReadBytes(int64_t offset, int64_t size) const;
  // Calls span(begin, end) with each valid row's ids among the batch's values, in row order
  // (reads the validity bitmap and offsets, not the ids).
  absl::Status ForEachSpan(const Batch& batch,
                           const std::function<void(int64_t, int64_t)>& span) const;
  // The batch's ids (or documents), in row order (null and empty lists skipped).
  absl::Status DecodeBatch(const Batch& batch, Decoded* out) const;
  // Calls take(values, offset, n) for the part of each batch [first, first + count) covers.
  absl::Status ForEachBatch(
      int64_t first, int64_t count,
      const std::function<void(const Decoded&, int64_t, int64_t)>& take) const;
  std::string BatchName(const Batch& batch) const;

  std::string path_;
  std::string column_;
  std::unique_ptr<RandomAccessFile> file_;
  int64_t file_size_ = 0;
  Kind kind_ = Kind::kIntegers;
  // The column's layout (a string column's offsets are a kList's or kLargeList's).
  enum class Layout { kPlain, kList, kLargeList, kFixedSizeList };
  Layout layout_ = Layout::kPlain;
  int32_t list_size_ = 0;  // kFixedSizeList
  int bit_width_ = 32;
  bool is_signed_ = true;
  int64_t num_values_ = 0;
  int64_t num_rows_ = 0;
  std::vector<Batch> batches_;  // first_value ascending
  std::unique_ptr<Cache> cache_;
};

}  // namespace latentd

#endif  // LATENTD_COMMON_ARROW_COLUMN_H_
