#include "common/parquet_column.h"

#include <lz4.h>
#include <snappy.h>
#include <zlib.h>
#include <zstd.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <map>
#include <mutex>
#include <string_view>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/decoded_units.h"
#include "common/random_access_file.h"
#include "common/status_macros.h"
#include "common/thrift_compact.h"

namespace latentd {
namespace {

// parquet.thrift's enums, as far as an integer column needs them.
enum PhysicalType { kInt32 = 1, kInt64 = 2, kFloat = 4, kByteArray = 6 };
enum Repetition { kRequired = 0, kOptional = 1, kRepeated = 2 };
enum PageType { kDataPage = 0, kIndexPage = 1, kDictionaryPage = 2, kDataPageV2 = 3 };
enum Encoding {
  kPlain = 0,
  kPlainDictionary = 2,
  kRle = 3,
  kDeltaBinaryPacked = 5,
  kDeltaLengthByteArray = 6,
  kDeltaByteArray = 7,
  kRleDictionary = 8,
  kByteStreamSplit = 9,
};
enum Codec { kUncompressed = 0, kSnappy = 1, kGzip = 2, kZstd = 6, kLz4Raw = 7 };

// Writers cut pages at about 1 MiB (pyarrow, arrow-rs) or 20,000 rows: half a million ids at
// most. A header claiming more is refused before anything that size is allocated.
constexpr int64_t kMaxPageValues = int64_t{1} << 24;
// Below this a page's uncompressed size is taken on trust (see Uncompress).
constexpr int64_t kMaxUncompressedFloor = int64_t{16} << 20;

const char* const kTypeNames[] = {"BOOLEAN", "INT32",  "INT64",      "INT96",
                                  "FLOAT",   "DOUBLE", "BYTE_ARRAY", "FIXED_LEN_BYTE_ARRAY"};
const char* const kCodecNames[] = {"UNCOMPRESSED", "SNAPPY", "GZIP", "LZO",
                                   "BROTLI",       "LZ4",    "ZSTD", "LZ4_RAW"};

std::string TypeName(int64_t t) {
  return t >= 0 && t < 8 ? kTypeNames[t] : absl::StrCat("type ", t);
}
std::string CodecName(int64_t c) {
  return c >= 0 && c < 8 ? kCodecNames[c] : absl::StrCat("codec ", c);
}

int BitWidth(uint64_t max_value) {
  int w = 0;
  while (max_value > 0) {
    ++w;
    max_value >>= 1;
  }
  return w;
}

uint32_t Load32(const uint8_t* p) {
  return static_cast<uint32_t>(p[0]) | static_cast<uint32_t>(p[1]) << 8 |
         static_cast<uint32_t>(p[2]) << 16 | static_cast<uint32_t>(p[3]) << 24;
}

uint64_t Load64(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

// Bits [bit, bit + width) of a little-endian bit stream (Parquet packs values LSB first).
// `padded` must have 16 readable bytes past the last byte the stream uses.
uint64_t UnpackBits(const uint8_t* padded, uint64_t bit, int width) {
  if (width == 0) return 0;
  const uint8_t* p = padded + bit / 8;
  const int shift = static_cast<int>(bit % 8);
  uint64_t v = Load64(p) >> shift;
  if (shift + width > 64) v |= Load64(p + 8) << (64 - shift);
  return width == 64 ? v : v & ((uint64_t{1} << width) - 1);
}

}  // namespace

// A cursor over a page's bytes; every read is bounds-checked (DATA_LOSS on a short page).
class ParquetPageReader {
 public:
  // Takes the page's bytes (no copy: a page is decoded once per read).
  ParquetPageReader(std::string bytes, std::string what)
      : size_(bytes.size()), padded_(std::move(bytes)), what_(std::move(what)) {
    // A zero tail lets UnpackBits read whole words at the end of the page.
    padded_.resize(size_ + 16, '\0');
  }
  size_t left() const { return size_ - at_; }
  const std::string& what() const { return what_; }
  size_t position() const { return at_; }
  const uint8_t* data() const { return Byte(at_); }

  absl::Status Fail(const std::string& why) const {
    return absl::DataLossError(absl::StrCat(what_, ": ", why));
  }
  absl::Status Skip(size_t n) {
    if (n > left()) return Fail("shorter than its header says");
    at_ += n;
    return absl::OkStatus();
  }
  absl::StatusOr<uint64_t> Varint() {
    uint64_t v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      if (left() == 0) return Fail("truncated varint");
      const uint8_t b = *Byte(at_++);
      v |= static_cast<uint64_t>(b & 0x7f) << shift;
      if ((b & 0x80) == 0) return v;
    }
    return Fail("varint longer than 10 bytes");
  }
  absl::StatusOr<int64_t> ZigZag() {
    ASSIGN_OR_RETURN(uint64_t v, Varint());
    return static_cast<int64_t>(v >> 1) ^ -static_cast<int64_t>(v & 1);
  }
  absl::StatusOr<uint32_t> Fixed32() {
    if (left() < 4) return Fail("truncated");
    const uint32_t v = Load32(Byte(at_));
    at_ += 4;
    return v;
  }

