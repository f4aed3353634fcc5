#include "efcp/memory.h"

#include <gtest/gtest.h>

namespace efcp {
namespace {

TEST(MemoryBreakdownTest, TotalAndLookup) {
  MemoryBreakdown b;
  b.add("history_values", 100);
  b.add("gram", 8);
  b.add("history_values", 20);
  EXPECT_EQ(b.total(), 128);
  EXPECT_EQ(b.get("history_values"), 120);
  EXPECT_EQ(b.get("absent"), 0);
  EXPECT_EQ(b.components.size(), 2u);
}

TEST(MemoryBreakdownTest, DenseHistoryIsFourBytesPerEntry) {
  EXPECT_EQ(DenseMfacHistoryBytes(8400000, 1024), int64_t{4} * 1024 * 8400000);
}

TEST(MemoryBreakdownTest, AdmitRefusesOverBudgetWithNumbers) {
  MemoryBreakdown b;
  b.add("history_values", 1000);
  EXPECT_TRUE(AdmitMemory(b, 1000, "MFAC").ok());
  const absl::Status st = AdmitMemory(b, 999, "MFAC");
  EXPECT_EQ(st.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(std::string(st.message()).find("1000"), std::string::npos);
  EXPECT_NE(std::string(st.message()).find("999"), std::string::npos);
}

}  // namespace
}  // namespace efcp
