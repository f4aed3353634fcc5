// This process's host memory as Linux reports it in /proc/self: what telemetry and benchmarks
// show as "process RSS". Every function returns -1 where /proc is unreadable.
#ifndef LATENTD_COMMON_PROCESS_MEMORY_H_
#define LATENTD_COMMON_PROCESS_MEMORY_H_

#include <cstdint>

namespace latentd {

// Resident set size now, in bytes.
int64_t ProcessRssBytes();
// The largest resident set size since the process started or the last ResetProcessPeakRss()
// (VmHWM), in bytes.
int64_t ProcessPeakRssBytes();
// Starts a new peak at the current RSS (writes 5 to /proc/self/clear_refs; Linux >= 4.0).
// Returns false where that is not allowed.
bool ResetProcessPeakRss();
// Physical memory of the host, in bytes.
int64_t HostMemoryBytes();
// Memory the host can give new allocations without swapping (MemAvailable), in bytes.
int64_t HostAvailableMemoryBytes();

}  // namespace latentd

#endif  // LATENTD_COMMON_PROCESS_MEMORY_H_