  // `n` values of the RLE / bit-packed hybrid encoding, `width` bits each, up to `end` (a
  // position in this page).
  absl::Status Hybrid(int width, int64_t n, size_t end, uint32_t* out) {
    if (width > 32) return Fail(absl::StrCat("bit width ", width, " above 32"));
    const size_t byte_width = (width + 7) / 8;
    int64_t done = 0;
    while (done < n) {
      if (at_ >= end) return Fail("RLE run past the end of its section");
      ASSIGN_OR_RETURN(uint64_t header, Varint());
      if (header & 1) {  // bit-packed: (header >> 1) groups of 8 values
        const uint64_t groups = header >> 1;
        if (width > 0 && groups > (end - at_) / width) {
          return Fail("bit-packed run past the end of its section");
        }
        const uint64_t bytes = groups * width;
        const uint64_t values =
            std::min<uint64_t>(std::min<uint64_t>(groups, (n - done + 7) / 8) * 8, n - done);
        for (uint64_t i = 0; i < values; ++i) {
          out[done + i] = static_cast<uint32_t>(UnpackBits(data(), i * width, width));
        }
        done += values;
        at_ += bytes;
      } else {  // RLE: (header >> 1) copies of one value
        const uint64_t run = header >> 1;
        if (run == 0) return Fail("empty RLE run");
        if (byte_width > end - at_) return Fail("RLE value past the end of its section");
        uint32_t value = 0;
        for (size_t i = byte_width; i > 0; --i) value = (value << 8) | *Byte(at_ + i - 1);
        at_ += byte_width;
        const uint64_t values = std::min<uint64_t>(run, n - done);
        std::fill(out + done, out + done + values, value);
        done += values;
      }
    }
    return absl::OkStatus();
  }

  // PLAIN byte arrays: a 4-byte length, then the bytes, n times.
  absl::Status ByteArrays(int64_t n, std::vector<std::string>* out) {
    if (static_cast<uint64_t>(n) > left() / 4)
      return Fail(absl::StrCat(n, " strings in ", left(), " bytes"));
    out->resize(n);
    for (int64_t i = 0; i < n; ++i) {
      ASSIGN_OR_RETURN(uint32_t length, Fixed32());
      if (length > left()) return Fail(absl::StrCat("a string of ", length, " bytes in ", left()));
      (*out)[i].assign(reinterpret_cast<const char*>(data()), length);
      at_ += length;
    }
    return absl::OkStatus();
  }

  // n strings whose lengths were decoded already, stored back to back.
  absl::Status Concatenated(const std::vector<uint64_t>& lengths, std::vector<std::string>* out) {
    out->resize(lengths.size());
    for (size_t i = 0; i < lengths.size(); ++i) {
      if (lengths[i] > left()) {
        return Fail(
            absl::StrCat("a string of ", static_cast<int64_t>(lengths[i]), " bytes in ", left()));
      }
      (*out)[i].assign(reinterpret_cast<const char*>(data()), lengths[i]);
      at_ += lengths[i];
    }
    return absl::OkStatus();
  }

  // DELTA_BINARY_PACKED: exactly n values.
  absl::Status Delta(int64_t n, uint64_t* out) {
    ASSIGN_OR_RETURN(uint64_t block_size, Varint());
    ASSIGN_OR_RETURN(uint64_t miniblocks, Varint());
    ASSIGN_OR_RETURN(uint64_t total, Varint());
    ASSIGN_OR_RETURN(int64_t first, ZigZag());
    if (block_size == 0 || block_size % 128 != 0 || miniblocks == 0 ||
        block_size % miniblocks != 0 || (block_size / miniblocks) % 32 != 0 ||
        block_size > (1 << 20)) {
      return Fail(absl::StrCat("DELTA_BINARY_PACKED block of ", block_size, " values in ",
                               miniblocks, " miniblocks"));
    }
    if (total != static_cast<uint64_t>(n)) {
      return Fail(absl::StrCat("DELTA_BINARY_PACKED holds ", total, " values, the levels say ", n));
    }
    if (n == 0) return absl::OkStatus();
    const uint64_t per_miniblock = block_size / miniblocks;
    uint64_t last = static_cast<uint64_t>(first);
    out[0] = last;
    int64_t done = 1;
    std::vector<uint8_t> widths(miniblocks);
    while (done < n) {
      ASSIGN_OR_RETURN(int64_t min_delta, ZigZag());
      if (miniblocks > left()) return Fail("truncated DELTA_BINARY_PACKED block");
      std::memcpy(widths.data(), data(), miniblocks);
      at_ += miniblocks;
      for (uint64_t m = 0; m < miniblocks && done < n; ++m) {
        const int width = widths[m];
        if (width > 64) return Fail(absl::StrCat("miniblock bit width ", width));
        const uint64_t bytes = per_miniblock * width / 8;
        if (bytes > left()) return Fail("truncated DELTA_BINARY_PACKED miniblock");
        for (uint64_t i = 0; i < per_miniblock && done < n; ++i) {
          last += static_cast<uint64_t>(min_delta) + UnpackBits(data(), i * width, width);
          out[done++] = last;
        }
        at_ += bytes;
      }
    }
    return absl::OkStatus();
  }

 private:
  const uint8_t* Byte(size_t at) const {
    return reinterpret_cast<const uint8_t*>(padded_.data()) + at;
  }

