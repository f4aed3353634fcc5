// Scratch directories for tests.
#ifndef LATENTD_COMMON_TEST_DIR_H_
#define LATENTD_COMMON_TEST_DIR_H_

#include <cstdlib>
#include <filesystem>
#include <string>

namespace latentd {

// An empty directory `name` under Bazel's per-test $TEST_TMPDIR (or /tmp outside Bazel); whatever
// an earlier run left there is removed first.
inline std::string FreshTestDir(const std::string& name) {
  const char* base = std::getenv("TEST_TMPDIR");
  std::filesystem::path dir = std::filesystem::path(base != nullptr ? base : "/tmp") / name;
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir.string();
}

}  // namespace latentd

#endif  // LATENTD_COMMON_TEST_DIR_H_
