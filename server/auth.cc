#include "server/auth.h"

#include <fstream>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace latentd::server {

bool ConstantTimeEquals(const std::string& a, const std::string& b) {
  // Touch max(len) bytes whatever the inputs, folding every difference into one accumulator.
  const size_t n = std::max(a.size(), b.size());
  unsigned char diff = a.size() == b.size() ? 0 : 1;
  for (size_t i = 0; i < n; ++i) {
    const unsigned char x = i < a.size() ? static_cast<unsigned char>(a[i]) : 0;
    const unsigned char y = i < b.size() ? static_cast<unsigned char>(b[i]) : 0;
    diff |= x ^ y;
  }
  return diff == 0;
}

absl::StatusOr<TokenAuth> TokenAuth::FromFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("--auth_token_file: cannot read ", path));
  std::string line;
  std::getline(in, line);
  std::string token(absl::StripAsciiWhitespace(line));
  if (token.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("--auth_token_file: ", path, " holds no token"));
  }
  return TokenAuth(std::move(token));
}

grpc::Status TokenAuth::Check(const grpc::ServerContext& context) const {
  if (!enabled()) return grpc::Status::OK;
  const auto& metadata = context.client_metadata();
  auto it = metadata.find("authorization");
  if (it == metadata.end()) {
    return grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                        "missing 'authorization: Bearer <token>' metadata");
  }
  if (!Accepts(std::string(it->second.data(), it->second.size()))) {
    return grpc::Status(grpc::StatusCode::UNAUTHENTICATED, "invalid bearer token");
  }
  return grpc::Status::OK;
}

bool TokenAuth::Accepts(const std::string& authorization) const {
  if (!enabled()) return true;
  constexpr absl::string_view kPrefix = "Bearer ";
  return absl::StartsWith(authorization, kPrefix) &&
         ConstantTimeEquals(authorization.substr(kPrefix.size()), token_);
}

}  // namespace latentd::server
