// A minimal HTTP/1.1 endpoint beside the gRPC port, for what speaks HTTP and not gRPC:
// Prometheus scrapes (GET /metrics) and liveness probes (GET /healthz).
//
// Contract:
//  * Every request is handed to the handler, whatever its method or path; the handler decides
//    (404, 405...). A request the endpoint cannot parse gets 400, one whose line and headers pass
//    max_request_bytes 431, one not complete within read_timeout 408; the handler sees none of
//    them. A request body is never read (GET and HEAD carry none).
//  * One request per connection: every response says `Connection: close` and carries its
//    Content-Length. HEAD gets the headers of the handler's GET answer and no body.
//  * Connections are served side by side by one thread of the endpoint's own, each with its own
//    deadlines, so a client that sends slowly or does not read its answer holds back no one
//    else: a liveness probe is answered while a stalled scraper waits out its read_timeout.
//    Handlers run on that thread, one at a time, so they must be quick (a scrape reads
//    in-memory state). Past max_connections open at once, new ones wait in the listen backlog.
//  * Stop() (or the destructor) closes the listening socket and every open connection (an
//    answer being sent is cut short) and joins the thread.
#ifndef LATENTD_SERVER_HTTP_ENDPOINT_H_
#define LATENTD_SERVER_HTTP_ENDPOINT_H_

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace latentd::server {

struct HttpRequest {
  std::string method;  // as sent: "GET", "HEAD", ...
  std::string path;    // the target up to '?', e.g. "/metrics"
  std::string query;   // after '?', undecoded; empty when there is none
  // Header names lower-cased, values with surrounding blanks removed; a repeated header keeps
  // its last value.
  std::map<std::string, std::string> headers;

  // The value of header `lower_case_name`, or "" when absent.
  std::string Header(const std::string& lower_case_name) const;
};

struct HttpResponse {
  int status = 200;
  std::string content_type = "text/plain; charset=utf-8";
  // Further headers (name, value), e.g. WWW-Authenticate on a 401.
  std::vector<std::pair<std::string, std::string>> headers;
  std::string body;
};

struct HttpEndpointOptions {
  // Longest a client may take to send its request line and headers. Default 5 s.
  absl::Duration read_timeout = absl::Seconds(5);
  // Longest a client may take to read the answer. Default 10 s.
  absl::Duration write_timeout = absl::Seconds(10);
  // Largest request line + headers accepted. Default 16 KiB.
  size_t max_request_bytes = 16 << 10;
  // Connections open at once (reading, answering or closing); more wait to be accepted.
  // Default 64.
  size_t max_connections = 64;
};

class HttpEndpoint {
 public:
  using Handler = std::function<HttpResponse(const HttpRequest&)>;

  // Listens on `listen` ("host:port", "[v6]:port"; port 0 picks a free port, see port()) and
  // serves on a thread of its own until Stop(). INVALID_ARGUMENT for an address that does not
  // parse or resolve, UNAVAILABLE when it cannot be bound.
  static absl::StatusOr<std::unique_ptr<HttpEndpoint>> Start(
      const std::string& listen, Handler handler,
      HttpEndpointOptions options = HttpEndpointOptions());

  ~HttpEndpoint();  // calls Stop()
  HttpEndpoint(const HttpEndpoint&) = delete;
  HttpEndpoint& operator=(const HttpEndpoint&) = delete;

  // The port bound.
  int port() const { return port_; }
  // Stops accepting, finishes the request in progress and joins the thread. Idempotent.
  void Stop();

 private:
  HttpEndpoint(int listen_fd, int wake_read_fd, int wake_write_fd, int port, Handler handler,
               HttpEndpointOptions options);
  struct Connection;

  // The serving thread: polls the listening socket and every connection, moving each through
  // its phases as its socket allows or its deadline passes.
  void Serve();
  // Reads, writes or drains what `c`'s socket allows now.
  void Advance(Connection* c);
  // `c`'s deadline has passed: 408 for a request not complete, else the connection is closed.
  void Expire(Connection* c);
  // Parses `c`'s complete request head and answers it (400 when it does not parse).
  void Answer(Connection* c);
  // Starts sending `response` on `c`.
  void SendAnswer(Connection* c, const HttpResponse& response, bool with_body);

  const int listen_fd_;
  // A pipe whose write end Stop() closes, waking the poll that waits for connections.
  const int wake_read_fd_;
  int wake_write_fd_;
  const int port_;
  const Handler handler_;
  const HttpEndpointOptions options_;
  std::thread thread_;
  std::atomic<bool> stopped_{false};
};

// The reason phrase of an HTTP status code ("OK", "Not Found"...), "Unknown" for others.
absl::string_view HttpReasonPhrase(int status);

}  // namespace latentd::server

#endif  // LATENTD_SERVER_HTTP_ENDPOINT_H_
