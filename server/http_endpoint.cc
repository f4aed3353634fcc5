#include "server/http_endpoint.h"

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace latentd::server {
namespace {

// Milliseconds left until `deadline` for poll(), at least 0.
int MillisecondsUntil(absl::Time deadline) {
  const int64_t ms = absl::ToInt64Milliseconds(deadline - absl::Now());
  return static_cast<int>(std::max<int64_t>(0, std::min<int64_t>(ms, 1 << 30)));
}

// Waits until `fd` is ready for `events` or the deadline passes; false on the latter (or an
// error of the socket).
bool WaitReady(int fd, short events, absl::Time deadline) {
  for (;;) {
    pollfd p{fd, events, 0};
    const int n = poll(&p, 1, MillisecondsUntil(deadline));
    if (n > 0) return (p.revents & (events | POLLHUP | POLLERR)) != 0;
    if (n == 0) return false;
    if (errno != EINTR) return false;
  }
}

// Sends all of `data` before the deadline; false when the client stops reading or goes away.
bool SendAll(int fd, absl::string_view data, absl::Time deadline) {
  while (!data.empty()) {
    if (!WaitReady(fd, POLLOUT, deadline)) return false;
    const ssize_t n = send(fd, data.data(), data.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n < 0) {
      if (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK) continue;
      return false;
    }
    data.remove_prefix(static_cast<size_t>(n));
  }
  return true;
}

enum class ReadOutcome { kComplete, kTooLarge, kTimedOut, kClosed };

// Reads until the blank line that ends the headers; `head` gets everything read.
ReadOutcome ReadHead(int fd, size_t max_bytes, absl::Time deadline, std::string* head) {
  char buffer[4096];
  for (;;) {
    if (head->find("\r\n\r\n") != std::string::npos) return ReadOutcome::kComplete;
    if (head->size() > max_bytes) return ReadOutcome::kTooLarge;
    if (!WaitReady(fd, POLLIN, deadline)) return ReadOutcome::kTimedOut;
    const ssize_t n = recv(fd, buffer, sizeof(buffer), MSG_DONTWAIT);
    if (n < 0) {
      if (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK) continue;
      return ReadOutcome::kClosed;
    }
    if (n == 0) return ReadOutcome::kClosed;
    head->append(buffer, static_cast<size_t>(n));
  }
}

// Parses the request line and headers (`head` ends with the blank line); false when malformed.
bool ParseHead(absl::string_view head, HttpRequest* request) {
  head = head.substr(0, head.find("\r\n\r\n"));
  std::vector<absl::string_view> lines = absl::StrSplit(head, "\r\n");
  std::vector<absl::string_view> parts = absl::StrSplit(lines[0], ' ');
  if (parts.size() != 3 || parts[0].empty() || parts[1].empty() ||
      !absl::StartsWith(parts[2], "HTTP/1.")) {
    return false;
  }
  request->method = std::string(parts[0]);
  absl::string_view target = parts[1];
  if (const size_t q = target.find('?'); q != absl::string_view::npos) {
    request->query = std::string(target.substr(q + 1));
    target = target.substr(0, q);
  }
  request->path = std::string(target);
  for (size_t i = 1; i < lines.size(); ++i) {
    const size_t colon = lines[i].find(':');
    if (colon == absl::string_view::npos || colon == 0) return false;
    request->headers[absl::AsciiStrToLower(lines[i].substr(0, colon))] =
        std::string(absl::StripAsciiWhitespace(lines[i].substr(colon + 1)));
  }
  return true;
}

std::string SerializeResponse(const HttpResponse& response, bool with_body) {
  std::string out =
      absl::StrCat("HTTP/1.1 ", response.status, " ", HttpReasonPhrase(response.status),
                   "\r\nContent-Type: ", response.content_type,
                   "\r\nContent-Length: ", response.body.size(), "\r\nConnection: close\r\n");
  for (const auto& [name, value] : response.headers)
    absl::StrAppend(&out, name, ": ", value, "\r\n");
  out += "\r\n";
  if (with_body) out += response.body;
  return out;
}

// Closes a connection whose answer was sent. Closing a socket with unread input makes the kernel
// reset the connection, and a client that has not yet read the answer loses it (a request cut
// short at max_request_bytes leaves input behind); so the sending side is shut first and what the
// client still sends is read and dropped until it closes, for a short while at most.
void CloseGracefully(int fd) {
  shutdown(fd, SHUT_WR);
  const absl::Time deadline = absl::Now() + absl::Milliseconds(500);
  char buffer[4096];
  size_t drained = 0;
  while (drained < (size_t{1} << 20) && WaitReady(fd, POLLIN, deadline)) {
    const ssize_t n = recv(fd, buffer, sizeof(buffer), MSG_DONTWAIT);
    if (n < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK)) continue;
    if (n <= 0) break;
    drained += static_cast<size_t>(n);
  }
  close(fd);
}

HttpResponse PlainAnswer(int status, absl::string_view text) {
  HttpResponse response;
  response.status = status;
  response.body = absl::StrCat(text, "\n");
  return response;
}

}  // namespace

std::string HttpRequest::Header(const std::string& lower_case_name) const {
  auto it = headers.find(lower_case_name);
  return it == headers.end() ? std::string() : it->second;
}

