#include "server/http_endpoint.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <iterator>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "server/http_testing.h"

namespace latentd::server {
namespace {

HttpResponse Echo(const HttpRequest& request) {
  HttpResponse response;
  if (request.path == "/missing") {
    response.status = 404;
    response.body = "no such page\n";
    return response;
  }
  response.content_type = "text/x-echo";
  response.headers.push_back({"X-Seen-Method", request.method});
  response.body = absl::StrCat("path=", request.path, " query=", request.query,
                               " token=", request.Header("authorization"), "\n");
  return response;
}

TEST(HttpEndpoint, AnswersWithTheHandlersStatusTypeHeadersAndBody) {
  auto endpoint = HttpEndpoint::Start("127.0.0.1:0", Echo);
  ASSERT_TRUE(endpoint.ok()) << endpoint.status();
  ASSERT_GT((*endpoint)->port(), 0);

  const std::string answer =
      Exchange((*endpoint)->port(),
               "GET /metrics?name=x HTTP/1.1\r\nHost: a\r\nAuthorization:  Bearer s3cret \r\n\r\n");
  const std::string body = "path=/metrics query=name=x token=Bearer s3cret\n";
  EXPECT_TRUE(absl::StartsWith(answer, "HTTP/1.1 200 OK\r\n")) << answer;
  EXPECT_TRUE(absl::StrContains(answer, "Content-Type: text/x-echo\r\n")) << answer;
  EXPECT_TRUE(absl::StrContains(answer, absl::StrCat("Content-Length: ", body.size(), "\r\n")));
  EXPECT_TRUE(absl::StrContains(answer, "Connection: close\r\n"));
  EXPECT_TRUE(absl::StrContains(answer, "X-Seen-Method: GET\r\n"));
  EXPECT_TRUE(absl::EndsWith(answer, "\r\n\r\n" + body)) << answer;

  const std::string missing = Exchange((*endpoint)->port(), "GET /missing HTTP/1.0\r\n\r\n");
  EXPECT_TRUE(absl::StartsWith(missing, "HTTP/1.1 404 Not Found\r\n")) << missing;
}

TEST(HttpEndpoint, HeadGetsTheHeadersOfGetWithoutABody) {
  auto endpoint = HttpEndpoint::Start("127.0.0.1:0", Echo);
  ASSERT_TRUE(endpoint.ok()) << endpoint.status();
  const std::string answer = Exchange((*endpoint)->port(), "HEAD /x HTTP/1.1\r\n\r\n");
  const std::string get_body = "path=/x query= token=\n";
  EXPECT_TRUE(absl::StartsWith(answer, "HTTP/1.1 200 OK\r\n")) << answer;
  EXPECT_TRUE(absl::StrContains(answer, absl::StrCat("Content-Length: ", get_body.size())));
  EXPECT_TRUE(absl::EndsWith(answer, "\r\n\r\n")) << answer;
}

TEST(HttpEndpoint, MalformedAndOversizedRequestsNeverReachTheHandler) {
  std::atomic<int> calls{0};
  HttpEndpointOptions options;
  options.max_request_bytes = 1024;
  auto endpoint = HttpEndpoint::Start(
      "127.0.0.1:0",
      [&](const HttpRequest& r) {
        ++calls;
        return Echo(r);
      },
      options);
  ASSERT_TRUE(endpoint.ok()) << endpoint.status();
  const int port = (*endpoint)->port();

  EXPECT_TRUE(absl::StartsWith(Exchange(port, "GET /metrics\r\n\r\n"), "HTTP/1.1 400 "));
  EXPECT_TRUE(absl::StartsWith(Exchange(port, "GET /metrics SMTP/1.0\r\n\r\n"), "HTTP/1.1 400 "));
  EXPECT_TRUE(
      absl::StartsWith(Exchange(port, "GET / HTTP/1.1\r\nno colon here\r\n\r\n"), "HTTP/1.1 400 "));
  const std::string huge =
      absl::StrCat("GET / HTTP/1.1\r\nX-Pad: ", std::string(4096, 'p'), "\r\n\r\n");
  const std::string too_large = Exchange(port, huge);
  EXPECT_TRUE(absl::StartsWith(too_large, "HTTP/1.1 431 ")) << too_large;
  EXPECT_EQ(calls.load(), 0);
  // A client that connects and leaves without a word gets nothing and costs nothing.
  close(ConnectLoopback(port));
  EXPECT_TRUE(absl::StartsWith(Exchange(port, "GET / HTTP/1.1\r\n\r\n"), "HTTP/1.1 200 "));
  EXPECT_EQ(calls.load(), 1);
}

TEST(HttpEndpoint, AClientThatStallsTimesOutAndTheNextIsServed) {
  HttpEndpointOptions options;
  options.read_timeout = absl::Milliseconds(300);
  auto endpoint = HttpEndpoint::Start("127.0.0.1:0", Echo, options);
  ASSERT_TRUE(endpoint.ok()) << endpoint.status();
  const int port = (*endpoint)->port();

  const int stalled = ConnectLoopback(port);
  ASSERT_GE(stalled, 0);
  const std::string partial = "GET /slow HTTP/1.1\r\nHost: a\r\n";  // never finished
  send(stalled, partial.data(), partial.size(), MSG_NOSIGNAL);
  // Served beside the stalled one, whatever the order.
  std::string next;
  std::thread second([&] { next = Exchange(port, "GET /next HTTP/1.1\r\n\r\n"); });
  const std::string stalled_answer = ReadToEnd(stalled);
  close(stalled);
  second.join();
  EXPECT_TRUE(absl::StartsWith(stalled_answer, "HTTP/1.1 408 Request Timeout\r\n"))
      << stalled_answer;
  EXPECT_TRUE(absl::StrContains(next, "path=/next")) << next;
}

// Whether `fd` has something to read (or was closed) within `wait`.
bool Readable(int fd, absl::Duration wait) {
  pollfd p{fd, POLLIN, 0};
  return poll(&p, 1, static_cast<int>(absl::ToInt64Milliseconds(wait))) > 0;
}

// A liveness probe must not wait behind a scraper that stalls: the endpoint answers a second
// connection while the first is still inside its read_timeout, and then the first too.
TEST(HttpEndpoint, AStalledClientHoldsNoOneElseBack) {
  HttpEndpointOptions options;
  options.read_timeout = absl::Seconds(60);
  auto endpoint = HttpEndpoint::Start("127.0.0.1:0", Echo, options);
  ASSERT_TRUE(endpoint.ok()) << endpoint.status();
  const int port = (*endpoint)->port();
  std::vector<int> stalled;
  for (int i = 0; i < 5; ++i) {
    stalled.push_back(ConnectLoopback(port));
    ASSERT_GE(stalled.back(), 0);
    const std::string partial = absl::StrCat("GET /slow", i, " HTTP/1.1\r\nHost: a\r\n");
    send(stalled.back(), partial.data(), partial.size(), MSG_NOSIGNAL);
  }
  EXPECT_TRUE(absl::StrContains(Exchange(port, "GET /healthz HTTP/1.1\r\n\r\n"), "path=/healthz"));
  for (int fd : stalled) EXPECT_FALSE(Readable(fd, absl::ZeroDuration()));  // still waited for
  // Each stalled request, finished in reverse order, gets its own answer.
  for (int i = 4; i >= 0; --i) {
    send(stalled[i], "\r\n", 2, MSG_NOSIGNAL);
    const std::string answer = ReadToEnd(stalled[i]);
    close(stalled[i]);
    EXPECT_TRUE(absl::StrContains(answer, absl::StrCat("path=/slow", i, " "))) << answer;
  }
}

TEST(HttpEndpoint, ConnectionsPastTheLimitWaitToBeAccepted) {
  HttpEndpointOptions options;
  options.read_timeout = absl::Seconds(60);
  options.max_connections = 1;
  auto endpoint = HttpEndpoint::Start("127.0.0.1:0", Echo, options);
  ASSERT_TRUE(endpoint.ok()) << endpoint.status();
  const int port = (*endpoint)->port();
  const int first = ConnectLoopback(port);
  ASSERT_GE(first, 0);
  send(first, "GET /first", 10, MSG_NOSIGNAL);
  ASSERT_FALSE(Readable(first, absl::Milliseconds(100)));  // accepted, and waiting for the rest
  const int second = ConnectLoopback(port);                // the kernel's backlog takes it
  ASSERT_GE(second, 0);
  const std::string request = "GET /second HTTP/1.1\r\n\r\n";
  send(second, request.data(), request.size(), MSG_NOSIGNAL);
  EXPECT_FALSE(Readable(second, absl::Milliseconds(200)));  // not served: the one slot is taken
  send(first, " HTTP/1.1\r\n\r\n", 13, MSG_NOSIGNAL);
  EXPECT_TRUE(absl::StrContains(ReadToEnd(first), "path=/first"));
  close(first);
  EXPECT_TRUE(absl::StrContains(ReadToEnd(second), "path=/second"));
  close(second);
}

TEST(HttpEndpoint, BadAddressesAreErrorsAndStopClosesThePort) {
  EXPECT_EQ(HttpEndpoint::Start("no-port", Echo).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(HttpEndpoint::Start("127.0.0.1:99999", Echo).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(HttpEndpoint::Start("127.0.0.1:http", Echo).status().code(),
            absl::StatusCode::kInvalidArgument);

  auto endpoint = HttpEndpoint::Start("127.0.0.1:0", Echo);
  ASSERT_TRUE(endpoint.ok()) << endpoint.status();
  const int port = (*endpoint)->port();
  auto taken = HttpEndpoint::Start(absl::StrCat("127.0.0.1:", port), Echo);
  EXPECT_EQ(taken.status().code(), absl::StatusCode::kUnavailable) << taken.status();

  (*endpoint)->Stop();
  (*endpoint)->Stop();  // idempotent
  EXPECT_EQ(ConnectLoopback(port), -1);
}

// Whatever a client sends, the endpoint answers with a status line (or, when it got nothing,
// closes) and goes on serving; under ASan (scripts/test.sh) no byte of it reads out of bounds.
TEST(HttpEndpoint, AnswersGarbageWithAStatusLineAndLivesOn) {
  HttpEndpointOptions options;
  options.read_timeout = absl::Milliseconds(25);  // most requests never end their headers
  options.max_request_bytes = 2048;
  auto endpoint = HttpEndpoint::Start("127.0.0.1:0", Echo, options);
  ASSERT_TRUE(endpoint.ok()) << endpoint.status();
  const int port = (*endpoint)->port();
  const std::string pieces[] = {
      "GET",  " ",   "/metrics", "?",    "a=b",        " HTTP/1.1", "HTTP/1.",
      "\r\n", "\r",  "\n",       ":",    "Host: x",    "\r\n\r\n",  std::string(1, '\0'),
      "\xff", "%00", "  ",       "HEAD", "X: \x01\x02"};
  std::mt19937 random(29);
  int answered = 0;
  for (int i = 0; i < 200; ++i) {
    std::string request;
    const int n = 1 + static_cast<int>(random() % 12);
    for (int p = 0; p < n; ++p) request += pieces[random() % std::size(pieces)];
    if (random() % 4 == 0) request += "\r\n\r\n";  // most then end their headers
    const std::string answer = Exchange(port, request);
    if (answer.empty()) continue;  // closed without a word: allowed only for an empty read
    ++answered;
    EXPECT_TRUE(absl::StartsWith(answer, "HTTP/1.1 ")) << absl::CEscape(request);
  }
  EXPECT_GT(answered, 150);
  EXPECT_TRUE(absl::StrContains(Exchange(port, "GET /after HTTP/1.1\r\n\r\n"), "path=/after"));
}

TEST(HttpEndpoint, ListensOnIpv6LoopbackInBrackets) {
  auto endpoint = HttpEndpoint::Start("[::1]:0", Echo);
  if (!endpoint.ok()) GTEST_SKIP() << "no IPv6 loopback here: " << endpoint.status();
  const int fd = socket(AF_INET6, SOCK_STREAM, 0);
  sockaddr_in6 address{};
  address.sin6_family = AF_INET6;
  address.sin6_port = htons((*endpoint)->port());
  address.sin6_addr = in6addr_loopback;
  ASSERT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)), 0);
  const std::string request = "GET /six HTTP/1.1\r\n\r\n";
  send(fd, request.data(), request.size(), MSG_NOSIGNAL);
  const std::string answer = ReadToEnd(fd);
  close(fd);
  EXPECT_TRUE(absl::StrContains(answer, "path=/six")) << answer;
}

}  // namespace
}  // namespace latentd::server
