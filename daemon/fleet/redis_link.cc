#include "fleet/redis_link.h"

#include <hiredis/async.h>
#include <hiredis/hiredis.h>
#include <hiredis/adapters/libuv.h>

#include <algorithm>
#include <charconv>
#include <memory>
#include <stdexcept>

#include <spdlog/spdlog.h>

namespace esi {

namespace {

constexpr uint64_t kTickMs = 100;
constexpr uint64_t kFirstBackoffMs = 100;
constexpr uint64_t kMaxBackoffMs = 5000;

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
  return "redis://" + (v6 ? "[" + host + "]" : host) + ":" + std::to_string(port) + "/" +
         std::to_string(db);
}

RedisAddress parseRedisUrl(std::string_view url) {
  constexpr std::string_view kScheme = "redis://";
  if (url.substr(0, kScheme.size()) != kScheme) {
    throw std::invalid_argument("fleet \"" + std::string(url) + "\" is not a redis://host:port/db URL");
  }
  std::string_view rest = url.substr(kScheme.size());
  if (rest.find('@') != std::string_view::npos) {
    throw std::invalid_argument("the fleet URL carries credentials: write them in the settings "
                                "file as fleet_user and fleet_password, never in the URL");
  }
  RedisAddress address;
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

struct RedisLink::Call {
  RedisLink* link;
  Reply reply;
};

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
  uv_timer_start(tick_, onTick, kTickMs, kTickMs);
  connect();
}

void RedisLink::stop() {
  if (state_ == State::kStopped) return;
  state_ = State::kStopped;
  if (redisAsyncContext* ac = std::exchange(ac_, nullptr)) redisAsyncFree(ac);
  deadlines_.clear();
  closeTimer(tick_);
  closeTimer(retry_);
}

void RedisLink::connect() {
  state_ = State::kConnecting;
  connectDeadline_ = uv_now(loop_) + kConnectTimeoutMs;
  redisAsyncContext* ac = redisAsyncConnect(address_.host.c_str(), address_.port);
  if (ac == nullptr) {
    lost("cannot allocate a connection");
    return;
  }
  if (ac->err != 0) {
    const std::string why = ac->errstr;
    redisAsyncFree(ac);
    lost(why);
    return;
  }
  ac->data = this;
  if (redisLibuvAttach(ac, loop_) != REDIS_OK) {
    redisAsyncFree(ac);
    lost("cannot attach the connection to the loop");
    return;
  }
  redisAsyncSetConnectCallback(ac, onConnect);
  redisAsyncSetDisconnectCallback(ac, onDisconnect);
  ac_ = ac;
}

void RedisLink::onConnect(const redisAsyncContext* ac, int status) {
  auto* self = static_cast<RedisLink*>(ac->data);
  if (self == nullptr || self->ac_ != ac) return;
  if (status != REDIS_OK) {
    self->ac_ = nullptr;  // hiredis frees it
    self->lost(ac->errstr);
    return;
  }
  self->handshake();
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
    spdlog::info("{}: connected to {}", name_, address_.text());
  }
  complained_ = false;
  everReady_ = true;
  if (handlers_.ready) handlers_.ready();
}

void RedisLink::onDisconnect(const redisAsyncContext* ac, int status) {
  auto* self = static_cast<RedisLink*>(ac->data);
  if (self == nullptr || self->ac_ != ac) return;  // we dropped it ourselves
  self->ac_ = nullptr;
  std::string why = status == REDIS_OK ? "Redis closed the connection" : ac->errstr;
  // A TLS server resets a connection that does not begin with a handshake.
  if (self->state_ == State::kHandshake) {
    why += " before answering a command: if that port speaks TLS, write rediss:// in fleet";
  }
  self->lost(why);
}

void RedisLink::drop(const std::string& why) {
  redisAsyncContext* ac = std::exchange(ac_, nullptr);
  if (ac == nullptr || state_ == State::kStopped) return;
  state_ = State::kBackoff;  // replies now due come back null; nobody sends meanwhile
  ac->data = nullptr;        // and its disconnect callback is ours no more
  redisAsyncFree(ac);
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
  if (self->state_ == State::kConnecting && now >= self->connectDeadline_) {
    self->drop("no connection within " + std::to_string(kConnectTimeoutMs) + " ms");
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
  auto call = std::make_unique<Call>(Call{this, std::move(reply)});
  if (redisAsyncCommandArgv(ac_, onReply, call.get(), static_cast<int>(args.size()), argv.data(),
                            lengths.data()) != REDIS_OK) {
    return false;
  }
  static_cast<void>(call.release());  // onReply owns it now
  deadlines_.push_back(uv_now(loop_) + timeoutMs);
  return true;
}

void RedisLink::onReply(redisAsyncContext*, void* reply, void* privdata) {
  std::unique_ptr<Call> call(static_cast<Call*>(privdata));
  RedisLink* self = call->link;
  if (self->state_ == State::kStopped) return;
  if (!self->deadlines_.empty()) self->deadlines_.pop_front();
  call->reply(static_cast<const redisReply*>(reply));
}

}  // namespace esi
