#include "http/metrics_endpoint.h"

#include <arpa/inet.h>
#include <netinet/in.h>

#include <charconv>
#include <cstring>
#include <stdexcept>


namespace esi {

namespace {

std::string response(std::string_view status, std::string_view type, std::string_view body,
                     std::string_view extra = {}) {
  std::string out = "HTTP/1.1 ";
  out += status;
  out += "\r\nContent-Type: ";
  out += type;
  out += "\r\nContent-Length: " + std::to_string(body.size());
  out += "\r\nConnection: close\r\n";
  out += extra;
  out += "\r\n";
  out += body;
  return out;
}

std::string plain(std::string_view status, std::string_view body, std::string_view extra = {}) {
  return response(status, "text/plain; charset=utf-8", body, extra);
}

}  // namespace

ListenAddress parseListenAddress(std::string_view text, bool allowPortZero) {
  const auto bad = [&](std::string_view why) {
    return std::invalid_argument("metrics address \"" + std::string(text) + "\": " +
                                 std::string(why));
  };
  const size_t colon = text.rfind(':');
  if (colon == std::string_view::npos || colon + 1 == text.size()) {
    throw bad("ADDRESS:PORT please, e.g. 127.0.0.1:9145");
  }
  std::string_view host = text.substr(0, colon);
  const std::string_view portText = text.substr(colon + 1);
  unsigned port = 0;
  const auto [end, error] =
      std::from_chars(portText.data(), portText.data() + portText.size(), port);
  if (error != std::errc() || end != portText.data() + portText.size() || port > 65535 ||
      (port == 0 && !allowPortZero)) {
    throw bad("the port must be a number from 1 to 65535");
  }
  ListenAddress out;
  out.text = text;
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    const std::string literal(host.substr(1, host.size() - 2));
    auto* v6 = reinterpret_cast<sockaddr_in6*>(&out.address);
    if (uv_ip6_addr(literal.c_str(), static_cast<int>(port), v6) != 0) {
      throw bad("not a numeric IPv6 address");
    }
    return out;
  }
  const std::string literal(host);
  auto* v4 = reinterpret_cast<sockaddr_in*>(&out.address);
  in_addr probe{};
  if (inet_pton(AF_INET, literal.c_str(), &probe) != 1 ||
      uv_ip4_addr(literal.c_str(), static_cast<int>(port), v4) != 0) {
    throw bad("not a numeric IPv4 address (IPv6 goes in brackets: [::1]:9145)");
  }
  return out;
}

std::string answerRequest(std::string_view head, const std::function<std::string()>& render) {
  const size_t lineEnd = head.find("\r\n");
  const std::string_view line = head.substr(0, lineEnd);
  const size_t first = line.find(' ');
  const size_t second = first == std::string_view::npos ? first : line.find(' ', first + 1);
  if (second == std::string_view::npos || line.substr(second + 1).substr(0, 7) != "HTTP/1.") {
    return plain("400 Bad Request", "bad request line\n");
  }
  const std::string_view method = line.substr(0, first);
  std::string_view target = line.substr(first + 1, second - first - 1);
  target = target.substr(0, target.find('?'));  // a scraper's parameters change nothing
  if (target != "/metrics") return plain("404 Not Found", "esid serves /metrics only\n");
  if (method != "GET") return plain("405 Method Not Allowed", "GET only\n", "Allow: GET\r\n");
  return response("200 OK", "text/plain; version=0.0.4; charset=utf-8", render());
}

class MetricsEndpoint::Connection {
 public:
  explicit Connection(MetricsEndpoint& owner) : owner_(owner) {
    uv_tcp_init(owner.loop_, &tcp_);
    tcp_.data = this;
    uv_timer_init(owner.loop_, &idle_);
    idle_.data = this;
  }

  uv_stream_t* stream() { return reinterpret_cast<uv_stream_t*>(&tcp_); }

  void start() {
    uv_timer_start(&idle_, onIdle, owner_.idleTimeoutMs_, 0);
    uv_read_start(stream(), onAlloc, onRead);
  }

  // Both handles closed, the owner forgets the connection.
  void close() {
    if (closing_) return;
    closing_ = true;
    uv_timer_stop(&idle_);
    uv_close(reinterpret_cast<uv_handle_t*>(&tcp_), onClosed);
    uv_close(reinterpret_cast<uv_handle_t*>(&idle_), onClosed);
  }

 private:
  static void onAlloc(uv_handle_t* handle, size_t, uv_buf_t* buf) {
    auto* self = static_cast<Connection*>(handle->data);
    buf->base = self->chunk_;
    buf->len = sizeof(self->chunk_);
  }

