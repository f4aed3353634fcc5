// NpzWriter output read back by a small ZIP reader written from the format's definition (APPNOTE:
// central directory, ZIP64 records and extra fields, local headers), classic and ZIP64 alike;
// tests/python/test_export.py reads the same files with numpy.
#include "storage/npz_writer.h"

#include <zlib.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include "common/test_dir.h"
#include "gtest/gtest.h"

namespace latentd::storage {
namespace {

uint64_t Le(const std::string& b, size_t at, int bytes) {
  uint64_t v = 0;
  for (int i = bytes - 1; i >= 0; --i) v = (v << 8) | static_cast<uint8_t>(b.at(at + i));
  return v;
}

struct ReadMember {
  std::string header;  // the .npy dictionary
  std::string data;    // after the .npy header
  bool zip64 = false;  // the central directory used ZIP64 fields for it
};

// name -> member, checking signatures, local/central agreement and every CRC.
std::map<std::string, ReadMember> ReadZip(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string b = ss.str();
  std::map<std::string, ReadMember> out;
  const size_t eocd = b.size() - 22;
  EXPECT_EQ(Le(b, eocd, 4), 0x06054b50u);
  uint64_t entries = Le(b, eocd + 10, 2);
  uint64_t central = Le(b, eocd + 16, 4);
  if (central == 0xffffffffu) {
    EXPECT_EQ(Le(b, eocd - 20, 4), 0x07064b50u);  // the ZIP64 locator
    const size_t record = Le(b, eocd - 20 + 8, 8);
    EXPECT_EQ(Le(b, record, 4), 0x06064b50u);
    entries = Le(b, record + 32, 8);
    central = Le(b, record + 48, 8);
  }
  size_t at = central;
  for (uint64_t e = 0; e < entries; ++e) {
    EXPECT_EQ(Le(b, at, 4), 0x02014b50u);
    const uint32_t crc = Le(b, at + 16, 4);
    uint64_t size = Le(b, at + 24, 4);
    const size_t name_len = Le(b, at + 28, 2), extra_len = Le(b, at + 30, 2);
    uint64_t offset = Le(b, at + 42, 4);
    const std::string name = b.substr(at + 46, name_len);
    ReadMember m;
    size_t x = at + 46 + name_len;
    const size_t extra_end = x + extra_len;
    while (x < extra_end) {
      const uint64_t id = Le(b, x, 2), len = Le(b, x + 2, 2);
      if (id == 1) {
        m.zip64 = true;
        size_t f = x + 4;
        if (size == 0xffffffffu) {
          size = Le(b, f, 8);
          EXPECT_EQ(Le(b, f + 8, 8), size);  // compressed = uncompressed (stored)
          f += 16;
        }
        if (offset == 0xffffffffu) offset = Le(b, f, 8);
      }
      x += 4 + len;
    }
    at = extra_end;
    // The local header names the same member; its data follows its extra field.
    EXPECT_EQ(Le(b, offset, 4), 0x04034b50u) << name;
    EXPECT_EQ(Le(b, offset + 14, 4), crc) << name;
    const size_t local_name = Le(b, offset + 26, 2), local_extra = Le(b, offset + 28, 2);
    EXPECT_EQ(b.substr(offset + 30, local_name), name);
    const size_t start = offset + 30 + local_name + local_extra;
    const std::string bytes = b.substr(start, size);
    EXPECT_EQ(crc32(0, reinterpret_cast<const Bytef*>(bytes.data()), bytes.size()), crc) << name;
    EXPECT_EQ(bytes.substr(0, 6), "\x93NUMPY") << name;
    const size_t header_len = Le(bytes, 8, 2);
    EXPECT_EQ((10 + header_len) % 64, 0u) << name;
    m.header = bytes.substr(10, header_len);
    m.data = bytes.substr(10 + header_len);
    out[name] = m;
  }
  return out;
}

template <typename T>
std::string Bytes(const std::vector<T>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(T));
}

class NpzWriterTest : public ::testing::TestWithParam<uint64_t> {};

TEST_P(NpzWriterTest, ArraysWrittenInPiecesReadBackWhole) {
  const std::string path = FreshTestDir("npz_writer") + "/out.npz";
  NpzWriterOptions options;
  options.zip64_from = GetParam();
  auto writer = NpzWriter::Create(path, options);
  ASSERT_TRUE(writer.ok()) << writer.status();
  NpzWriter& w = **writer;
  w.AddWhole("row_start", "<i8", {}, Bytes(std::vector<int64_t>{42}));
  auto first = w.AddStreamed("indices", "<i4", 4);
  auto matrix = w.AddStreamed("matrix", "<f4", 4, {3});
  auto empty = w.AddStreamed("empty", "<i8", 8);
  ASSERT_TRUE(first.ok() && matrix.ok() && empty.ok());
  std::vector<int32_t> indices;
  std::vector<float> values;
  for (int piece = 0; piece < 5; ++piece) {
    std::vector<int32_t> p(piece * 7);
    for (size_t i = 0; i < p.size(); ++i) p[i] = static_cast<int32_t>(indices.size() + i) * 3;
    ASSERT_TRUE(w.Append(*first, p.data(), static_cast<int64_t>(p.size())).ok());
    indices.insert(indices.end(), p.begin(), p.end());
    std::vector<float> rows(3 * piece);
    for (size_t i = 0; i < rows.size(); ++i) rows[i] = static_cast<float>(values.size() + i) / 4;
    ASSERT_TRUE(w.Append(*matrix, rows.data(), piece).ok());
    values.insert(values.end(), rows.begin(), rows.end());
  }
  EXPECT_EQ(w.AddStreamed("late", "<i4", 4).status().code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(w.Finish().ok());

  auto members = ReadZip(path);
  ASSERT_EQ(members.size(), 4u);
  EXPECT_EQ(members["indices.npy"].data, Bytes(indices));
  EXPECT_NE(members["indices.npy"].header.find("'shape': (70,)"), std::string::npos)
      << members["indices.npy"].header;
  EXPECT_EQ(members["matrix.npy"].data, Bytes(values));
  EXPECT_NE(members["matrix.npy"].header.find("'shape': (10, 3)"), std::string::npos);
  EXPECT_EQ(members["empty.npy"].data, "");
  EXPECT_NE(members["empty.npy"].header.find("'shape': (0,)"), std::string::npos);
  EXPECT_EQ(members["row_start.npy"].data, Bytes(std::vector<int64_t>{42}));
  EXPECT_NE(members["row_start.npy"].header.find("'shape': ()"), std::string::npos);
  // ZIP64 fields exactly where a size or offset reaches the threshold.
  EXPECT_EQ(members["indices.npy"].zip64, GetParam() == 1);
  EXPECT_EQ(members["matrix.npy"].zip64, GetParam() == 1);
  // The side files are gone.
  for (const auto& entry :
       std::filesystem::directory_iterator(std::filesystem::path(path).parent_path())) {
    EXPECT_EQ(entry.path().filename(), "out.npz");
  }
}

INSTANTIATE_TEST_SUITE_P(ClassicAndZip64, NpzWriterTest, ::testing::Values(0xffffffffull, 1));

TEST(NpzWriter, AWriterLeftUnfinishedRemovesItsSideFiles) {
  const std::string dir = FreshTestDir("npz_writer_unfinished");
  {
    auto writer = NpzWriter::Create(dir + "/out.npz");
    ASSERT_TRUE(writer.ok());
    auto a = (*writer)->AddStreamed("a", "<i4", 4);
    auto b = (*writer)->AddStreamed("b", "<i4", 4);
    ASSERT_TRUE(a.ok() && b.ok());
    const int32_t v = 7;
    ASSERT_TRUE((*writer)->Append(*b, &v, 1).ok());
    EXPECT_TRUE(std::filesystem::exists(dir + "/out.npz.b.part"));
  }
  EXPECT_FALSE(std::filesystem::exists(dir + "/out.npz.b.part"));
}

TEST(NpzWriter, ACreateThatCannotWriteSaysWhere) {
  auto writer = NpzWriter::Create("/nonexistent-dir/out.npz");
  EXPECT_EQ(writer.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_NE(writer.status().message().find("/nonexistent-dir/out.npz"), std::string::npos);
}

}  // namespace
}  // namespace latentd::storage
