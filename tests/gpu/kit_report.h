// Result lines of the GPU check kit. Every check binary prints one line per check,
//   PASS <name> <detail> | FAIL <name> <detail> | SKIP <name> <why> | INFO <name> <detail>
// which run.sh collects into gpu_check.txt; a binary exits 1 when any of its checks failed.
// Header-only and free of torch and abseil, so that every check binary can use it.
#ifndef LATENTD_TESTS_GPU_KIT_REPORT_H_
#define LATENTD_TESTS_GPU_KIT_REPORT_H_

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <functional>
#include <iomanip>
#include <sstream>
#include <string>

namespace gpu_kit {

class Report {
 public:
  void Pass(const std::string& name, const std::string& detail) { Line("PASS", name, detail); }
  void Fail(const std::string& name, const std::string& detail) {
    ++failures_;
    Line("FAIL", name, detail);
  }
  void Skip(const std::string& name, const std::string& why) { Line("SKIP", name, why); }
  void Info(const std::string& name, const std::string& detail) { Line("INFO", name, detail); }
  void Check(bool ok, const std::string& name, const std::string& detail) {
    ok ? Pass(name, detail) : Fail(name, detail);
  }

  // Runs `body`; an exception escaping it is this check's FAIL (the body reports its own PASS).
  void Guard(const std::string& name, const std::function<void()>& body) {
    try {
      body();
    } catch (const std::exception& e) {
      Fail(name, std::string("exception: ") + FirstLine(e.what()));
    } catch (...) {
      Fail(name, "unknown exception");
    }
  }

  int failures() const { return failures_; }
  int exit_code() const { return failures_ > 0 ? 1 : 0; }

 private:
  // c10::Error messages carry a multi-line backtrace; the first line says what went wrong.
  static std::string FirstLine(const std::string& s) {
    const size_t end = s.find('\n');
    return end == std::string::npos ? s : s.substr(0, end);
  }
  void Line(const char* tag, const std::string& name, const std::string& detail) {
    std::printf("%s %s %s\n", tag, name.c_str(), detail.c_str());
    // run.sh may kill a hung binary; what was printed before must survive it.
    std::fflush(stdout);
  }

  int failures_ = 0;
};

// run.sh sets KIT_EXPECT_CUDA=1 / KIT_EXPECT_NCCL=1 when the wheel's Python side sees CUDA / NCCL;
// a binary that then does not see them reports FAIL instead of SKIP.
inline bool EnvFlag(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr && std::string(v) == "1";
}

inline std::string Sci(double x) {
  std::ostringstream os;
  os << std::scientific << std::setprecision(2) << x;
  return os.str();
}

inline double SecondsSince(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace gpu_kit

#endif  // LATENTD_TESTS_GPU_KIT_REPORT_H_
