#include "fleet/redis_link.h"

#include <hiredis/hiredis.h>
#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/ssl.h>

#include <algorithm>
#include <charconv>
#include <memory>
#include <stdexcept>
#include <utility>

#include <spdlog/spdlog.h>

#include "fleet/redis_tls.h"

namespace esi {

namespace {

constexpr uint64_t kTickMs = 100;
constexpr uint64_t kFirstBackoffMs = 100;
constexpr uint64_t kMaxBackoffMs = 5000;
// The TLS session's buffers toward and from the socket.
constexpr size_t kTlsBuffer = size_t{64} * 1024;
constexpr size_t kReadBuffer = size_t{64} * 1024;

int parsePart(std::string_view text, int low, int high, std::string_view what) {
  int value = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || end != text.data() + text.size() || text.empty() || value < low ||
      value > high) {
    throw std::invalid_argument(std::string(what) + " \"" + std::string(text) + "\" is not a number from " +
                                std::to_string(low) + " to " + std::to_string(high));
  }
  return value;
}

}  // namespace

void closeTimer(uv_timer_t* timer) {
  uv_close(reinterpret_cast<uv_handle_t*>(timer),
           [](uv_handle_t* h) { delete reinterpret_cast<uv_timer_t*>(h); });
}

std::string RedisAddress::text() const {
  const bool v6 = host.find(':') != std::string::npos;
  return (tls ? "rediss://" : "redis://") + (v6 ? "[" + host + "]" : host) + ":" + std::to_string(port) + "/" +
         std::to_string(db);
}

RedisAddress parseRedisUrl(std::string_view url) {
  constexpr std::string_view kPlain = "redis://";
  constexpr std::string_view kTls = "rediss://";
  const bool tls = url.substr(0, kTls.size()) == kTls;
  if (!tls && url.substr(0, kPlain.size()) != kPlain) {
    throw std::invalid_argument("fleet \"" + std::string(url) +
                                "\" is not a redis://host:port/db or rediss:// URL");
  }
  std::string_view rest = url.substr((tls ? kTls : kPlain).size());
  if (rest.find('@') != std::string_view::npos) {
    throw std::invalid_argument("the fleet URL carries credentials: write them in the settings "
                                "file as fleet_user and fleet_password, never in the URL");
  }
  RedisAddress address;
  address.tls = tls;
  const size_t slash = rest.find('/');
  std::string_view hostPort = rest.substr(0, slash);
  if (slash != std::string_view::npos) {
    const std::string_view db = rest.substr(slash + 1);
    if (!db.empty()) address.db = parsePart(db, 0, 1 << 20, "database");
  }
  std::string_view port;
  if (!hostPort.empty() && hostPort.front() == '[') {
    const size_t close = hostPort.find(']');
    if (close == std::string_view::npos) throw std::invalid_argument("fleet URL: unclosed [");
    address.host = hostPort.substr(1, close - 1);
    const std::string_view after = hostPort.substr(close + 1);
    if (!after.empty()) {
      if (after.front() != ':') throw std::invalid_argument("fleet URL: junk after ]");
      port = after.substr(1);
    }
  } else {
    const size_t colon = hostPort.find(':');
    address.host = hostPort.substr(0, colon);
    if (colon != std::string_view::npos) port = hostPort.substr(colon + 1);
  }
  if (address.host.empty()) throw std::invalid_argument("fleet URL: no host");
  if (!port.empty()) address.port = parsePart(port, 1, 65535, "port");
  return address;
}

