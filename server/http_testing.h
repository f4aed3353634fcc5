// A raw HTTP client for tests of the HTTP endpoint and the daemon's routes on loopback: it sends
// bytes as given (malformed ones included) and reads the whole answer.
#ifndef LATENTD_SERVER_HTTP_TESTING_H_
#define LATENTD_SERVER_HTTP_TESTING_H_

#include <string>

namespace latentd::server {

// Connects to 127.0.0.1:port; -1 when refused.
int ConnectLoopback(int port);

// Everything `fd` receives until the peer closes.
std::string ReadToEnd(int fd);

// Sends `request` as is on a new connection and returns the whole answer (the endpoint closes
// the connection after it); "<refused>" when nothing listens.
std::string Exchange(int port, const std::string& request);

}  // namespace latentd::server

#endif  // LATENTD_SERVER_HTTP_TESTING_H_
