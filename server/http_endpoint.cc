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

bool WouldBlock() { return errno == EAGAIN || errno == EWOULDBLOCK; }

// How long a connection whose answer went out is drained before it is closed (the kDraining
// phase of a Connection below), and how much is read and dropped at most.
constexpr absl::Duration kDrainTime = absl::Milliseconds(500);
constexpr size_t kMaxDrainBytes = size_t{1} << 20;

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
    // Non-blocking: the serving thread accepts until none is left.
    fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, a->ai_protocol);
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

// One client's connection, from accept to close. Every connection moves through the phases in
// order, each with its own deadline, so that a slow client holds back only itself:
//   kReading  until the blank line that ends the headers (or 408 at read_timeout, 431 past
//             max_request_bytes, 400 when the head does not parse); then the answer is made;
//   kWriting  until the answer has gone out (or write_timeout: the connection is dropped);
//   kDraining the sending side is shut and what the client still sends is read and dropped
//             until it closes, kDrainTime and kMaxDrainBytes at most. Closing a socket with
//             unread input makes the kernel reset the connection, and a client that has not
//             yet read its answer would lose it (a request cut short at max_request_bytes
//             leaves input behind).
struct HttpEndpoint::Connection {
  enum class Phase { kReading, kWriting, kDraining, kClosed };

  explicit Connection(int fd_in) : fd(fd_in) {}
  ~Connection() { close(fd); }
  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;

  const int fd;
  Phase phase = Phase::kReading;
  absl::Time deadline;
  std::string received;  // kReading: the request so far
  std::string answer;    // kWriting: the serialized response
  size_t sent = 0;
  size_t drained = 0;
};

void HttpEndpoint::Serve() {
  std::vector<std::unique_ptr<Connection>> connections;
  std::vector<pollfd> fds;
  for (;;) {
    const bool accepting = connections.size() < options_.max_connections;
    fds.assign(
        {{wake_read_fd_, POLLIN, 0}, {listen_fd_, static_cast<short>(accepting ? POLLIN : 0), 0}});
    absl::Time next_deadline = absl::InfiniteFuture();
    for (const auto& c : connections) {
      const bool writing = c->phase == Connection::Phase::kWriting;
      fds.push_back({c->fd, static_cast<short>(writing ? POLLOUT : POLLIN), 0});
      next_deadline = std::min(next_deadline, c->deadline);
    }
    const int timeout = next_deadline == absl::InfiniteFuture()
                            ? -1
                            : std::max(1, MillisecondsUntil(next_deadline));
    if (poll(fds.data(), fds.size(), timeout) < 0) {
      if (errno == EINTR) continue;
      return;
    }
    if (fds[0].revents != 0) return;  // Stop(): the connections close with the vector
    for (size_t i = 0; i < connections.size(); ++i) {
      Connection* c = connections[i].get();
      if (fds[i + 2].revents != 0) Advance(c);
      if (c->phase != Connection::Phase::kClosed && absl::Now() >= c->deadline) Expire(c);
    }
    connections.erase(std::remove_if(connections.begin(), connections.end(),
                                     [](const std::unique_ptr<Connection>& c) {
                                       return c->phase == Connection::Phase::kClosed;
                                     }),
                      connections.end());
    while ((fds[1].revents & POLLIN) != 0 && connections.size() < options_.max_connections) {
      const int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
      if (fd < 0) break;  // none left (or the client gave up, or out of descriptors)
      connections.push_back(std::make_unique<Connection>(fd));
      connections.back()->deadline = absl::Now() + options_.read_timeout;
      Advance(connections.back().get());  // the request may be there already
    }
  }
}

void HttpEndpoint::Advance(Connection* c) {
  char buffer[4096];
  switch (c->phase) {
    case Connection::Phase::kReading:
      for (;;) {
        const ssize_t n = recv(c->fd, buffer, sizeof(buffer), 0);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0 && WouldBlock()) break;
        if (n <= 0) {  // the client went away (or reset) before its request was complete
          c->phase = Connection::Phase::kClosed;
          return;
        }
        c->received.append(buffer, static_cast<size_t>(n));
        if (c->received.find("\r\n\r\n") != std::string::npos) {
          Answer(c);
          return;
        }
        if (c->received.size() > options_.max_request_bytes) {
          SendAnswer(c,
                     PlainAnswer(431, absl::StrCat("request line and headers exceed ",
                                                   options_.max_request_bytes, " bytes")),
                     /*with_body=*/true);
          return;
        }
      }
      return;
    case Connection::Phase::kWriting:
      while (c->sent < c->answer.size()) {
        const ssize_t n =
            send(c->fd, c->answer.data() + c->sent, c->answer.size() - c->sent, MSG_NOSIGNAL);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0 && WouldBlock()) return;
        if (n < 0) {  // the client went away without its answer
          c->phase = Connection::Phase::kClosed;
          return;
        }
        c->sent += static_cast<size_t>(n);
      }
      shutdown(c->fd, SHUT_WR);
      c->phase = Connection::Phase::kDraining;
      c->deadline = absl::Now() + kDrainTime;
      return;
    case Connection::Phase::kDraining:
      for (;;) {
        const ssize_t n = recv(c->fd, buffer, sizeof(buffer), 0);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0 && WouldBlock()) return;
        c->drained += std::max<ssize_t>(n, 0);
        if (n <= 0 || c->drained >= kMaxDrainBytes) {
          c->phase = Connection::Phase::kClosed;
          return;
        }
      }
    case Connection::Phase::kClosed:
      return;
  }
}

void HttpEndpoint::Expire(Connection* c) {
  if (c->phase == Connection::Phase::kReading) {
    SendAnswer(c, PlainAnswer(408, "request not complete in time"), /*with_body=*/true);
  } else {
    c->phase = Connection::Phase::kClosed;  // a client that does not read, or does not close
  }
}

void HttpEndpoint::Answer(Connection* c) {
  HttpRequest request;
  if (!ParseHead(c->received, &request)) {
    SendAnswer(c, PlainAnswer(400, "malformed HTTP request"), /*with_body=*/true);
    return;
  }
  // HEAD is answered as the GET would be, without its body.
  const bool head = request.method == "HEAD";
  if (head) request.method = "GET";
  SendAnswer(c, handler_(request), /*with_body=*/!head);
}

void HttpEndpoint::SendAnswer(Connection* c, const HttpResponse& response, bool with_body) {
  c->received.clear();
  c->answer = SerializeResponse(response, with_body);
  c->phase = Connection::Phase::kWriting;
  c->deadline = absl::Now() + options_.write_timeout;
  Advance(c);  // most answers fit the socket's buffer at once
}

}  // namespace latentd::server
