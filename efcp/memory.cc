#include "efcp/memory.h"

#include "absl/strings/str_cat.h"

namespace efcp {

int64_t MemoryBreakdown::total() const {
  int64_t sum = 0;
  for (const auto& c : components) sum += c.second;
  return sum;
}

int64_t MemoryBreakdown::get(std::string_view name) const {
  for (const auto& c : components) {
    if (c.first == name) return c.second;
  }
  return 0;
}

void MemoryBreakdown::add(std::string_view name, int64_t bytes) {
  for (auto& c : components) {
    if (c.first == name) {
      c.second += bytes;
      return;
    }
  }
  components.emplace_back(std::string(name), bytes);
}

std::string MemoryBreakdown::ToString() const {
  std::string out;
  for (const auto& c : components) absl::StrAppend(&out, c.first, "=", c.second, " ");
  absl::StrAppend(&out, "total=", total());
  return out;
}

bool operator==(const MemoryBreakdown& a, const MemoryBreakdown& b) {
  return a.components == b.components;
}

int64_t DenseMfacHistoryBytes(int64_t d, int64_t m) { return 4 * m * d; }

absl::Status AdmitMemory(const MemoryBreakdown& estimate, int64_t budget_bytes,
                         std::string_view what) {
  if (estimate.total() <= budget_bytes) return absl::OkStatus();
  return absl::ResourceExhaustedError(
      absl::StrCat(std::string(what), " needs ", estimate.total(), " bytes of optimizer state (",
                   estimate.ToString(), ") but the budget is ", budget_bytes, " bytes"));
}

}  // namespace efcp
