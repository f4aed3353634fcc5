#include "common/process_memory.h"

#include <sys/mman.h>

#include <cstring>

#include "gtest/gtest.h"

namespace latentd {
namespace {

TEST(ProcessMemory, RssAndPeakFollowTouchedMemory) {
  ASSERT_TRUE(ResetProcessPeakRss());
  const int64_t before = ProcessRssBytes();
  ASSERT_GT(before, 0);
  constexpr size_t kBytes = 64 << 20;
  // Mapped and unmapped directly, so no allocator (nor a sanitizer's quarantine) keeps it.
  void* block = mmap(nullptr, kBytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(block, MAP_FAILED);
  std::memset(block, 1, kBytes);  // touched: resident
  EXPECT_GE(ProcessRssBytes(), before + static_cast<int64_t>(kBytes) * 9 / 10);
  munmap(block, kBytes);
  // The block is gone, the peak remembers it.
  EXPECT_LT(ProcessRssBytes(), before + static_cast<int64_t>(kBytes) / 2);
  EXPECT_GE(ProcessPeakRssBytes(), before + static_cast<int64_t>(kBytes) * 9 / 10);
  ASSERT_TRUE(ResetProcessPeakRss());
  EXPECT_LT(ProcessPeakRssBytes(), before + static_cast<int64_t>(kBytes) / 2);
  EXPECT_GE(HostMemoryBytes(), ProcessRssBytes());
  EXPECT_GT(HostAvailableMemoryBytes(), 0);
  EXPECT_LE(HostAvailableMemoryBytes(), HostMemoryBytes());
}

}  // namespace
}  // namespace latentd
