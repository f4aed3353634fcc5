#include "engine/token_source.h"

#include <fstream>
#include <vector>

#include "gtest/gtest.h"

namespace latentd::engine {
namespace {

std::string TempPath(const std::string& name) {
  return std::string(getenv("TEST_TMPDIR") ? getenv("TEST_TMPDIR") : "/tmp") + "/" + name;
}

template <typename T>
std::string WriteNpy(const std::string& name, const std::string& descr, const std::string& shape,
                     const std::vector<T>& data) {
  std::string header =
      "{'descr': '" + descr + "', 'fortran_order': False, 'shape': " + shape + ", }";
  while ((10 + header.size() + 1) % 64 != 0) header.push_back(' ');
  header.push_back('\n');
  std::string path = TempPath(name);
  std::ofstream out(path, std::ios::binary);
  out.write("\x93NUMPY\x01\x00", 8);
  out.put(static_cast<char>(header.size() & 0xff));
  out.put(static_cast<char>(header.size() >> 8));
  out << header;
  out.write(reinterpret_cast<const char*>(data.data()), data.size() * sizeof(T));
  return path;
}

template <typename T>
std::string WriteRaw(const std::string& name, const std::vector<T>& data) {
  std::string path = TempPath(name);
  std::ofstream(path, std::ios::binary)
      .write(reinterpret_cast<const char*>(data.data()), data.size() * sizeof(T));
  return path;
}

latentd::v1::TokenSource Spec(const std::string& path, int ctx) {
  latentd::v1::TokenSource s;
  s.set_path(path);
  s.set_context_length(ctx);
  return s;
}

std::vector<int64_t> ReadAll(const TokenSource& src) {
  std::vector<int64_t> out(src.num_rows());
  EXPECT_TRUE(src.Read(0, src.num_sequences(), out.data()).ok());
  return out;
}

TEST(TokenSourceTest, EveryFormatYieldsTheSameSequences) {
  std::vector<int64_t> ids;
  for (int i = 0; i < 50; ++i) ids.push_back(i * 1000 + 7);
  std::vector<uint16_t> u16(ids.begin(), ids.end());
  std::vector<uint32_t> u32(ids.begin(), ids.end());
  std::vector<int32_t> i32(ids.begin(), ids.end());
  std::vector<std::string> paths = {WriteNpy("a.npy", "<u2", "(50,)", u16),
                                    WriteNpy("b.npy", "<i4", "(5, 10)", i32),
                                    WriteNpy("c.npy", "<i8", "(50,)", ids), WriteRaw("d.bin", u16)};
  for (const auto& p : paths) {
    auto src = TokenSource::Open(Spec(p, 8));
    ASSERT_TRUE(src.ok()) << p << ": " << src.status();
    EXPECT_EQ((*src)->num_sequences(), 6);  // 50 / 8, trailing 2 dropped
    std::vector<int64_t> want(ids.begin(), ids.begin() + 48);
    EXPECT_EQ(ReadAll(**src), want) << p;
  }
  auto spec = Spec(WriteRaw("e.u32", u32), 8);
  spec.set_format(latentd::v1::RAW_U32);
  auto src = TokenSource::Open(spec);
  ASSERT_TRUE(src.ok());
  EXPECT_EQ(ReadAll(**src), std::vector<int64_t>(ids.begin(), ids.begin() + 48));
}

TEST(TokenSourceTest, BosAndShard) {
  std::vector<uint16_t> u16(40);
  for (int i = 0; i < 40; ++i) u16[i] = i + 1;
  auto spec = Spec(WriteRaw("bos.bin", u16), 5);
  spec.set_prepend_bos(true);
  spec.set_bos_token_id(999);
  spec.set_sequence_start(2);
  spec.set_sequence_count(3);
  auto src = TokenSource::Open(spec);
  ASSERT_TRUE(src.ok()) << src.status();
  EXPECT_EQ((*src)->num_sequences(), 3);
  EXPECT_EQ((*src)->first_sequence(), 2);
  std::vector<int64_t> want = {999, 9, 10, 11, 12, 999, 13, 14, 15, 16, 999, 17, 18, 19, 20};
  EXPECT_EQ(ReadAll(**src), want);
  std::vector<int64_t> one(5);
  ASSERT_TRUE((*src)->Read(1, 1, one.data()).ok());
  EXPECT_EQ(one, std::vector<int64_t>(want.begin() + 5, want.begin() + 10));
  EXPECT_EQ((*src)->Read(2, 2, one.data()).code(), absl::StatusCode::kOutOfRange);
}

TEST(TokenSourceTest, BadInput) {
  std::vector<uint16_t> u16(40, 1);
  const std::string bin = WriteRaw("ok.bin", u16);
  EXPECT_EQ(TokenSource::Open(Spec(TempPath("missing.bin"), 8)).status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(TokenSource::Open(Spec(bin, 0)).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(TokenSource::Open(Spec(bin, 41)).status().code(), absl::StatusCode::kInvalidArgument);
  auto shard = Spec(bin, 8);
  shard.set_sequence_start(3);
  shard.set_sequence_count(3);
  EXPECT_EQ(TokenSource::Open(shard).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(
      TokenSource::Open(Spec(WriteRaw("odd.bin", std::vector<uint8_t>(41)), 8)).status().code(),
      absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(TokenSource::Open(Spec(WriteNpy("f.npy", "<f4", "(10,)", std::vector<float>(10)), 2))
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(TokenSource::Open(Spec(WriteNpy("short.npy", "<u2", "(100,)", u16), 2)).status().code(),
            absl::StatusCode::kInvalidArgument);  // shape says 200 bytes, file holds 80
  EXPECT_EQ(TokenSource::Open(Spec(WriteRaw("junk.npy", u16), 2)).status().code(),
            absl::StatusCode::kInvalidArgument);
  auto neg = TokenSource::Open(
      Spec(WriteNpy("neg.npy", "<i4", "(4,)", std::vector<int32_t>{1, -2, 3, 4}), 2));
  ASSERT_TRUE(neg.ok());
  std::vector<int64_t> out(4);
  EXPECT_EQ((*neg)->Read(0, 2, out.data()).code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace latentd::engine
