// The name=value arguments of the small benchmarks (bazel-bin/bench/sae_auxk atoms=512).
#ifndef LATENTD_BENCH_BENCH_ARGS_H_
#define LATENTD_BENCH_BENCH_ARGS_H_

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>

namespace latentd::bench {

// The value of the last `name=N` among argv[1..], else `fallback`.
inline int64_t IntArg(int argc, char** argv, const char* name, int64_t fallback) {
  const std::string prefix = std::string(name) + "=";
  int64_t value = fallback;
  for (int i = 1; i < argc; ++i) {
    if (std::strncmp(argv[i], prefix.c_str(), prefix.size()) == 0) {
      value = std::atoll(argv[i] + prefix.size());
    }
  }
  return value;
}

// The value of the last `name=TEXT` among argv[1..], else `fallback`.
inline std::string StringArg(int argc, char** argv, const char* name, const std::string& fallback) {
  const std::string prefix = std::string(name) + "=";
  std::string value = fallback;
  for (int i = 1; i < argc; ++i) {
    if (std::strncmp(argv[i], prefix.c_str(), prefix.size()) == 0) {
      value = argv[i] + prefix.size();
    }
  }
  return value;
}

}  // namespace latentd::bench

#endif  // LATENTD_BENCH_BENCH_ARGS_H_