  size_t size_;  // of the page; padded_ holds 16 zero bytes more
  std::string padded_;
  std::string what_;
  size_t at_ = 0;
};

struct ParquetColumn::Chunk {
  int row_group = 0;
  int64_t codec = 0;
  // The dictionary page, when the chunk has one.
  bool has_dictionary = false;
  int64_t dictionary_offset = 0, dictionary_compressed = 0, dictionary_uncompressed = 0;
  int64_t dictionary_values = 0;
};

struct ParquetColumn::Page {
  int chunk = 0;
  int index_in_chunk = 0;
  bool v2 = false;
  int64_t offset = 0;  // of the page's bytes after its header
  int64_t compressed = 0, uncompressed = 0;
  int64_t levels = 0;  // level entries (values, nulls and empty lists)
  int64_t encoding = 0;
  int64_t v2_definition_bytes = 0, v2_repetition_bytes = 0;
  bool v2_compressed = true;
  int64_t first_value = 0, values = 0;  // its values' place in the stream
};

// A page's (or a dictionary's) values: integers widened to int64, or strings.
struct ParquetColumn::Values {
  std::vector<int64_t> integers;
  std::vector<std::string> texts;
};

struct ParquetColumn::Cache {
  DecodedUnits<Page, Values> pages;
  std::mutex mu;  // of the dictionaries
  std::map<int, std::shared_ptr<const Values>> dictionaries;
};

ParquetColumn::ParquetColumn() : cache_(std::make_unique<Cache>()) {}

ParquetColumn::~ParquetColumn() = default;

absl::StatusOr<std::string> ParquetColumn::ReadBytes(int64_t offset, int64_t size) const {
  return file_->Read(offset, size);
}

absl::StatusOr<std::string> ParquetColumn::Uncompress(const std::string& what, int64_t codec,
                                                      std::string compressed,
                                                      int64_t uncompressed_size) const {
  if (codec == kUncompressed) {
    if (static_cast<int64_t>(compressed.size()) != uncompressed_size) {
      return absl::DataLossError(absl::StrCat(what, ": ", compressed.size(),
                                              " bytes stored uncompressed, the header says ",
                                              uncompressed_size));
    }
    return compressed;
  }
  // No codec here expands bytes 2048-fold on real pages (deflate's ceiling is 1032); a header
  // claiming more is damage, refused before its size is allocated.
  const int64_t ceiling =
      std::max<int64_t>(kMaxUncompressedFloor, 2048 * static_cast<int64_t>(compressed.size()));
  if (uncompressed_size > ceiling) {
    return absl::DataLossError(absl::StrCat(what, ": ", compressed.size(), " bytes claim to hold ",
                                            uncompressed_size, " uncompressed"));
  }
  std::string out(uncompressed_size, '\0');
  bool ok = false;
  switch (codec) {
    case kSnappy: {
      size_t length = 0;
      ok = snappy::GetUncompressedLength(compressed.data(), compressed.size(), &length) &&
           static_cast<int64_t>(length) == uncompressed_size &&
           snappy::RawUncompress(compressed.data(), compressed.size(), out.data());
      break;
    }
    case kGzip: {
      z_stream stream{};
      if (inflateInit2(&stream, 15 + 32) != Z_OK) break;  // gzip or zlib headers
      stream.next_in = reinterpret_cast<Bytef*>(compressed.data());
      stream.avail_in = static_cast<uInt>(compressed.size());
      stream.next_out = reinterpret_cast<Bytef*>(out.data());
      stream.avail_out = static_cast<uInt>(out.size());
      ok = inflate(&stream, Z_FINISH) == Z_STREAM_END &&
           static_cast<int64_t>(stream.total_out) == uncompressed_size;
      inflateEnd(&stream);
      break;
    }
    case kZstd: {
      const size_t n =
          ZSTD_decompress(out.data(), out.size(), compressed.data(), compressed.size());
      ok = !ZSTD_isError(n) && static_cast<int64_t>(n) == uncompressed_size;
      break;
    }
    case kLz4Raw: {
      const int n =
          LZ4_decompress_safe(compressed.data(), out.data(), static_cast<int>(compressed.size()),
                              static_cast<int>(out.size()));
      ok = n == uncompressed_size;
      break;
    }
    default:
      return absl::InvalidArgumentError(absl::StrCat(what, ": ", CodecName(codec), " pages"));
  }
  if (!ok) {
    return absl::DataLossError(absl::StrCat(what, ": does not decompress (", CodecName(codec),
                                            ") to the ", uncompressed_size,
                                            " bytes its header says"));
  }
  return out;
}

std::string ParquetColumn::PageName(const Page& page) const {
  return absl::StrCat(path_, ": column ", column_, ", row group ", chunks_[page.chunk].row_group,
                      ", page ", page.index_in_chunk);
}

absl::StatusOr<std::shared_ptr<const ParquetColumn::Values>> ParquetColumn::Dictionary(
    int chunk_index) const {
  {
    std::lock_guard<std::mutex> lock(cache_->mu);
    auto it = cache_->dictionaries.find(chunk_index);
    if (it != cache_->dictionaries.end()) return it->second;
  }
  const Chunk& chunk = chunks_[chunk_index];
  const std::string what = absl::StrCat(path_, ": column ", column_, ", row group ",
                                        chunk.row_group, ", dictionary page");
  if (!chunk.has_dictionary) {
    return absl::DataLossError(absl::StrCat(what, ": dictionary-encoded pages without one"));
  }
  ASSIGN_OR_RETURN(std::string stored,
                   ReadBytes(chunk.dictionary_offset, chunk.dictionary_compressed));
  ASSIGN_OR_RETURN(std::string bytes,
                   Uncompress(what, chunk.codec, std::move(stored), chunk.dictionary_uncompressed));
  // Every entry takes at least one byte (a string's length prefix four), so a count above the
  // page's bytes is corrupt, and checking it first bounds the allocation.
  if (chunk.dictionary_values < 0 ||
      static_cast<uint64_t>(chunk.dictionary_values) > bytes.size()) {
    return absl::DataLossError(
        absl::StrCat(what, ": ", chunk.dictionary_values, " values in ", bytes.size(), " bytes"));
  }
  ParquetPageReader reader(std::move(bytes), what);
  auto values = std::make_shared<Values>();
  RETURN_IF_ERROR(DecodeValues(reader, kPlain, chunk.dictionary_values, -1, values.get()));
  std::lock_guard<std::mutex> lock(cache_->mu);
  cache_->dictionaries[chunk_index] = values;
  return std::shared_ptr<const Values>(values);
}

absl::Status ParquetColumn::DecodePage(const Page& page, Values* values, int64_t* count) const {
  const std::string what = PageName(page);
  ASSIGN_OR_RETURN(std::string stored, ReadBytes(page.offset, page.compressed));
  std::string body;
  size_t levels_end = 0;  // v2: where the (uncompressed) levels end and the values begin
  if (page.v2) {
    const int64_t level_bytes = page.v2_definition_bytes + page.v2_repetition_bytes;
    if (page.v2_definition_bytes < 0 || page.v2_repetition_bytes < 0 ||
        level_bytes > page.compressed || level_bytes > page.uncompressed) {
      return absl::DataLossError(absl::StrCat(what, ": level sections longer than the page"));
    }
    std::string values_section = stored.substr(level_bytes);
    stored.resize(level_bytes);
    if (page.v2_compressed) {
      ASSIGN_OR_RETURN(values_section,
                       Uncompress(what, chunks_[page.chunk].codec, std::move(values_section),
                                  page.uncompressed - level_bytes));
    }
    body = std::move(stored) + values_section;
    levels_end = level_bytes;
  } else {
    ASSIGN_OR_RETURN(
        body, Uncompress(what, chunks_[page.chunk].codec, std::move(stored), page.uncompressed));
  }
  ParquetPageReader reader(std::move(body), what);
  std::vector<uint32_t> definition;
  if (page.v2) {
    RETURN_IF_ERROR(reader.Skip(page.v2_repetition_bytes));
    if (max_definition_ > 0) {
      definition.resize(page.levels);
      RETURN_IF_ERROR(
          reader.Hybrid(BitWidth(max_definition_), page.levels, levels_end, definition.data()));
    }
    RETURN_IF_ERROR(reader.Skip(levels_end - reader.position()));
  } else {
    if (max_repetition_ > 0) {
      ASSIGN_OR_RETURN(uint32_t bytes, reader.Fixed32());
      RETURN_IF_ERROR(reader.Skip(bytes));
    }
    if (max_definition_ > 0) {
      ASSIGN_OR_RETURN(uint32_t bytes, reader.Fixed32());
      if (bytes > reader.left()) return reader.Fail("definition levels past the page's end");
      const size_t end = reader.position() + bytes;
      definition.resize(page.levels);
      RETURN_IF_ERROR(
          reader.Hybrid(BitWidth(max_definition_), page.levels, end, definition.data()));
      RETURN_IF_ERROR(reader.Skip(end - reader.position()));
    }
  }
  int64_t n = page.levels;
  if (max_definition_ > 0) {
    n = 0;
    for (int64_t i = 0; i < page.levels; ++i) {
      const uint32_t d = definition[i];
      if (d == static_cast<uint32_t>(max_definition_)) {
        ++n;
      } else if (d > static_cast<uint32_t>(max_definition_)) {
        return reader.Fail(
            absl::StrCat("definition level ", d, " above the column's ", max_definition_));
      } else if (d >= static_cast<uint32_t>(list_definition_)) {  // never for text
        return absl::InvalidArgumentError(absl::StrCat(
            what, ": a null id (entry ", i, " of the page); token ids must not be null"));
      }
    }
  }
  *count = n;
  if (values == nullptr) return absl::OkStatus();

  return DecodeValues(reader, page.encoding, n, page.chunk, values);
}

absl::Status ParquetColumn::DecodeValues(ParquetPageReader& reader, int64_t encoding, int64_t n,
                                         int chunk, Values* out) const {
  const bool dictionary = encoding == kPlainDictionary || encoding == kRleDictionary;
  if (dictionary && chunk >= 0) {
    ASSIGN_OR_RETURN(std::shared_ptr<const Values> entries, Dictionary(chunk));
    if (reader.left() < 1) return reader.Fail("no dictionary index bit width");
    const int bits = *reader.data();
    RETURN_IF_ERROR(reader.Skip(1));
    std::vector<uint32_t> indices(n);
    RETURN_IF_ERROR(reader.Hybrid(bits, n, reader.position() + reader.left(), indices.data()));
    const size_t size = kind_ == Kind::kText ? entries->texts.size() : entries->integers.size();
    for (int64_t i = 0; i < n; ++i) {
      if (indices[i] >= size) {
        return reader.Fail(absl::StrCat("dictionary index ", indices[i], " of ", size, " entries"));
      }
    }
    if (kind_ == Kind::kText) {
      out->texts.resize(n);
      for (int64_t i = 0; i < n; ++i) out->texts[i] = entries->texts[indices[i]];
    } else {
      out->integers.resize(n);
      for (int64_t i = 0; i < n; ++i) out->integers[i] = entries->integers[indices[i]];
    }
    return absl::OkStatus();  // dictionary entries are already widened
  }
  if (kind_ == Kind::kText) {
    switch (encoding) {
      case kPlain:
        return reader.ByteArrays(n, &out->texts);
      case kDeltaLengthByteArray: {
        std::vector<uint64_t> lengths(n);
        RETURN_IF_ERROR(reader.Delta(n, lengths.data()));
        return reader.Concatenated(lengths, &out->texts);
      }
      case kDeltaByteArray: {  // each string: a prefix of the one before, then its own suffix
        std::vector<uint64_t> prefixes(n), lengths(n);
        RETURN_IF_ERROR(reader.Delta(n, prefixes.data()));
        RETURN_IF_ERROR(reader.Delta(n, lengths.data()));
        RETURN_IF_ERROR(reader.Concatenated(lengths, &out->texts));
        for (int64_t i = 0; i < n; ++i) {
          const size_t previous = i == 0 ? 0 : out->texts[i - 1].size();
          if (prefixes[i] > previous) {
            return reader.Fail(absl::StrCat("a prefix of ", static_cast<int64_t>(prefixes[i]),
                                            " bytes of a string of ", previous));
          }
          if (prefixes[i] > 0) {
            out->texts[i].insert(0, out->texts[i - 1], 0, prefixes[i]);
          }
        }
        return absl::OkStatus();
      }
      default:
        return absl::InvalidArgumentError(absl::StrCat(
            reader.what(), ": encoding ", encoding,
            " (PLAIN, dictionary, DELTA_LENGTH_BYTE_ARRAY and DELTA_BYTE_ARRAY text is read)"));
    }
  }
  std::vector<int64_t>& values = out->integers;
  values.resize(n);
  const int width = physical_type_ == kInt32 ? 4 : 8;
  switch (encoding) {
    case kPlain:
    case kByteStreamSplit: {
      if (static_cast<uint64_t>(n) * width > reader.left()) {
        return reader.Fail(absl::StrCat(n, " values in ", reader.left(), " bytes"));
      }
      const uint8_t* p = reader.data();
      for (int64_t i = 0; i < n; ++i) {
        uint64_t raw = 0;
        if (encoding == kPlain) {
          raw = width == 4 ? (Load64(p + 4 * i) & 0xffffffffu) : Load64(p + 8 * i);
        } else {  // byte k of value i at k * n + i
          for (int k = width - 1; k >= 0; --k) raw = (raw << 8) | p[k * n + i];
        }
        values[i] = static_cast<int64_t>(raw);
      }
      RETURN_IF_ERROR(reader.Skip(n * width));
      break;
    }
    case kDeltaBinaryPacked: {
      std::vector<uint64_t> raw(n);
      RETURN_IF_ERROR(reader.Delta(n, raw.data()));
      for (int64_t i = 0; i < n; ++i) {
        values[i] = static_cast<int64_t>(width == 4 ? raw[i] & 0xffffffffu : raw[i]);
      }
      break;
    }
    default:
      return absl::InvalidArgumentError(
          absl::StrCat(reader.what(), ": encoding ", encoding,
                       " (PLAIN, dictionary, DELTA_BINARY_PACKED and BYTE_STREAM_SPLIT "
                       "integers are read)"));
  }
  if (physical_type_ == kInt32 && !unsigned_) {
    for (int64_t& v : values) v = static_cast<int32_t>(static_cast<uint32_t>(v));
  }
  return absl::OkStatus();
}

absl::Status ParquetColumn::IndexChunk(int chunk_index, int64_t start, int64_t size,
                                       int64_t level_values, bool without_nulls) {
  Chunk& chunk = chunks_[chunk_index];
  const std::string what =
      absl::StrCat(path_, ": column ", column_, ", row group ", chunk.row_group);
  const int64_t end = start + size;
  int64_t at = start, levels = 0;
  int index_in_chunk = 0;
  while (at < end) {
    // Page headers are small; read a window and grow it if the header runs past it.
    int64_t window = std::min<int64_t>(end - at, 4096);
    ThriftValue header;
    size_t header_bytes = 0;
    while (true) {
      ASSIGN_OR_RETURN(std::string bytes, ReadBytes(at, window));
      absl::StatusOr<ThriftValue> parsed = ParseThriftStruct(bytes, &header_bytes);
      if (parsed.ok()) {
        header = *std::move(parsed);
        break;
      }
      if (!absl::IsOutOfRange(parsed.status()) || window == end - at) {
        return absl::InvalidArgumentError(
            absl::StrCat(what, ": page header at offset ", at, ": ", parsed.status().message()));
      }
      window = std::min<int64_t>(end - at, window * 4);
    }
    const int64_t type = header.IntField(1, -1);
    const int64_t uncompressed = header.IntField(2, -1);
    const int64_t compressed = header.IntField(3, -1);
    const int64_t data = at + static_cast<int64_t>(header_bytes);
    if (uncompressed < 0 || compressed < 0 || compressed > end - data) {
      return absl::InvalidArgumentError(absl::StrCat(
          what, ": page at offset ", at, " of ", compressed, " bytes runs past its column chunk"));
    }
    if (type == kDictionaryPage) {
      const ThriftValue* d = header.Field(7);
      const int64_t encoding = d ? d->IntField(2, -1) : -1;
      if (encoding != kPlain && encoding != kPlainDictionary) {
        return absl::InvalidArgumentError(
            absl::StrCat(what, ": dictionary page encoding ", encoding));
      }
      chunk.has_dictionary = true;
      chunk.dictionary_offset = data;
      chunk.dictionary_compressed = compressed;
      chunk.dictionary_uncompressed = uncompressed;
      chunk.dictionary_values = d->IntField(1, -1);
    } else if (type == kDataPage || type == kDataPageV2) {
      Page page;
      page.chunk = chunk_index;
      page.index_in_chunk = index_in_chunk++;
      page.v2 = type == kDataPageV2;
      page.offset = data;
      page.compressed = compressed;
      page.uncompressed = uncompressed;
      const ThriftValue* h = header.Field(page.v2 ? 8 : 5);
      if (h == nullptr) {
        return absl::InvalidArgumentError(
            absl::StrCat(what, ": data page at offset ", at, " without its header"));
      }
      page.levels = h->IntField(1, -1);
      page.encoding = h->IntField(page.v2 ? 4 : 2, -1);
      if (page.levels < 0 || page.levels > kMaxPageValues) {
        return absl::InvalidArgumentError(absl::StrCat(
            what, ": page of ", page.levels, " values (at most ", kMaxPageValues, " are read)"));
      }
      if (page.v2) {
        const int64_t nulls = h->IntField(2, -1);
        page.v2_definition_bytes = h->IntField(5, -1);
        page.v2_repetition_bytes = h->IntField(6, -1);
        page.v2_compressed = h->IntField(7, 1) != 0;
        if (nulls < 0 || nulls > page.levels) {
          return absl::InvalidArgumentError(
              absl::StrCat(what, ": page of ", page.levels, " values with ", nulls, " nulls"));
        }
        page.values = page.levels - nulls;
      } else if (max_definition_ == 0 || without_nulls) {
        page.values = page.levels;
      } else {
        // A v1 header does not say how many of its entries are nulls or empty lists.
        RETURN_IF_ERROR(DecodePage(page, nullptr, &page.values));
      }
      page.first_value = num_values_;
      num_values_ += page.values;
      levels += page.levels;
      pages_.push_back(page);
    } else if (type != kIndexPage) {
      return absl::InvalidArgumentError(absl::StrCat(what, ": page type ", type));
    }
    at = data + compressed;
  }
  if (levels != level_values) {
    return absl::DataLossError(absl::StrCat(what, ": its pages hold ", levels,
                                            " values, its metadata says ", level_values));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<ParquetColumn>> ParquetColumn::Open(const std::string& path,
                                                                   const std::string& column,
                                                                   Kind kind) {
  std::unique_ptr<ParquetColumn> file(new ParquetColumn());
  file->path_ = path;
  file->kind_ = kind;
  ASSIGN_OR_RETURN(file->file_, RandomAccessFile::Open(path));
  const int64_t size = file->file_->size();
  auto bad = [&](const std::string& why) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": ", why));
  };
  if (size < 12) return bad("not a Parquet file (too short)");
  ASSIGN_OR_RETURN(std::string head, file->ReadBytes(0, 4));
  ASSIGN_OR_RETURN(std::string tail, file->ReadBytes(size - 8, 8));
  if (tail.substr(4) == "PARE") return bad("encrypted Parquet files are not read");
  if (head != "PAR1" || tail.substr(4) != "PAR1") return bad("not a Parquet file (no PAR1 magic)");
  const int64_t footer_size = Load32(reinterpret_cast<const uint8_t*>(tail.data()));
  if (footer_size > size - 12) {
    return bad(absl::StrCat("footer of ", footer_size, " bytes in a file of ", size));
  }
  ASSIGN_OR_RETURN(std::string footer, file->ReadBytes(size - 8 - footer_size, footer_size));
  size_t consumed = 0;
  absl::StatusOr<ThriftValue> parsed = ParseThriftStruct(footer, &consumed);
  if (!parsed.ok()) return bad(absl::StrCat("corrupt footer: ", parsed.status().message()));
  const ThriftValue& metadata = *parsed;
  const ThriftValue* schema = metadata.Field(2);
  const ThriftValue* row_groups = metadata.Field(4);
  if (schema == nullptr || schema->kind != ThriftValue::Kind::kList || schema->elements.empty() ||
      row_groups == nullptr || row_groups->kind != ThriftValue::Kind::kList) {
    return bad("footer without a schema or row groups");
  }
  file->num_rows_ = metadata.IntField(3, 0);
  if (const ThriftValue* pairs = metadata.Field(5);
      pairs && pairs->kind == ThriftValue::Kind::kList) {
    for (const ThriftValue& pair : pairs->elements) {
      const ThriftValue* key = pair.Field(1);
      const ThriftValue* value = pair.Field(2);
      if (key != nullptr) file->metadata_.emplace_back(key->binary, value ? value->binary : "");
    }
  }

