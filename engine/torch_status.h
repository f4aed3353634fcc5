// Where LibTorch's exceptions become Status at the engine boundary (no exception crosses a module
// API). Torch-free header.
#ifndef LATENTD_ENGINE_TORCH_STATUS_H_
#define LATENTD_ENGINE_TORCH_STATUS_H_

#include <exception>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace latentd::engine {

// "<where>: <message>" (a c10::Error's message without its backtrace) as RESOURCE_EXHAUSTED when
// an allocation failed (CUDA's "out of memory", the CPU allocator's "can't allocate"), so that
// callers can tell a job too large for its device from a bug; INTERNAL otherwise.
absl::Status TorchErrorStatus(const std::exception& e, absl::string_view where);

}  // namespace latentd::engine

#endif  // LATENTD_ENGINE_TORCH_STATUS_H_
