// Test-only helpers of the columnar readers' tests (common/parquet_column_test,
// common/arrow_column_test, engine/token_source_test): the ids a fixture holds, and the check
// that a reader gives them back whole and in any range.
#ifndef LATENTD_COMMON_COLUMN_TESTING_H_
#define LATENTD_COMMON_COLUMN_TESTING_H_

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "common/mutate.h"
#include "common/read_file.h"
#include "gtest/gtest.h"

namespace latentd::column_testing {

// A file of common/testdata/<dir>/ in the test's runfiles.
inline std::string Fixture(const std::string& dir, const std::string& name) {
  return std::string(getenv("TEST_SRCDIR")) + "/latentd/common/testdata/" + dir + "/" + name;
}

// The ids of a raw little-endian uint32 file (a fixture's NAME.u32).
inline std::vector<int64_t> ReadU32(const std::string& path) {
  absl::StatusOr<std::string> raw = ReadFileToString(path);
  EXPECT_TRUE(raw.ok()) << raw.status();
  if (!raw.ok()) return {};
  std::vector<int64_t> ids(raw->size() / 4);
  const auto* p = reinterpret_cast<const unsigned char*>(raw->data());
  for (size_t i = 0; i < ids.size(); ++i, p += 4) {
    ids[i] = p[0] | p[1] << 8 | p[2] << 16 | static_cast<int64_t>(p[3]) << 24;
  }
  return ids;
}

// `reader` (anything with num_values() and Read(first, count, int64_t*)) gives `expected` whole,
// in 200 ranges drawn anywhere (across pages, row groups and batches, in any order), and
// OUT_OF_RANGE past its end.
template <typename Reader>
void ExpectReadsMatch(const Reader& reader, const std::vector<int64_t>& expected) {
  ASSERT_EQ(reader.num_values(), static_cast<int64_t>(expected.size()));
  ASSERT_FALSE(expected.empty());
  std::vector<int64_t> all(expected.size(), -1);
  ASSERT_TRUE(reader.Read(0, all.size(), all.data()).ok());
  EXPECT_EQ(all, expected);
  std::mt19937 rng(1);
  for (int i = 0; i < 200; ++i) {
    const int64_t first = rng() % expected.size();
    const int64_t count = rng() % (expected.size() - first + 1);
    std::vector<int64_t> part(count, -1);
    ASSERT_TRUE(reader.Read(first, count, part.data()).ok());
    ASSERT_TRUE(std::equal(part.begin(), part.end(), expected.begin() + first))
        << "[" << first << ", " << first + count << ")";
  }
  EXPECT_TRUE(absl::IsOutOfRange(reader.Read(expected.size() - 1, 2, all.data())));
  EXPECT_TRUE(absl::IsOutOfRange(reader.Read(-1, 1, all.data())));
}

// The metadata a damaged file's reader must survive: the footer (Parquet) or the schema and
// first batch's metadata at the front (Arrow).
enum class Metadata { kAtTheEnd, kAtTheFront };

// Writes `valid` damaged `trials` ways to `path` (half of them within the `metadata_bytes` where
// the lengths and offsets are) and opens and reads each with Reader::Open(path, "", kind):
// every outcome must be a status (or, where the damage missed what is read, values), never a
// crash. Returns how many were refused.
template <typename Reader>
int DamagedFilesRefused(const std::string& valid, const std::string& path, int trials,
                        Metadata metadata, size_t metadata_bytes, typename Reader::Kind kind,
                        std::mt19937* rng) {
  int refused = 0;
  for (int i = 0; i < trials; ++i) {
    std::string bytes = valid;
    const size_t span = std::min(metadata_bytes, bytes.size());
    if (i % 2 == 1) {
      bytes = MutateBytes(bytes, rng);
    } else if (metadata == Metadata::kAtTheEnd) {
      bytes = bytes.substr(0, bytes.size() - span) +
              MutateBytes(bytes.substr(bytes.size() - span), rng);
    } else {
      bytes = MutateBytes(bytes.substr(0, span), rng) + bytes.substr(span);
    }
    std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
    auto column = Reader::Open(path, "", kind);
    if (!column.ok()) {
      ++refused;
      continue;
    }
    std::vector<int64_t> ids(kind == Reader::Kind::kText ? 0 : (*column)->num_values());
    std::vector<std::string> texts;
    const absl::Status read = kind == Reader::Kind::kText
                                  ? (*column)->ReadText(0, (*column)->num_values(), &texts)
                                  : (*column)->Read(0, ids.size(), ids.data());
    if (!read.ok()) ++refused;
  }
  return refused;
}

}  // namespace latentd::column_testing

#endif  // LATENTD_COMMON_COLUMN_TESTING_H_