  // The schema is a depth-first list of elements; the root's children are the columns, and
  // each leaf is one column chunk per row group, in this order.
  struct Leaf {
    std::string top;  // the top-level column it belongs to
    const ThriftValue* element = nullptr;
    int definition = 0, repetition = 0, list_definition = 0;
  };
  std::vector<Leaf> leaves;
  std::vector<std::string> tops;
  size_t next = 1;
  // Walks the subtree at schema->elements[next]; returns false on a malformed schema.
  std::function<bool(const std::string&, int, int, int, int)> walk =
      [&](const std::string& top, int definition, int repetition, int list_definition,
          int depth) -> bool {
    if (next >= schema->elements.size() || depth > 64) return false;
    const ThriftValue& element = schema->elements[next++];
    const int64_t kind = element.IntField(3, kRequired);
    if (kind == kOptional) ++definition;
    if (kind == kRepeated) {
      ++definition;
      ++repetition;
      list_definition = definition;
    }
    const ThriftValue* name = element.Field(4);
    const std::string own = name ? name->binary : "";
    const std::string& column_name = top.empty() ? own : top;
    if (top.empty()) tops.push_back(own);
    const int64_t children = element.IntField(5, 0);
    if (children < 0 || children > static_cast<int64_t>(schema->elements.size())) return false;
    if (children == 0) {
      leaves.push_back({column_name, &element, definition, repetition, list_definition});
      return true;
    }
    for (int64_t c = 0; c < children; ++c) {
      if (!walk(column_name, definition, repetition, list_definition, depth + 1)) return false;
    }
    return true;
  };
  const int64_t columns = schema->elements[0].IntField(5, 0);
  for (int64_t c = 0; c < columns; ++c) {
    if (!walk("", 0, 0, 0, 0)) return bad("malformed schema");
  }
  if (next != schema->elements.size()) return bad("malformed schema");

