#include "server/auth.h"

#include <cstdlib>
#include <fstream>

#include "gtest/gtest.h"

namespace latentd::server {
namespace {

TEST(ConstantTimeEquals, ComparesWholeStrings) {
  EXPECT_TRUE(ConstantTimeEquals("secret", "secret"));
  EXPECT_FALSE(ConstantTimeEquals("secret", "secreT"));
  EXPECT_FALSE(ConstantTimeEquals("secret", "secret2"));
  EXPECT_FALSE(ConstantTimeEquals("", "x"));
  EXPECT_TRUE(ConstantTimeEquals("", ""));
}

TEST(TokenAuth, FromFileStripsWhitespaceAndRejectsEmpty) {
  const char* base = std::getenv("TEST_TMPDIR");
  std::string path = std::string(base ? base : "/tmp") + "/token";
  std::ofstream(path) << "  s3cret \n";
  auto auth = TokenAuth::FromFile(path);
  ASSERT_TRUE(auth.ok());
  EXPECT_TRUE(auth->enabled());
  std::ofstream(path) << "\n";
  EXPECT_EQ(TokenAuth::FromFile(path).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(TokenAuth::FromFile(path + ".missing").status().code(), absl::StatusCode::kNotFound);
}

TEST(TokenAuth, DisabledAllowsEverything) {
  TokenAuth auth;
  grpc::ServerContext context;
  EXPECT_TRUE(auth.Check(context).ok());
}

TEST(TokenAuth, EnabledRejectsACallWithoutMetadata) {
  TokenAuth auth("tok");
  grpc::ServerContext context;
  EXPECT_EQ(auth.Check(context).error_code(), grpc::StatusCode::UNAUTHENTICATED);
}

TEST(TokenAuth, AcceptsOnlyTheBearerTokenItHolds) {
  TokenAuth auth("s3cret");
  EXPECT_TRUE(auth.Accepts("Bearer s3cret"));
  EXPECT_FALSE(auth.Accepts("Bearer s3cre"));
  EXPECT_FALSE(auth.Accepts("Bearer s3cret2"));
  EXPECT_FALSE(auth.Accepts("s3cret"));
  EXPECT_FALSE(auth.Accepts("Basic s3cret"));
  EXPECT_FALSE(auth.Accepts(""));
  EXPECT_TRUE(TokenAuth().Accepts(""));  // no token: everything passes
}

}  // namespace
}  // namespace latentd::server