  static void onRead(uv_stream_t* stream, ssize_t n, const uv_buf_t* buf) {
    auto* self = static_cast<Connection*>(stream->data);
    if (n < 0) {
      self->close();
      return;
    }
    if (self->answered_) return;  // the rest of what it sent, unread
    self->request_.append(buf->base, static_cast<size_t>(n));
    const size_t end = self->request_.find("\r\n\r\n");
    if (end == std::string::npos && self->request_.size() <= kMaxRequestBytes) return;
    self->answered_ = true;
    if (end == std::string::npos || end > kMaxRequestBytes) {
      self->reply(plain("431 Request Header Fields Too Large", "request too large\n"));
    } else {
      self->reply(answerRequest(std::string_view(self->request_).substr(0, end),
                                self->owner_.render_));
    }
  }

  // Writes the answer, then ends the connection as NGINX's lingering close
  // does: the write side first, then reading until the client closes (or
  // the idle timer fires), so that bytes it sent beyond the request do not
  // turn the close into a reset that loses the answer.
  void reply(std::string answer) {
    answer_ = std::move(answer);
    uv_buf_t buf = uv_buf_init(answer_.data(), static_cast<unsigned>(answer_.size()));
    write_.data = this;
    if (uv_write(&write_, stream(), &buf, 1, onWritten) != 0) close();
  }

  static void onWritten(uv_write_t* req, int status) {
    auto* self = static_cast<Connection*>(req->data);
    self->shutdown_.data = self;
    if (status != 0 || uv_shutdown(&self->shutdown_, self->stream(), onShutdown) != 0) {
      self->close();
    }
  }

  static void onShutdown(uv_shutdown_t*, int) {}

  static void onIdle(uv_timer_t* timer) { static_cast<Connection*>(timer->data)->close(); }

  static void onClosed(uv_handle_t* handle) {
    auto* self = static_cast<Connection*>(handle->data);
    if (++self->closed_ == 2) self->owner_.remove(self);
  }

  MetricsEndpoint& owner_;
  uv_tcp_t tcp_;
  uv_timer_t idle_;
  uv_write_t write_;
  uv_shutdown_t shutdown_;
  char chunk_[4096] = {};
  std::string request_;
  std::string answer_;
  bool answered_ = false;
  bool closing_ = false;
  int closed_ = 0;
};

MetricsEndpoint::MetricsEndpoint(uv_loop_t* loop, ListenAddress where,
                                 std::function<std::string()> render, uint64_t idleTimeoutMs)
    : loop_(loop), where_(std::move(where)), render_(std::move(render)),
      idleTimeoutMs_(idleTimeoutMs) {}

MetricsEndpoint::~MetricsEndpoint() = default;

void MetricsEndpoint::listen() {
  listener_ = new uv_tcp_t;
  uv_tcp_init(loop_, listener_);
  listener_->data = this;
  const auto fail = [this](std::string_view what, int rc) {
    uv_close(reinterpret_cast<uv_handle_t*>(listener_),
             [](uv_handle_t* h) { delete reinterpret_cast<uv_tcp_t*>(h); });
    listener_ = nullptr;
    return std::runtime_error("metrics: cannot " + std::string(what) + " " + where_.text + ": " +
                              uv_strerror(rc));
  };
  int rc = uv_tcp_bind(listener_, reinterpret_cast<const sockaddr*>(&where_.address), 0);
  if (rc != 0) throw fail("bind", rc);
  rc = uv_listen(reinterpret_cast<uv_stream_t*>(listener_), 16, onConnection);
  if (rc != 0) throw fail("listen on", rc);
}

uint16_t MetricsEndpoint::port() const {
  if (listener_ == nullptr) return 0;
  sockaddr_storage bound{};
  int length = sizeof(bound);
  if (uv_tcp_getsockname(listener_, reinterpret_cast<sockaddr*>(&bound), &length) != 0) return 0;
  if (bound.ss_family == AF_INET6) {
    return ntohs(reinterpret_cast<const sockaddr_in6*>(&bound)->sin6_port);
  }
  return ntohs(reinterpret_cast<const sockaddr_in*>(&bound)->sin_port);
}

void MetricsEndpoint::onConnection(uv_stream_t* listener, int status) {
  auto* self = static_cast<MetricsEndpoint*>(listener->data);
  if (status != 0) return;
  auto connection = std::make_unique<Connection>(*self);
  if (uv_accept(listener, connection->stream()) != 0 ||
      self->connections_.size() >= kMaxConnections) {
    // Too many scrapers at once: this one is closed unanswered.
    self->connections_.push_back(std::move(connection));
    self->connections_.back()->close();
    return;
  }
  self->connections_.push_back(std::move(connection));
  self->connections_.back()->start();
}

void MetricsEndpoint::remove(Connection* connection) {
  connections_.remove_if([connection](const auto& c) { return c.get() == connection; });
}

void MetricsEndpoint::close() {
  if (listener_ != nullptr) {
    uv_close(reinterpret_cast<uv_handle_t*>(listener_),
             [](uv_handle_t* h) { delete reinterpret_cast<uv_tcp_t*>(h); });
    listener_ = nullptr;
  }
  for (auto& connection : connections_) connection->close();
}

}  // namespace esi
