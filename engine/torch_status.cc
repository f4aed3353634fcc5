#include "engine/torch_status.h"

#include <c10/util/Exception.h>

#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace latentd::engine {

absl::Status TorchErrorStatus(const std::exception& e, absl::string_view where) {
  std::string what = e.what();
  if (const auto* c10_error = dynamic_cast<const c10::Error*>(&e)) {
    what = c10_error->what_without_backtrace();
  }
  const bool allocation = absl::StrContains(what, "out of memory") ||
                          absl::StrContains(what, "DefaultCPUAllocator") ||
                          absl::StrContains(what, "can't allocate");
  const std::string message = absl::StrCat(where, ": ", what);
  return allocation ? absl::ResourceExhaustedError(message) : absl::InternalError(message);
}

}  // namespace latentd::engine