// One connection: its socket, its TLS session (rediss://), hiredis' reader
// of Redis' answers, and the replies due, in order.  Freed once libuv has
// closed its socket; link is null from the moment the link lets go of it.
struct RedisLink::Wire {
  RedisLink* link;
  uv_getaddrinfo_t resolving;
  uv_connect_t connecting;
  uv_tcp_t tcp;
  bool resolved = false;  // tcp is initialised (and must be closed)
  SSL* ssl = nullptr;
  BIO* network = nullptr;  // the socket's end of the session's BIO pair
  bool tlsUp = false;
  redisReader* reader = redisReaderCreate();
  std::deque<Reply> calls;
  char readBuffer[kReadBuffer]{};  // libuv reads into one buffer at a time
  // Why a write failed: dropped on the next tick, not inside command(),
  // whose caller counts on its reply to come later.
  std::string broken;

  explicit Wire(RedisLink* owner) : link(owner) {}
  ~Wire() {
    if (ssl != nullptr) SSL_free(ssl);  // and the pair's other end with it
    if (network != nullptr) BIO_free(network);
    if (reader != nullptr) redisReaderFree(reader);
  }
  Wire(const Wire&) = delete;
  Wire& operator=(const Wire&) = delete;
};

namespace {

struct Write {
  uv_write_t request;
  std::string bytes;
};

}  // namespace

RedisLink::RedisLink(uv_loop_t* loop, RedisAddress address, std::string name, Handlers handlers)
    : loop_(loop), address_(std::move(address)), name_(std::move(name)),
      handlers_(std::move(handlers)), tick_(new uv_timer_t), retry_(new uv_timer_t) {
  uv_timer_init(loop_, tick_);
  uv_timer_init(loop_, retry_);
  tick_->data = this;
  retry_->data = this;
}

RedisLink::~RedisLink() { stop(); }

void RedisLink::start() {
  if (state_ != State::kIdle) return;
  if (address_.tls) tls_ = std::make_unique<RedisTls>(address_);
  uv_timer_start(tick_, onTick, kTickMs, kTickMs);
  connect();
}

void RedisLink::stop() {
  if (state_ == State::kStopped) return;
  state_ = State::kStopped;
  closeWire(false);
  deadlines_.clear();
  closeTimer(tick_);
  closeTimer(retry_);
}

void RedisLink::connect() {
  state_ = State::kConnecting;
  connectDeadline_ = uv_now(loop_) + kConnectTimeoutMs;
  auto* wire = new Wire(this);
  if (wire->reader == nullptr) {
    delete wire;
    lost("cannot allocate a connection");
    return;
  }
  wire->resolving.data = wire;
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  const std::string port = std::to_string(address_.port);
  if (const int error = uv_getaddrinfo(loop_, &wire->resolving, onResolved, address_.host.c_str(),
                                       port.c_str(), &hints);
      error != 0) {
    delete wire;
    lost(std::string("cannot look ") + address_.host + " up: " + uv_strerror(error));
    return;
  }
  wire_ = wire;
}

void RedisLink::onResolved(uv_getaddrinfo_t* request, int status, addrinfo* found) {
  auto* wire = static_cast<Wire*>(request->data);
  RedisLink* self = wire->link;
  if (self == nullptr) {  // let go of while resolving
    uv_freeaddrinfo(found);
    delete wire;
    return;
  }
  if (status != 0) {
    uv_freeaddrinfo(found);
    self->wire_ = nullptr;  // nothing was sent on it
    delete wire;
    self->lost("cannot look " + self->address_.host + " up: " + uv_strerror(status));
    return;
  }
  uv_tcp_init(self->loop_, &wire->tcp);
  wire->tcp.data = wire;
  wire->resolved = true;
  wire->connecting.data = wire;
  const int error = uv_tcp_connect(&wire->connecting, &wire->tcp, found->ai_addr, onConnected);
  uv_freeaddrinfo(found);
  if (error != 0) {
    self->drop(std::string("cannot connect: ") + uv_strerror(error));
  }
}

