#include "server/daemon.h"

#include <cstdlib>
#include <fstream>
#include <string>

#include "absl/strings/match.h"
#include "common/test_dir.h"
#include "gtest/gtest.h"
#include "server/http_testing.h"

namespace latentd::server {
namespace {

DaemonOptions TestOptions(const std::string& name) {
  DaemonOptions options;
  options.listen = "127.0.0.1:0";
  options.data_dir = FreshTestDir(name);
  options.devices = "cpu:1";
  return options;
}

TEST(IsLoopbackListenAddress, KnowsLoopbackFromTheRest) {
  EXPECT_TRUE(IsLoopbackListenAddress("127.0.0.1:50051"));
  EXPECT_TRUE(IsLoopbackListenAddress("localhost:1"));
  EXPECT_TRUE(IsLoopbackListenAddress("[::1]:50051"));
  EXPECT_FALSE(IsLoopbackListenAddress("0.0.0.0:50051"));
  EXPECT_FALSE(IsLoopbackListenAddress("[::]:50051"));
  EXPECT_FALSE(IsLoopbackListenAddress("10.1.2.3:50051"));
}

TEST(Daemon, RefusesANonLoopbackAddressWithoutAToken) {
  DaemonOptions options = TestOptions("d1");
  options.listen = "0.0.0.0:0";
  Daemon daemon(options);
  absl::Status s = daemon.Start();
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("--auth_token_file"), absl::string_view::npos);
}

TEST(Daemon, StartsOnAnEphemeralPortAndShutsDown) {
  Daemon daemon(TestOptions("d2"));
  ASSERT_TRUE(daemon.Start().ok());
  EXPECT_GT(daemon.bound_port(), 0);
  daemon.Shutdown();
  daemon.Shutdown();  // idempotent
}

TEST(Daemon, BadDeviceSpecIsAnError) {
  DaemonOptions options = TestOptions("d3");
  options.devices = "gpu";
  Daemon daemon(options);
  EXPECT_EQ(daemon.Start().code(), absl::StatusCode::kInvalidArgument);
}

TEST(Daemon, BadBlockCacheSizeIsAnErrorNamingTheFlag) {
  DaemonOptions options = TestOptions("d4");
  options.block_cache_mb = 0;
  Daemon daemon(options);
  absl::Status s = daemon.Start();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("--block_cache_mb"), absl::string_view::npos);
}

TEST(Daemon, MetricsEndpointRulesAreTheListenAddresses) {
  DaemonOptions options = TestOptions("d5");
  options.metrics_listen = "0.0.0.0:0";
  absl::Status s = Daemon(options).Start();
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("--metrics_listen=0.0.0.0:0 is not a loopback address"),
            absl::string_view::npos)
      << s;

  options.metrics_listen = "127.0.0.1";  // no port
  s = Daemon(options).Start();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("--metrics_listen: "), absl::string_view::npos) << s;
}

TEST(Daemon, ServesMetricsOnlyWhenAsked) {
  Daemon without(TestOptions("d6"));
  ASSERT_TRUE(without.Start().ok());
  EXPECT_EQ(without.metrics_port(), 0);

  DaemonOptions options = TestOptions("d7");
  options.metrics_listen = "127.0.0.1:0";
  Daemon daemon(options);
  ASSERT_TRUE(daemon.Start().ok());
  EXPECT_GT(daemon.metrics_port(), 0);
  EXPECT_NE(daemon.metrics_port(), daemon.bound_port());
}

TEST(Daemon, MetricsRoutesAuthAndShutdown) {
  DaemonOptions options = TestOptions("d8");
  options.metrics_listen = "127.0.0.1:0";
  options.auth_token_file = options.data_dir + "/token";
  std::ofstream(options.auth_token_file) << "scrape-token\n";
  Daemon daemon(options);
  ASSERT_TRUE(daemon.Start().ok());
  const int port = daemon.metrics_port();

  // /healthz needs no token (probes carry none).
  std::string answer = Exchange(port, "GET /healthz HTTP/1.1\r\n\r\n");
  EXPECT_TRUE(absl::StartsWith(answer, "HTTP/1.1 200 OK\r\n")) << answer;
  EXPECT_TRUE(absl::EndsWith(answer, "\r\n\r\nserving\n")) << answer;
  // /metrics does.
  answer = Exchange(port, "GET /metrics HTTP/1.1\r\n\r\n");
  EXPECT_TRUE(absl::StartsWith(answer, "HTTP/1.1 401 Unauthorized\r\n")) << answer;
  EXPECT_TRUE(absl::StrContains(answer, "WWW-Authenticate: Bearer realm=\"latentd\"\r\n"));
  answer = Exchange(port, "GET /metrics HTTP/1.1\r\nAuthorization: Bearer wrong\r\n\r\n");
  EXPECT_TRUE(absl::StartsWith(answer, "HTTP/1.1 401 ")) << answer;
  answer = Exchange(port, "GET /metrics HTTP/1.1\r\nAuthorization: Bearer scrape-token\r\n\r\n");
  EXPECT_TRUE(absl::StartsWith(answer, "HTTP/1.1 200 OK\r\n")) << answer;
  EXPECT_TRUE(absl::StrContains(answer, "Content-Type: text/plain; version=0.0.4; charset=utf-8"));
  EXPECT_TRUE(absl::StrContains(answer, "\nlatentd_jobs{type=\"probe\",state=\"pending\"} 0\n"));
  EXPECT_TRUE(absl::StrContains(answer, "\nlatentd_device_busy{device=\"cpu:0\"} 0\n"));
  // Other paths and methods.
  answer = Exchange(port, "GET /jobs HTTP/1.1\r\n\r\n");
  EXPECT_TRUE(absl::StartsWith(answer, "HTTP/1.1 404 Not Found\r\n")) << answer;
  answer = Exchange(port, "POST /metrics HTTP/1.1\r\nContent-Length: 0\r\n\r\n");
  EXPECT_TRUE(absl::StartsWith(answer, "HTTP/1.1 405 Method Not Allowed\r\n")) << answer;
  EXPECT_TRUE(absl::StrContains(answer, "Allow: GET, HEAD\r\n")) << answer;

  daemon.Shutdown();
  EXPECT_EQ(Exchange(port, "GET /healthz HTTP/1.1\r\n\r\n"), "<refused>");
}

}  // namespace
}  // namespace latentd::server
