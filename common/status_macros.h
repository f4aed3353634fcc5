// Minimal status propagation macros. Debian's abseil (20220623) ships no status_macros.h.
//
//   RETURN_IF_ERROR(expr);             // returns expr's status from the caller when it is not ok
//   ASSIGN_OR_RETURN(auto x, expr);    // expr yields absl::StatusOr<T>; binds the value or returns
#ifndef LATENTD_COMMON_STATUS_MACROS_H_
#define LATENTD_COMMON_STATUS_MACROS_H_

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define LATENTD_CONCAT_INNER_(a, b) a##b
#define LATENTD_CONCAT_(a, b) LATENTD_CONCAT_INNER_(a, b)

#define RETURN_IF_ERROR(expr)                          \
  do {                                                 \
    const ::absl::Status latentd_status_ = (expr);     \
    if (!latentd_status_.ok()) return latentd_status_; \
  } while (0)

#define ASSIGN_OR_RETURN(lhs, expr) \
  LATENTD_ASSIGN_OR_RETURN_IMPL_(LATENTD_CONCAT_(latentd_statusor_, __LINE__), lhs, expr)

#define LATENTD_ASSIGN_OR_RETURN_IMPL_(statusor, lhs, expr) \
  auto statusor = (expr);                                   \
  if (!statusor.ok()) return statusor.status();             \
  lhs = std::move(statusor).value()

#endif  // LATENTD_COMMON_STATUS_MACROS_H_
