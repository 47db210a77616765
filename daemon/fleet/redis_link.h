// One connection to Redis on esid's loop that keeps itself up: it resolves
// the host, connects (libuv), speaks TLS for rediss:// (RedisTls),
// authenticates, selects the database and asks ROLE (it is ready only once
// Redis has answered, and only on a primary: a replica refuses every
// write), and when the connection breaks, times out, fails its TLS
// handshake or answers what hiredis' reader cannot parse, drops it and
// connects again after a backoff (100 ms, doubling up to 5 s).  Nothing
// here ever blocks the loop.

#pragma once

#include <netdb.h>
#include <uv.h>

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

struct redisReply;

namespace esi {

// Closes a timer made with new; the loop deletes it once it is closed.
void closeTimer(uv_timer_t* timer);

struct RedisAddress {
  std::string host = "127.0.0.1";
  int port = 6379;
  int db = 0;
  std::string user;      // ACL user; empty: the default user
  std::string password;  // empty: no AUTH
  bool tls = false;      // rediss://
  std::string tlsCaFile;      // empty: the system's CAs
  std::string tlsCertFile;    // a client certificate (and its key), or empty
  std::string tlsKeyFile;
  std::string tlsServerName;  // checked against the certificate; empty: host

  // redis[s]://host:port/db, never with the credentials.
  std::string text() const;
};

class RedisTls;

// "redis://host[:port][/db]", or rediss:// for TLS (an IPv6 host in
// brackets).  Throws
// std::invalid_argument saying what is wrong; a URL that carries
// credentials is refused: they belong in the settings file (fleet_user,
// fleet_password), never on a command line.
RedisAddress parseRedisUrl(std::string_view url);

class RedisLink {
 public:
  // nullptr: the command got no answer (the connection went first).
  using Reply = std::function<void(const redisReply* reply)>;
  struct Handlers {
    std::function<void()> ready;  // connected, authenticated, selected
    std::function<void()> lost;   // not ready any more; it reconnects
  };

  // name says which connection this is in log lines ("fleet reader").
  RedisLink(uv_loop_t* loop, RedisAddress address, std::string name, Handlers handlers);
  ~RedisLink();
  RedisLink(const RedisLink&) = delete;
  RedisLink& operator=(const RedisLink&) = delete;

  // Throws std::runtime_error when the TLS settings cannot be used.
  void start();
  // Closes the connection; replies still due are never delivered.
  void stop();

  bool ready() const { return state_ == State::kReady; }

  // Sends a command; false (and reply never called) when not ready.  A
  // reply that takes longer than timeoutMs drops the connection.
  bool command(const std::vector<std::string>& args, Reply reply,
               uint64_t timeoutMs = kCommandTimeoutMs);

  // The answer made no sense: drop the connection and connect again.
  void drop(const std::string& why);

  // Commands sent and not answered yet.
  size_t outstanding() const { return deadlines_.size(); }

  static constexpr uint64_t kCommandTimeoutMs = 2000;
  static constexpr uint64_t kConnectTimeoutMs = 2000;

 private:
  enum class State { kIdle, kConnecting, kHandshake, kReady, kBackoff, kStopped };
  struct Wire;

  static void onResolved(uv_getaddrinfo_t* request, int status, addrinfo* found);
  static void onConnected(uv_connect_t* request, int status);
  static void onTick(uv_timer_t* timer);
  static void onRetry(uv_timer_t* timer);

  void connect();
  // TCP is up (and TLS, for rediss://): authenticate, select, ROLE.
  void handshake();
  void roleAnswered(const redisReply* reply);
  void becomeReady();
  bool send(const std::vector<std::string>& args, Reply reply, uint64_t timeoutMs);
  // Bytes from Redis, decrypted where TLS; then its answers.
  void received(const char* bytes, size_t length);
  void deliver();
  // The TLS handshake's next step; the session's bytes out to the socket.
  void advanceTls();
  void flushTls();
  void write(std::string bytes);
  // Lets the connection go: replies due are answered null when answerCalls.
  void closeWire(bool answerCalls);
  // The connection is gone: tell, and try again later.
  void lost(const std::string& why);

  uv_loop_t* loop_;
  RedisAddress address_;
  std::string name_;
  Handlers handlers_;
  std::unique_ptr<RedisTls> tls_;  // rediss:// only
  State state_ = State::kIdle;
  Wire* wire_ = nullptr;
  uv_timer_t* tick_;   // timeouts, while connecting or connected
  uv_timer_t* retry_;  // the backoff
  uint64_t connectDeadline_ = 0;
  std::deque<uint64_t> deadlines_;  // of the commands sent, in order
  uint64_t backoffMs_ = 0;
  bool complained_ = false;  // this outage was logged at warn already
  bool everReady_ = false;
};

}  // namespace esi
