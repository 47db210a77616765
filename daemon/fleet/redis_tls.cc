#include "fleet/redis_tls.h"

#include <arpa/inet.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>

#include <stdexcept>

#include "fleet/redis_link.h"

namespace esi {

namespace {

// OpenSSL's last error in words, or "" (and its queue emptied).
std::string lastError() {
  std::string text;
  while (const unsigned long e = ERR_get_error()) {
    if (text.empty()) {
      const char* reason = ERR_reason_error_string(e);
      text = reason != nullptr ? reason : "error " + std::to_string(e);
    }
  }
  return text;
}

bool isAddress(const std::string& host) {
  unsigned char bytes[sizeof(in6_addr)];
  return inet_pton(AF_INET, host.c_str(), bytes) == 1 || inet_pton(AF_INET6, host.c_str(), bytes) == 1;
}

}  // namespace

RedisTls::RedisTls(const RedisAddress& address)
    : serverName_(address.tlsServerName.empty() ? address.host : address.tlsServerName) {
  context_ = SSL_CTX_new(TLS_client_method());
  if (context_ == nullptr) throw std::runtime_error("fleet: cannot set TLS up: " + lastError());
  const auto fail = [this](const std::string& what) {
    const std::string why = lastError();
    SSL_CTX_free(context_);
    context_ = nullptr;
    return std::runtime_error(what + (why.empty() ? "" : ": " + why));
  };
  SSL_CTX_set_min_proto_version(context_, TLS1_2_VERSION);
  SSL_CTX_set_verify(context_, SSL_VERIFY_PEER, nullptr);
  if (address.tlsCaFile.empty()) {
    if (SSL_CTX_set_default_verify_paths(context_) != 1) throw fail("fleet: the system's CAs cannot be read");
  } else if (SSL_CTX_load_verify_locations(context_, address.tlsCaFile.c_str(), nullptr) != 1) {
    throw fail("fleet_tls_ca_file " + address.tlsCaFile + " cannot be used");
  }
  if (address.tlsCertFile.empty() != address.tlsKeyFile.empty()) {
    throw fail("fleet_tls_cert_file and fleet_tls_key_file go together: set both or neither");
  }
  if (!address.tlsCertFile.empty()) {
    if (SSL_CTX_use_certificate_chain_file(context_, address.tlsCertFile.c_str()) != 1) {
      throw fail("fleet_tls_cert_file " + address.tlsCertFile + " cannot be used");
    }
    // OpenSSL checks that the key is the certificate's ("key values mismatch").
    if (SSL_CTX_use_PrivateKey_file(context_, address.tlsKeyFile.c_str(), SSL_FILETYPE_PEM) != 1) {
      throw fail("fleet_tls_key_file " + address.tlsKeyFile + " cannot be used");
    }
  }
}

RedisTls::~RedisTls() { SSL_CTX_free(context_); }

SSL* RedisTls::session() const {
  SSL* ssl = SSL_new(context_);
  if (ssl == nullptr) return nullptr;
  // The certificate must name the server: its address, or its host name
  // (also sent as SNI, which an address never is).
  const bool named = isAddress(serverName_)
                         ? X509_VERIFY_PARAM_set1_ip_asc(SSL_get0_param(ssl), serverName_.c_str()) == 1
                         : SSL_set_tlsext_host_name(ssl, serverName_.c_str()) == 1 &&
                               SSL_set1_host(ssl, serverName_.c_str()) == 1;
  if (!named) {
    SSL_free(ssl);
    return nullptr;
  }
  SSL_set_connect_state(ssl);
  return ssl;
}

std::string RedisTls::failure(SSL* ssl) {
  const long verified = SSL_get_verify_result(ssl);
  std::string why = lastError();
  if (verified != X509_V_OK) {
    const bool issuer = verified == X509_V_ERR_UNABLE_TO_GET_ISSUER_CERT_LOCALLY ||
                        verified == X509_V_ERR_SELF_SIGNED_CERT_IN_CHAIN ||
                        verified == X509_V_ERR_DEPTH_ZERO_SELF_SIGNED_CERT ||
                        verified == X509_V_ERR_UNABLE_TO_VERIFY_LEAF_SIGNATURE;
    return std::string("TLS: Redis' certificate is refused: ") +
           X509_verify_cert_error_string(verified) +
           (issuer ? " (not signed by a CA of fleet_tls_ca_file)" : "");
  }
  if (why.empty()) why = "the connection ended during the TLS handshake";
  if (why.find("wrong version number") != std::string::npos ||
      why.find("packet length too long") != std::string::npos) {
    return "TLS: " + why + " (a plain-text Redis there? then redis:// in fleet)";
  }
  return "TLS: " + why;
}

}  // namespace esi