  auto is_integer = [](const Leaf& leaf) {
    const int64_t type = leaf.element->IntField(1, -1);
    return type == kInt32 || type == kInt64;
  };
  auto leaves_of = [&](const std::string& name) {
    std::vector<int> found;
    for (size_t i = 0; i < leaves.size(); ++i) {
      if (leaves[i].top == name) found.push_back(static_cast<int>(i));
    }
    return found;
  };
  std::string chosen = column;
  if (chosen.empty() && kind == Kind::kText) chosen = "text";
  if (chosen.empty()) {
    for (const char* usual : {"input_ids", "tokens"}) {
      if (!leaves_of(usual).empty()) {
        chosen = usual;
        break;
      }
    }
  }
  if (chosen.empty() && kind == Kind::kFloats) return bad("name the FLOAT column to read");
  if (chosen.empty()) {
    std::vector<std::string> integer_columns;
    for (const std::string& top : tops) {
      std::vector<int> l = leaves_of(top);
      if (l.size() == 1 && is_integer(leaves[l[0]])) integer_columns.push_back(top);
    }
    if (integer_columns.size() != 1) {
      return bad(absl::StrCat("no input_ids or tokens column, and ", integer_columns.size(),
                              " integer columns to choose from (its columns: ",
                              absl::StrJoin(tops, ", "), "); name the column"));
    }
    chosen = integer_columns[0];
  }
  std::vector<int> chosen_leaves = leaves_of(chosen);
  if (chosen_leaves.empty()) {
    return bad(
        absl::StrCat("no column ", chosen, " (its columns: ", absl::StrJoin(tops, ", "), ")"));
  }
  if (chosen_leaves.size() != 1) {
    return bad(absl::StrCat("column ", chosen, " is a struct or map of ", chosen_leaves.size(),
                            " fields, not a list of token ids"));
  }
  const int leaf_index = chosen_leaves[0];
  const Leaf& leaf = leaves[leaf_index];
  file->column_ = chosen;
  const int64_t type = leaf.element->IntField(1, -1);
  if (kind == Kind::kFloats) {
    if (type != kFloat) {
      return bad(absl::StrCat("column ", chosen, " holds ", TypeName(type), ", not FLOAT"));
    }
    if (leaf.repetition > 1) return bad(absl::StrCat("column ", chosen, " is a list of lists"));
  } else if (kind == Kind::kText) {
    if (type != kByteArray) {
      return bad(absl::StrCat("column ", chosen, " holds ", TypeName(type), ", not text"));
    }
    if (leaf.repetition > 0) {
      return bad(absl::StrCat("column ", chosen, " is a list of strings; one text a row is read"));
    }
  } else {
    if (type != kInt32 && type != kInt64) {
      return bad(absl::StrCat(
          "column ", chosen, " holds ", TypeName(type),
          type == kByteArray ? " (text? `latentctl tokenize` turns text into ids)" : "",
          ", not integer token ids"));
    }
    if (leaf.repetition > 1) {
      return bad(absl::StrCat("column ", chosen, " is a list of lists; token ids are a list"));
    }
  }
  // Unsigned annotations: converted_type UINT_8..UINT_64, or logicalType INTEGER unsigned.
  const int64_t converted = leaf.element->IntField(6, -1);
  bool is_unsigned = converted >= 11 && converted <= 14;
  if ((converted >= 5 && converted <= 10) || converted == 22) {
    return bad(absl::StrCat("column ", chosen, " holds decimals, dates or times, not token ids"));
  }
  if (const ThriftValue* logical = leaf.element->Field(10)) {
    if (const ThriftValue* integer = logical->Field(10)) {
      is_unsigned = integer->IntField(2, 1) == 0;
    }
  }
  // A float is read as its 32 bits, by the integers' machinery, and turned back by ReadFloats.
  file->physical_type_ = kind == Kind::kFloats ? kInt32 : static_cast<int>(type);
  file->unsigned_ = kind == Kind::kFloats || is_unsigned;
  file->max_definition_ = leaf.definition;
  file->max_repetition_ = leaf.repetition;
  // A null text is a row without a document; a null id has no such reading.
  file->list_definition_ = kind == Kind::kText ? leaf.definition : leaf.list_definition;

