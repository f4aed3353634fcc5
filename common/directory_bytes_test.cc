#include "common/directory_bytes.h"

#include <fstream>
#include <string>

#include "common/test_dir.h"
#include "gtest/gtest.h"

namespace latentd {
namespace {

void WriteBytes(const std::filesystem::path& path, size_t n) {
  std::ofstream(path, std::ios::binary) << std::string(n, 'x');
}

TEST(DirectoryBytes, SumsRegularFilesBelowWithoutFollowingLinks) {
  const std::filesystem::path dir = FreshTestDir("directory_bytes");
  std::filesystem::create_directories(dir / "a" / "b");
  WriteBytes(dir / "top", 10);
  WriteBytes(dir / "a" / "mid", 200);
  WriteBytes(dir / "a" / "b" / "deep", 3000);
  EXPECT_EQ(DirectoryBytes(dir), 3210);
  // A link to a big file outside counts nothing (neither does the link itself).
  const std::filesystem::path outside = FreshTestDir("directory_bytes_outside");
  WriteBytes(outside / "big", 100000);
  std::filesystem::create_symlink(outside / "big", dir / "link");
  std::filesystem::create_directory_symlink(outside, dir / "dirlink");
  EXPECT_EQ(DirectoryBytes(dir), 3210);
  EXPECT_EQ(DirectoryBytes(dir / "a" / "b"), 3000);
  EXPECT_EQ(DirectoryBytes(dir / "missing"), -1);
}

}  // namespace
}  // namespace latentd
