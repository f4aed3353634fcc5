// Bearer-token authentication of RPCs.
//
// With a token configured, every RPC of latentd's own services must carry the metadata
// `authorization: Bearer <token>`; anything else is UNAUTHENTICATED. The comparison takes the same
// time wherever the first difference is. Health checking is exempt (load balancers probe it without
// credentials), and so is server reflection, which only describes the public API schema.
#ifndef LATENTD_SERVER_AUTH_H_
#define LATENTD_SERVER_AUTH_H_

#include <grpcpp/server_context.h>

#include <string>

#include "absl/status/statusor.h"

namespace latentd::server {

class TokenAuth {
 public:
  // No token: every call is allowed.
  TokenAuth() = default;
  explicit TokenAuth(std::string token) : token_(std::move(token)) {}

  // Reads the token from the first line of `path` (surrounding whitespace ignored). An empty token
  // or an unreadable file is an error: a daemon asked for auth must not silently run without it.
  static absl::StatusOr<TokenAuth> FromFile(const std::string& path);

  bool enabled() const { return !token_.empty(); }
  grpc::Status Check(const grpc::ServerContext& context) const;
  // Whether an `authorization` value (gRPC metadata or HTTP header) is "Bearer <the token>";
  // always true without a token.
  bool Accepts(const std::string& authorization) const;

 private:
  std::string token_;
};

// Equal in time independent of where the inputs differ (the length is not secret).
bool ConstantTimeEquals(const std::string& a, const std::string& b);

}  // namespace latentd::server

#endif  // LATENTD_SERVER_AUTH_H_