  for (size_t g = 0; g < row_groups->elements.size(); ++g) {
    const ThriftValue& group = row_groups->elements[g];
    const ThriftValue* group_columns = group.Field(1);
    if (group_columns == nullptr || group_columns->kind != ThriftValue::Kind::kList ||
        group_columns->elements.size() != leaves.size()) {
      return bad(
          absl::StrCat("row group ", g, " does not have the schema's ", leaves.size(), " columns"));
    }
    const ThriftValue& chunk = group_columns->elements[leaf_index];
    if (const ThriftValue* external = chunk.Field(1); external && !external->binary.empty()) {
      return bad(absl::StrCat("row group ", g, " keeps column ", chosen, " in another file (",
                              external->binary, ")"));
    }
    const ThriftValue* meta = chunk.Field(3);
    if (meta == nullptr)
      return bad(absl::StrCat("row group ", g, ": column chunk without metadata"));
    const int64_t codec = meta->IntField(4, -1);
    if (codec != kUncompressed && codec != kSnappy && codec != kGzip && codec != kZstd &&
        codec != kLz4Raw) {
      return bad(absl::StrCat("column ", chosen, " is compressed with ", CodecName(codec),
                              " (UNCOMPRESSED, SNAPPY, GZIP, ZSTD and LZ4_RAW are read)"));
    }
    const int64_t level_values = meta->IntField(5, -1);
    const int64_t compressed = meta->IntField(7, -1);
    const int64_t data_offset = meta->IntField(9, -1);
    const int64_t dictionary_offset = meta->IntField(11, -1);
    // Some writers put 0 where a chunk has no dictionary page.
    const int64_t start =
        dictionary_offset > 0 && dictionary_offset < data_offset ? dictionary_offset : data_offset;
    if (level_values < 0 || compressed < 0 || start < 4 ||
        compressed > size - 8 - footer_size - start) {
      return bad(absl::StrCat("row group ", g, ": column chunk of ", compressed,
                              " bytes at offset ", start, " outside the file"));
    }
    Chunk c;
    c.row_group = static_cast<int>(g);
    c.codec = codec;
    file->chunks_.push_back(c);
    // Statistics saying the chunk has no nulls (nor empty lists) spare decoding its levels here.
    const ThriftValue* statistics = meta->Field(12);
    const bool without_nulls = statistics != nullptr && statistics->IntField(3, -1) == 0;
    RETURN_IF_ERROR(file->IndexChunk(static_cast<int>(file->chunks_.size()) - 1, start, compressed,
                                     level_values, without_nulls));
  }
  return file;
}

