// esid's Prometheus endpoint: a small HTTP/1.1 server on esid's event loop
// answering GET /metrics with what render() returns, 404 for any other
// path.  Nothing blocks: requests are read and answered by libuv, a request
// larger than kMaxRequestBytes is refused, a connection idle for
// kIdleTimeoutMs is closed, and every answer closes its connection.

#pragma once

#include <sys/socket.h>
#include <uv.h>

#include <cstdint>
#include <functional>
#include <list>
#include <memory>
#include <string>
#include <string_view>

namespace esi {

// "127.0.0.1:9145", "[::1]:9145", "0.0.0.0:9145": a numeric address and a
// port.  Throws std::invalid_argument saying what is wrong.
struct ListenAddress {
  sockaddr_storage address{};
  std::string text;  // as given
};
ListenAddress parseListenAddress(std::string_view text, bool allowPortZero = false);

class MetricsEndpoint {
 public:
  static constexpr size_t kMaxRequestBytes = 8192;
  static constexpr uint64_t kIdleTimeoutMs = 10000;
  static constexpr size_t kMaxConnections = 64;

  MetricsEndpoint(uv_loop_t* loop, ListenAddress where, std::function<std::string()> render,
                  uint64_t idleTimeoutMs = kIdleTimeoutMs);
  ~MetricsEndpoint();
  MetricsEndpoint(const MetricsEndpoint&) = delete;
  MetricsEndpoint& operator=(const MetricsEndpoint&) = delete;

  // Throws std::runtime_error when the address cannot be had.
  void listen();
  // Stops listening and ends every connection.
  void close();

  // The port listened on (the one the kernel chose for port 0).
  uint16_t port() const;
  const std::string& describe() const { return where_.text; }

 private:
  class Connection;
  static void onConnection(uv_stream_t* listener, int status);
  void remove(Connection* connection);

  uv_loop_t* loop_;
  ListenAddress where_;
  std::function<std::string()> render_;
  uint64_t idleTimeoutMs_;
  uv_tcp_t* listener_ = nullptr;
  std::list<std::unique_ptr<Connection>> connections_;
};

// The answer to one request's head (request line and headers, without the
// blank line): a whole HTTP/1.1 response.  render is called for GET
// /metrics only.
std::string answerRequest(std::string_view head, const std::function<std::string()>& render);

}  // namespace esi