void RedisLink::onConnected(uv_connect_t* request, int status) {
  auto* wire = static_cast<Wire*>(request->data);
  RedisLink* self = wire->link;
  if (self == nullptr) return;
  if (status != 0) {
    self->drop(uv_strerror(status));
    return;
  }
  uv_read_start(
      reinterpret_cast<uv_stream_t*>(&wire->tcp),
      [](uv_handle_t* handle, size_t, uv_buf_t* buf) {
        *buf = uv_buf_init(static_cast<Wire*>(handle->data)->readBuffer, kReadBuffer);
      },
      [](uv_stream_t* stream, ssize_t n, const uv_buf_t* buf) {
        RedisLink* link = static_cast<Wire*>(stream->data)->link;
        if (link == nullptr || n == 0) return;
        if (n < 0) {
          std::string why = n == UV_EOF ? "Redis closed the connection" : uv_strerror(static_cast<int>(n));
          // A TLS server resets a connection that does not begin with a
          // handshake.
          if (link->state_ == State::kHandshake && !link->tls_) {
            why += " before answering a command: if that port speaks TLS, write rediss:// in fleet";
          } else if (link->state_ == State::kConnecting && link->tls_) {
            why = RedisTls::failure(link->wire_->ssl);
          }
          link->drop(why);
          return;
        }
        link->received(buf->base, static_cast<size_t>(n));
      });
  if (!self->tls_) {
    self->handshake();
    return;
  }
  BIO* inner = nullptr;
  wire->ssl = self->tls_->session();
  if (wire->ssl == nullptr || BIO_new_bio_pair(&inner, kTlsBuffer, &wire->network, kTlsBuffer) != 1) {
    self->drop("cannot set a TLS session up");
    return;
  }
  SSL_set_bio(wire->ssl, inner, inner);
  self->advanceTls();
}

void RedisLink::advanceTls() {
  Wire* wire = wire_;
  ERR_clear_error();
  const int done = SSL_do_handshake(wire->ssl);
  if (done != 1 && SSL_get_error(wire->ssl, done) != SSL_ERROR_WANT_READ) {
    flushTls();  // the alert, for the server's log
    drop(RedisTls::failure(wire->ssl));
    return;
  }
  flushTls();
  if (done == 1 && wire_ == wire) {
    wire->tlsUp = true;
    handshake();
  }
}

void RedisLink::flushTls() {
  std::string out;
  char chunk[16 * 1024];
  int n;
  while ((n = BIO_read(wire_->network, chunk, sizeof chunk)) > 0) out.append(chunk, static_cast<size_t>(n));
  if (!out.empty()) write(std::move(out));
}

void RedisLink::write(std::string bytes) {
  auto* request = new Write{{}, std::move(bytes)};
  uv_buf_t buf = uv_buf_init(request->bytes.data(), static_cast<unsigned>(request->bytes.size()));
  if (uv_write(&request->request, reinterpret_cast<uv_stream_t*>(&wire_->tcp), &buf, 1,
               [](uv_write_t* r, int) { delete reinterpret_cast<Write*>(r); }) != 0) {
    delete request;
    if (wire_->broken.empty()) wire_->broken = "cannot write to the connection";
  }
}

void RedisLink::received(const char* bytes, size_t length) {
  Wire* wire = wire_;
  if (!tls_) {
    redisReaderFeed(wire->reader, bytes, length);
    deliver();
    return;
  }
  while (length > 0 && wire_ == wire) {
    const int taken = BIO_write(wire->network, bytes, static_cast<int>(std::min(length, kTlsBuffer)));
    if (taken <= 0) {
      drop("TLS: more bytes than the session can take");
      return;
    }
    bytes += taken;
    length -= static_cast<size_t>(taken);
    if (!wire->tlsUp) {
      advanceTls();
      continue;
    }
    char plain[16 * 1024];
    int n;
    ERR_clear_error();
    while ((n = SSL_read(wire->ssl, plain, sizeof plain)) > 0) {
      redisReaderFeed(wire->reader, plain, static_cast<size_t>(n));
    }
    const int error = SSL_get_error(wire->ssl, n);
    if (error != SSL_ERROR_WANT_READ) {
      drop(error == SSL_ERROR_ZERO_RETURN ? "Redis closed the TLS session"
                                          : RedisTls::failure(wire->ssl));
      return;
    }
    flushTls();  // a key update, a session ticket's answer
    deliver();
  }
}