absl::Status ParquetColumn::ForEachPage(
    int64_t first, int64_t count,
    const std::function<void(const Values&, int64_t, int64_t)>& take) const {
  return cache_->pages.ForEach(
      pages_, num_values_, path_, first, count,
      [this](const Page& page, Values* decoded) {
        int64_t n = 0;
        RETURN_IF_ERROR(DecodePage(page, decoded, &n));
        if (n != page.values) {
          return absl::DataLossError(absl::StrCat(PageName(page), ": ", n, " values, ", page.values,
                                                  " when the file was opened"));
        }
        return absl::OkStatus();
      },
      take);
}

absl::Status ParquetColumn::Read(int64_t first, int64_t count, int64_t* out) const {
  if (kind_ != Kind::kIntegers) {
    return absl::FailedPreconditionError(
        absl::StrCat(path_, ": column ", column_, " is not integers"));
  }
  return ForEachPage(first, count, [&out](const Values& values, int64_t offset, int64_t n) {
    std::copy(values.integers.begin() + offset, values.integers.begin() + offset + n, out);
    out += n;
  });
}

absl::Status ParquetColumn::ReadFloats(int64_t first, int64_t count, float* out) const {
  if (kind_ != Kind::kFloats) {
    return absl::FailedPreconditionError(
        absl::StrCat(path_, ": column ", column_, " is not FLOAT"));
  }
  return ForEachPage(first, count, [&out](const Values& values, int64_t offset, int64_t n) {
    for (int64_t i = 0; i < n; ++i) {
      const uint32_t bits = static_cast<uint32_t>(values.integers[offset + i]);
      std::memcpy(out++, &bits, 4);
    }
  });
}

absl::Status ParquetColumn::ReadText(int64_t first, int64_t count,
                                     std::vector<std::string>* out) const {
  if (kind_ != Kind::kText) {
    return absl::FailedPreconditionError(absl::StrCat(path_, ": column ", column_, " is not text"));
  }
  out->clear();
  return ForEachPage(first, count, [out](const Values& values, int64_t offset, int64_t n) {
    out->insert(out->end(), values.texts.begin() + offset, values.texts.begin() + offset + n);
  });
}

}  // namespace latentd
