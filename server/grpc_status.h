// The one place absl::Status becomes grpc::Status: service handlers call it on every return path.
#ifndef LATENTD_SERVER_GRPC_STATUS_H_
#define LATENTD_SERVER_GRPC_STATUS_H_

#include <grpcpp/support/status.h>

#include "absl/status/status.h"

namespace latentd::server {

// Same code, same message (absl and gRPC share the canonical code numbering).
grpc::Status ToGrpcStatus(const absl::Status& status);

}  // namespace latentd::server

#endif  // LATENTD_SERVER_GRPC_STATUS_H_
