// TLS to Redis (rediss://), on OpenSSL: the settings checked once, at
// start, and a session for each connection that checks Redis' certificate
// against the CA and the server name (the URL's host unless
// fleet_tls_server_name says otherwise), TLS 1.2 at least.  Debian 12's
// hiredis (0.14) has no TLS; RedisLink reads Redis' answers with hiredis'
// reader from what this session decrypts (docs/fleet.md says why).

#pragma once

#include <string>

using SSL = struct ssl_st;
using SSL_CTX = struct ssl_ctx_st;

namespace esi {

struct RedisAddress;

class RedisTls {
 public:
  // Throws std::runtime_error naming the setting and file that cannot be
  // used (unreadable, not PEM, a key that is not the certificate's).
  explicit RedisTls(const RedisAddress& address);
  ~RedisTls();
  RedisTls(const RedisTls&) = delete;
  RedisTls& operator=(const RedisTls&) = delete;

  // A new client session, the name to check set; nullptr if OpenSSL
  // cannot make one.
  SSL* session() const;

  // Why the last TLS operation of ssl failed, in words, with the hint a
  // plain-text server on a rediss:// URL needs; clears OpenSSL's errors.
  static std::string failure(SSL* ssl);

 private:
  SSL_CTX* context_ = nullptr;
  std::string serverName_;
};

}  // namespace esi
