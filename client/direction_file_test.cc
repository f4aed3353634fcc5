#include "client/direction_file.h"

#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "common/npy_header.h"
#include "common/test_dir.h"
#include "gtest/gtest.h"

namespace latentd::client {
namespace {

namespace fs = std::filesystem;

void Write(const fs::path& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary) << bytes;
}

template <typename T>
std::string Npy(const std::string& descr, const std::vector<int64_t>& shape,
                const std::vector<T>& values) {
  std::string out = NpyHeader(descr, shape);
  out.append(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(T));
  return out;
}

TEST(ReadDirectionTest, NumpyVectorsOfEitherFloatWidth) {
  const fs::path dir = FreshTestDir("direction_file");
  Write(dir / "f4.npy", Npy<float>("<f4", {3}, {0.5f, -2.0f, 3.25f}));
  Write(dir / "f8.npy", Npy<double>("<f8", {1, 3}, {0.5, -2.0, 3.25}));  // a row vector
  for (const char* name : {"f4.npy", "f8.npy"}) {
    auto got = ReadDirection((dir / name).string());
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(*got, (std::vector<float>{0.5f, -2.0f, 3.25f})) << name;
  }
  Write(dir / "int.npy", Npy<int32_t>("<i4", {2}, {1, 2}));
  Write(dir / "matrix.npy", Npy<float>("<f4", {2, 2}, {1, 2, 3, 4}));
  std::string cut = Npy<float>("<f4", {4}, {1, 2, 3, 4});
  cut.resize(cut.size() - 3);
  Write(dir / "cut.npy", cut);
  for (const auto& [name, says] :
       std::vector<std::pair<std::string, std::string>>{{"int.npy", "dtype <i4"},
                                                        {"matrix.npy", "2 dimensions"},
                                                        {"cut.npy", "13 data bytes"}}) {
    auto got = ReadDirection((dir / name).string());
    EXPECT_EQ(got.status().code(), absl::StatusCode::kInvalidArgument) << name;
    EXPECT_NE(got.status().message().find(says), std::string::npos) << got.status();
  }
}

TEST(ReadDirectionTest, TextOfNumbers) {
  const fs::path dir = FreshTestDir("direction_file_text");
  Write(dir / "v.txt", "0.5\n-2e0, 3.25\n\n");
  auto got = ReadDirection((dir / "v.txt").string());
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, (std::vector<float>{0.5f, -2.0f, 3.25f}));
  Write(dir / "bad.txt", "1 2 x 4");
  got = ReadDirection((dir / "bad.txt").string());
  EXPECT_EQ(got.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(got.status().message().find("value 2 (\"x\") is not a number"), std::string::npos)
      << got.status();
  Write(dir / "empty.txt", "\n");
  EXPECT_EQ(ReadDirection((dir / "empty.txt").string()).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ReadDirection((dir / "missing.npy").string()).status().code(),
            absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace latentd::client