absl::string_view HttpReasonPhrase(int status) {
  switch (status) {
    case 200:
      return "OK";
    case 204:
      return "No Content";
    case 400:
      return "Bad Request";
    case 401:
      return "Unauthorized";
    case 403:
      return "Forbidden";
    case 404:
      return "Not Found";
    case 405:
      return "Method Not Allowed";
    case 408:
      return "Request Timeout";
    case 431:
      return "Request Header Fields Too Large";
    case 500:
      return "Internal Server Error";
    case 503:
      return "Service Unavailable";
    default:
      return "Unknown";
  }
}

absl::StatusOr<std::unique_ptr<HttpEndpoint>> HttpEndpoint::Start(const std::string& listen,
                                                                  Handler handler,
                                                                  HttpEndpointOptions options) {
  const size_t colon = listen.rfind(':');
  if (colon == std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat("\"", listen, "\" is not host:port"));
  }
  std::string host = listen.substr(0, colon);
  const std::string port_text = listen.substr(colon + 1);
  int port_number = 0;
  if (!absl::SimpleAtoi(port_text, &port_number) || port_number < 0 || port_number > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("\"", listen, "\": bad port \"", port_text, "\""));
  }
  if (absl::StartsWith(host, "[") && absl::EndsWith(host, "]")) {
    host = host.substr(1, host.size() - 2);
  }
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* found = nullptr;
  if (const int rc =
          getaddrinfo(host.empty() ? nullptr : host.c_str(), port_text.c_str(), &hints, &found);
      rc != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("\"", listen, "\": cannot resolve \"", host, "\": ", gai_strerror(rc)));
  }
  int fd = -1;
  std::string last_error = "no address";
  for (addrinfo* a = found; a != nullptr; a = a->ai_next) {
    fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) {
      last_error = std::strerror(errno);
      continue;
    }
    const int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (bind(fd, a->ai_addr, a->ai_addrlen) == 0 && ::listen(fd, 64) == 0) break;
    last_error = std::strerror(errno);
    close(fd);
    fd = -1;
  }
  freeaddrinfo(found);
  if (fd < 0) {
    return absl::UnavailableError(absl::StrCat("cannot listen on ", listen, ": ", last_error));
  }
  sockaddr_storage bound{};
  socklen_t bound_size = sizeof(bound);
  getsockname(fd, reinterpret_cast<sockaddr*>(&bound), &bound_size);
  const int port =
      ntohs(bound.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port
                                        : reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
  int wake[2];
  if (pipe2(wake, O_CLOEXEC) != 0) {
    const std::string error = std::strerror(errno);
    close(fd);
    return absl::UnavailableError(absl::StrCat("cannot make a pipe: ", error));
  }
  std::unique_ptr<HttpEndpoint> endpoint(
      new HttpEndpoint(fd, wake[0], wake[1], port, std::move(handler), options));
  endpoint->thread_ = std::thread([e = endpoint.get()] { e->Serve(); });
  return endpoint;
}

HttpEndpoint::HttpEndpoint(int listen_fd, int wake_read_fd, int wake_write_fd, int port,
                           Handler handler, HttpEndpointOptions options)
    : listen_fd_(listen_fd),
      wake_read_fd_(wake_read_fd),
      wake_write_fd_(wake_write_fd),
      port_(port),
      handler_(std::move(handler)),
      options_(options) {}

HttpEndpoint::~HttpEndpoint() { Stop(); }

void HttpEndpoint::Stop() {
  if (stopped_.exchange(true)) return;
  close(wake_write_fd_);  // the serving thread's poll sees the pipe's end
  if (thread_.joinable()) thread_.join();
  close(wake_read_fd_);
  close(listen_fd_);
}

void HttpEndpoint::Serve() {
  for (;;) {
    pollfd fds[2] = {{listen_fd_, POLLIN, 0}, {wake_read_fd_, POLLIN, 0}};
    if (poll(fds, 2, -1) < 0) {
      if (errno == EINTR) continue;
      return;
    }
    if (fds[1].revents != 0) return;  // Stop()
    if ((fds[0].revents & POLLIN) == 0) continue;
    const int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) continue;  // the client gave up between poll and accept, or out of descriptors
    ServeConnection(fd);
    CloseGracefully(fd);
  }
}

void HttpEndpoint::ServeConnection(int fd) {
  std::string head;
  const ReadOutcome outcome =
      ReadHead(fd, options_.max_request_bytes, absl::Now() + options_.read_timeout, &head);
  HttpRequest request;
  HttpResponse response;
  bool with_body = true;
  switch (outcome) {
    case ReadOutcome::kClosed:
      return;
    case ReadOutcome::kTimedOut:
      response = PlainAnswer(408, "request not complete in time");
      break;
    case ReadOutcome::kTooLarge:
      response = PlainAnswer(431, absl::StrCat("request line and headers exceed ",
                                               options_.max_request_bytes, " bytes"));
      break;
    case ReadOutcome::kComplete:
      if (!ParseHead(head, &request)) {
        response = PlainAnswer(400, "malformed HTTP request");
        break;
      }
      if (request.method == "HEAD") {
        // Answered as the GET would be, without its body.
        request.method = "GET";
        with_body = false;
        response = handler_(request);
      } else {
        response = handler_(request);
      }
      break;
  }
  SendAll(fd, SerializeResponse(response, with_body), absl::Now() + options_.write_timeout);
}

}  // namespace latentd::server
