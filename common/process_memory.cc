#include "common/process_memory.h"

#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>

namespace latentd {
namespace {

// The value of a "Key:   N kB" line of a /proc file (status, meminfo), in bytes.
int64_t KilobyteField(const char* file, const char* key) {
  std::ifstream in(file);
  std::string line;
  const size_t n = std::strlen(key);
  while (std::getline(in, line)) {
    if (line.compare(0, n, key) == 0 && line.size() > n && line[n] == ':') {
      return std::atoll(line.c_str() + n + 1) * 1024;
    }
  }
  return -1;
}

}  // namespace

int64_t ProcessRssBytes() {
  std::ifstream statm("/proc/self/statm");
  int64_t size_pages = 0, resident_pages = 0;
  if (!(statm >> size_pages >> resident_pages)) return -1;
  return resident_pages * static_cast<int64_t>(sysconf(_SC_PAGESIZE));
}

int64_t ProcessPeakRssBytes() { return KilobyteField("/proc/self/status", "VmHWM"); }

bool ResetProcessPeakRss() {
  std::ofstream out("/proc/self/clear_refs");
  out << "5";
  out.flush();
  return static_cast<bool>(out);
}

int64_t HostMemoryBytes() {
  return static_cast<int64_t>(sysconf(_SC_PHYS_PAGES)) *
         static_cast<int64_t>(sysconf(_SC_PAGESIZE));
}

int64_t HostAvailableMemoryBytes() { return KilobyteField("/proc/meminfo", "MemAvailable"); }

}  // namespace latentd
