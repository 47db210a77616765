// esid's reader of NGINX cache files (daemon/variants/cache_file.h) on any
// bytes: the head of a file in a cache directory, which anything with write
// access to it may have written.  parseCacheFile never reads outside the
// head (ASan: it gets a copy of exactly its size), refuses with a reason, or
// returns what the header says: the KEY line up to header_start, the Vary
// NGINX stored and the variant hash, and tags that are words of the
// response's Surrogate-Key and xkey lines.  md5FromHex takes exactly 32
// lowercase hex digits, and md5ToHex gives them back.
//
// Input: the head of a cache file; its first 32 bytes also as a file name.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "fuzz_check.h"
#include "variants/cache_file.h"

namespace {

// ngx_http_file_cache_header_t on x86-64, version 5 (cache_file.cc).
constexpr size_t kHeaderStartAt = 54;
constexpr size_t kBodyStartAt = 56;
constexpr size_t kVaryLenAt = 187;
constexpr size_t kVaryAt = 188;
constexpr size_t kVariantAt = 316;
constexpr size_t kKeyAt = 336 + 6;  // after the header and "\nKEY: "

size_t load16(std::string_view head, size_t at) {
  uint16_t value;
  std::memcpy(&value, head.data() + at, sizeof value);
  return value;
}

bool isLowerHex(char c) {
  return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f');
}

void checkParsed(std::string_view head, const esi::CacheFile& file) {
  FUZZ_CHECK(head.size() >= kKeyAt);
  const size_t headerStart = load16(head, kHeaderStartAt);
  const size_t bodyStart = load16(head, kBodyStartAt);
  // The head holds the whole KEY line: a file cut inside it is refused.
  FUZZ_CHECK(headerStart > kKeyAt && headerStart <= head.size());
  FUZZ_CHECK(bodyStart >= headerStart);

  // The key is the KEY line, up to the "\n" before header_start.
  FUZZ_CHECK(head.substr(kKeyAt - 6, 6) == "\nKEY: ");
  FUZZ_CHECK(head[kKeyAt + file.key.size()] == '\n');
  FUZZ_CHECK(kKeyAt + file.key.size() + 1 == headerStart);
  FUZZ_CHECK(head.substr(kKeyAt, file.key.size()) == file.key);

  FUZZ_CHECK(file.vary.size() <= 128);
  FUZZ_CHECK(static_cast<uint8_t>(head[kVaryLenAt]) == file.vary.size());
  FUZZ_CHECK(head.substr(kVaryAt, file.vary.size()) == file.vary);
  FUZZ_CHECK(std::memcmp(file.variant.data(), head.data() + kVariantAt,
                         file.variant.size()) == 0);

  // Tags: words of the response's header lines, none from the body.
  const std::string_view headers = head.substr(
      headerStart, std::min(bodyStart, head.size()) - headerStart);
  for (const std::string& tag : file.tags) {
    FUZZ_CHECK(!tag.empty());
    FUZZ_CHECK(tag.find_first_of(" \t,") == std::string::npos);
    FUZZ_CHECK(tag.find("\r\n") == std::string::npos);
    FUZZ_CHECK(headers.find(tag) != std::string_view::npos);
  }
}

void checkHex(std::string_view hex) {
  const std::optional<esi::Md5> md5 = esi::md5FromHex(hex);
  bool lowerHex = hex.size() == 32;
  for (const char c : hex) lowerHex = lowerHex && isLowerHex(c);
  FUZZ_CHECK(md5.has_value() == lowerHex);
  if (md5) FUZZ_CHECK(esi::md5ToHex(*md5) == hex);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::unique_ptr<char[]> copy(new char[size]);
  std::memcpy(copy.get(), data, size);
  const std::string_view head(copy.get(), size);

  std::string why;
  const std::optional<esi::CacheFile> file = esi::parseCacheFile(head, &why);
  if (file) {
    checkParsed(head, *file);
  } else {
    FUZZ_CHECK(!why.empty());
  }

  checkHex(head);
  checkHex(head.substr(0, 32));
  esi::Md5 md5{};
  std::memcpy(md5.data(), data, std::min(size, md5.size()));
  const std::string hex = esi::md5ToHex(md5);
  FUZZ_CHECK(esi::md5FromHex(hex) == md5);
  return 0;
}