void RedisLink::deliver() {
  Wire* wire = wire_;
  while (wire_ == wire) {
    void* reply = nullptr;
    if (redisReaderGetReply(wire->reader, &reply) != REDIS_OK) {
      drop("Redis answered what is not RESP: " + std::string(wire->reader->errstr));
      return;
    }
    if (reply == nullptr) return;
    std::unique_ptr<redisReply, void (*)(void*)> owned(static_cast<redisReply*>(reply), freeReplyObject);
    if (wire->calls.empty()) {
      drop("Redis answered a command it was not sent");
      return;
    }
    Reply call = std::move(wire->calls.front());
    wire->calls.pop_front();
    if (!deadlines_.empty()) deadlines_.pop_front();
    call(owned.get());
  }
}

void RedisLink::closeWire(bool answerCalls) {
  Wire* wire = std::exchange(wire_, nullptr);
  if (wire == nullptr) return;
  wire->link = nullptr;
  std::deque<Reply> calls = std::move(wire->calls);
  if (wire->resolved) {
    uv_close(reinterpret_cast<uv_handle_t*>(&wire->tcp),
             [](uv_handle_t* h) { delete static_cast<Wire*>(h->data); });
  } else {
    uv_cancel(reinterpret_cast<uv_req_t*>(&wire->resolving));  // onResolved frees it
  }
  if (answerCalls) {
    for (Reply& call : calls) call(nullptr);
  }
}

void RedisLink::handshake() {
  state_ = State::kHandshake;
  std::vector<std::vector<std::string>> steps;
  if (!address_.password.empty()) {
    if (address_.user.empty()) {
      steps.push_back({"AUTH", address_.password});
    } else {
      steps.push_back({"AUTH", address_.user, address_.password});
    }
  }
  if (address_.db != 0) steps.push_back({"SELECT", std::to_string(address_.db)});
  // Ready only once Redis has answered on this connection: the kernel
  // completes a TCP connection to a Redis that hangs (stopped, swapping),
  // and one taken for live would be handed purges (answered "published")
  // and counted connected until its first command timed out.  And only on
  // a primary: a replica (a failover demoted it) refuses every write.
  steps.push_back({"ROLE"});
  for (const std::vector<std::string>& step : steps) {
    const std::string what = step[0];
    send(step,
         [this, what](const redisReply* reply) {
           if (reply == nullptr || state_ != State::kHandshake) return;
           if (what == "ROLE") {
             roleAnswered(reply);
           } else if (reply->type == REDIS_REPLY_ERROR) {
             drop(what + " refused: " + std::string(reply->str, reply->len));
           }
         },
         kCommandTimeoutMs);
  }
}

void RedisLink::roleAnswered(const redisReply* reply) {
  // An ACL may deny ROLE (it is @admin): then a refused write tells.
  if (reply->type == REDIS_REPLY_ERROR || reply->type != REDIS_REPLY_ARRAY ||
      reply->elements == 0 || reply->element[0]->type != REDIS_REPLY_STRING) {
    becomeReady();
    return;
  }
  const std::string role(reply->element[0]->str, reply->element[0]->len);
  if (role == "master") {
    becomeReady();
  } else {
    drop("it is a read-only " + std::string(role == "slave" ? "replica" : role) +
         " (ROLE), not the primary: purges wait until it is one");
  }
}

void RedisLink::becomeReady() {
  state_ = State::kReady;
  backoffMs_ = 0;
  if (complained_ || !everReady_) {
    spdlog::info("{}: connected to {}{}", name_, address_.text(), tls_ ? " over TLS" : "");
  }
  complained_ = false;
  everReady_ = true;
  if (handlers_.ready) handlers_.ready();
}

