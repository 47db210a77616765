// Reads what esid needs from one of NGINX's cache files (proxy, fastcgi,
// uwsgi and scgi caches write the same): the key it was stored under, which
// variant of that key it is, and the purge tags its response carried.
// Layout: ngx_http_file_cache_header_t, version 5, x86-64, at the offsets of
// include/esi/cache_file.h (which the module checks against the NGINX it is
// built for), then "\nKEY: <key>\n", then the raw upstream response from
// header_start.

#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace esi {

using Md5 = std::array<uint8_t, 16>;

struct CacheFile {
  std::string key;                // the proxy_cache_key text
  Md5 variant{};                  // all zero unless stored under a Vary hash
  std::string vary;               // the Vary value it was stored with
  std::vector<std::string> tags;  // the values of its tag headers
};

// The response headers whose values are purge tags, split on spaces and
// commas, when NGINX's configuration names none (esi_purge_tag_headers):
// Fastly's and Varnish xkey's, Cloudflare's, Drupal's and Magento's.
const std::vector<std::string>& defaultTagHeaders();

// How many leading bytes of a file parseCacheFile needs at most: the header
// block is addressed with 16-bit offsets.
constexpr size_t kCacheFileHeadBytes = 65536;

// Parses the head of a cache file.  Returns nullopt with *why set when it is
// not a cache file this NGINX version wrote.
// Appends the words of value, separated by spaces, tabs or commas: the tags
// of a tag header, the names of esi_purge_tag_headers.
void splitTags(std::string_view value, std::vector<std::string>& out);

// tagHeaders: the header names whose values are tags (case-insensitive).
std::optional<CacheFile> parseCacheFile(
    std::string_view head, std::string* why,
    const std::vector<std::string>& tagHeaders = defaultTagHeaders());

// "5bf0639767f3e9eaad729b54037a7e2a" -> bytes, for a cache file's name.
std::optional<Md5> md5FromHex(std::string_view hex);
std::string md5ToHex(const Md5& md5);

}  // namespace esi