void RedisLink::drop(const std::string& why) {
  if (wire_ == nullptr || state_ == State::kStopped) return;
  state_ = State::kBackoff;  // replies now due come back null; nobody sends meanwhile
  closeWire(true);
  lost(why);
}

void RedisLink::lost(const std::string& why) {
  if (state_ == State::kStopped) return;
  state_ = State::kBackoff;
  deadlines_.clear();
  backoffMs_ = backoffMs_ == 0 ? kFirstBackoffMs : std::min(backoffMs_ * 2, kMaxBackoffMs);
  if (!complained_) {
    spdlog::warn("{}: {} ({}); retrying, every {} s at most, without waiting for it",
                 name_, why, address_.text(), kMaxBackoffMs / 1000);
    complained_ = true;
  } else {
    spdlog::debug("{}: {}; next attempt in {} ms", name_, why, backoffMs_);
  }
  uv_timer_start(retry_, onRetry, backoffMs_, 0);
  if (handlers_.lost) handlers_.lost();
}

void RedisLink::onRetry(uv_timer_t* timer) {
  auto* self = static_cast<RedisLink*>(timer->data);
  if (self->state_ == State::kBackoff) self->connect();
}

void RedisLink::onTick(uv_timer_t* timer) {
  auto* self = static_cast<RedisLink*>(timer->data);
  const uint64_t now = uv_now(self->loop_);
  if (self->wire_ != nullptr && !self->wire_->broken.empty()) {
    self->drop(self->wire_->broken);
  } else if (self->state_ == State::kConnecting && now >= self->connectDeadline_) {
    const std::string within = " within " + std::to_string(kConnectTimeoutMs) + " ms";
    // A plain-text Redis waits for the end of a line a ClientHello never sends.
    self->drop(self->wire_ != nullptr && self->wire_->ssl != nullptr
                   ? "no TLS handshake" + within + ": a plain-text Redis there? then redis:// in fleet"
                   : "no connection" + within);
  } else if ((self->state_ == State::kReady || self->state_ == State::kHandshake) &&
             !self->deadlines_.empty() && now >= self->deadlines_.front()) {
    self->drop("no answer in time: Redis hangs");
  }
}

bool RedisLink::command(const std::vector<std::string>& args, Reply reply, uint64_t timeoutMs) {
  if (state_ != State::kReady) return false;
  return send(args, std::move(reply), timeoutMs);
}

bool RedisLink::send(const std::vector<std::string>& args, Reply reply, uint64_t timeoutMs) {
  std::vector<const char*> argv;
  std::vector<size_t> lengths;
  argv.reserve(args.size());
  lengths.reserve(args.size());
  for (const std::string& arg : args) {
    argv.push_back(arg.data());
    lengths.push_back(arg.size());
  }
  char* formatted = nullptr;
  const int length = redisFormatCommandArgv(&formatted, static_cast<int>(args.size()), argv.data(),
                                            lengths.data());
  if (length < 0) return false;
  std::string bytes(formatted, static_cast<size_t>(length));
  redisFreeCommand(formatted);
  Wire* wire = wire_;
  wire->calls.push_back(std::move(reply));
  deadlines_.push_back(uv_now(loop_) + timeoutMs);
  if (!tls_) {
    write(std::move(bytes));
    return true;
  }
  ERR_clear_error();
  for (size_t at = 0; at < bytes.size();) {
    const int n = SSL_write(wire->ssl, bytes.data() + at,
                            static_cast<int>(std::min(bytes.size() - at, kTlsBuffer / 2)));
    if (n <= 0) {
      wire->broken = RedisTls::failure(wire->ssl);
      break;
    }
    at += static_cast<size_t>(n);
    flushTls();
  }
  return true;
}

}  // namespace esi
