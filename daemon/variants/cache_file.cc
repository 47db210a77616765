#include "variants/cache_file.h"

#include <cstring>

#include "esi/cache_file.h"

namespace esi {

namespace {

// ngx_http_file_cache_header_t as include/esi/cache_file.h lays it out, the
// module's startup check and this reader's one definition.
constexpr uint64_t kVersion = ESI_CACHE_FILE_VERSION;
constexpr size_t kHeaderStartAt = ESI_CACHE_FILE_HEADER_START_AT;
constexpr size_t kBodyStartAt = ESI_CACHE_FILE_BODY_START_AT;
constexpr size_t kVaryLenAt = ESI_CACHE_FILE_VARY_LEN_AT;
constexpr size_t kVaryAt = ESI_CACHE_FILE_VARY_AT;
constexpr size_t kVaryMax = ESI_CACHE_FILE_VARY_SIZE;
constexpr size_t kVariantAt = ESI_CACHE_FILE_VARIANT_AT;
constexpr size_t kHeaderSize = ESI_CACHE_FILE_HEADER_SIZE;
constexpr std::string_view kKeyPrefix = ESI_CACHE_FILE_KEY_PREFIX;

static_assert(sizeof(uint64_t) == ESI_CACHE_FILE_VERSION_SIZE);
static_assert(sizeof(uint16_t) == ESI_CACHE_FILE_HEADER_START_SIZE);
static_assert(sizeof(uint16_t) == ESI_CACHE_FILE_BODY_START_SIZE);
static_assert(sizeof(uint8_t) == ESI_CACHE_FILE_VARY_LEN_SIZE);
static_assert(sizeof(Md5) == ESI_CACHE_FILE_VARIANT_SIZE);

template <typename T>
T load(std::string_view bytes, size_t at) {
  T value;
  std::memcpy(&value, bytes.data() + at, sizeof(T));
  return value;
}

bool equalsIgnoreCase(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::tolower(static_cast<unsigned char>(a[i])) !=
        std::tolower(static_cast<unsigned char>(b[i]))) {
      return false;
    }
  }
  return true;
}

// The tag headers' values from a raw "HTTP/1.1 200 OK\r\nName: value\r\n..."
void readTags(std::string_view response, const std::vector<std::string>& tagHeaders,
              std::vector<std::string>& tags) {
  size_t line = response.find("\r\n");
  while (line != std::string_view::npos) {
    line += 2;
    const size_t end = response.find("\r\n", line);
    if (end == std::string_view::npos || end == line) return;
    std::string_view header = response.substr(line, end - line);
    const size_t colon = header.find(':');
    if (colon != std::string_view::npos) {
      std::string_view name = header.substr(0, colon);
      for (const std::string& tagHeader : tagHeaders) {
        if (equalsIgnoreCase(name, tagHeader)) {
          splitTags(header.substr(colon + 1), tags);
          break;
        }
      }
    }
    line = end;
  }
}

}  // namespace

void splitTags(std::string_view value, std::vector<std::string>& out) {
  size_t i = 0;
  while (i < value.size()) {
    while (i < value.size() && (value[i] == ' ' || value[i] == '\t' || value[i] == ',')) ++i;
    size_t end = i;
    while (end < value.size() && value[end] != ' ' && value[end] != '\t' && value[end] != ',') ++end;
    if (end > i) out.emplace_back(value.substr(i, end - i));
    i = end;
  }
}

const std::vector<std::string>& defaultTagHeaders() {
  static const std::vector<std::string> kHeaders{
      "Surrogate-Key", "xkey", "Cache-Tag", "Cache-Tags", "Purge-Cache-Tags", "X-Magento-Tags"};
  return kHeaders;
}

std::optional<CacheFile> parseCacheFile(std::string_view head, std::string* why,
                                        const std::vector<std::string>& tagHeaders) {
  auto refuse = [why](const char* reason) {
    *why = reason;
    return std::nullopt;
  };
  if (head.size() < kHeaderSize + kKeyPrefix.size()) return refuse("shorter than a cache header");
  if (load<uint64_t>(head, ESI_CACHE_FILE_VERSION_AT) != kVersion) {
    return refuse("not a version 5 cache file");
  }

  const size_t headerStart = load<uint16_t>(head, kHeaderStartAt);
  const size_t bodyStart = load<uint16_t>(head, kBodyStartAt);
  if (headerStart < kHeaderSize + kKeyPrefix.size() || bodyStart < headerStart) {
    return refuse("header offsets out of order");
  }
  if (head.substr(kHeaderSize, kKeyPrefix.size()) != kKeyPrefix) return refuse("no KEY line");

  // A head that ends before header_start has the KEY line cut.
  if (headerStart > head.size()) return refuse("shorter than its header says");

  // The key runs up to the "\n" just before header_start.
  const size_t keyEnd = headerStart - 1;
  if (keyEnd < kHeaderSize + kKeyPrefix.size() || head[keyEnd] != '\n') {
    return refuse("KEY line does not end where the response begins");
  }

  CacheFile file;
  file.key.assign(head.substr(kHeaderSize + kKeyPrefix.size(),
                              keyEnd - kHeaderSize - kKeyPrefix.size()));
  std::memcpy(file.variant.data(), head.data() + kVariantAt, file.variant.size());
  const size_t varyLen = static_cast<uint8_t>(head[kVaryLenAt]);
  if (varyLen > kVaryMax) return refuse("Vary longer than NGINX stores");
  file.vary.assign(head.substr(kVaryAt, varyLen));

  readTags(head.substr(headerStart, std::min(bodyStart, head.size()) - headerStart), tagHeaders,
           file.tags);
  return file;
}

std::optional<Md5> md5FromHex(std::string_view hex) {
  if (hex.size() != 32) return std::nullopt;
  Md5 out;
  for (size_t i = 0; i < 16; ++i) {
    int byte = 0;
    for (char c : hex.substr(i * 2, 2)) {
      byte <<= 4;
      if (c >= '0' && c <= '9') byte |= c - '0';
      else if (c >= 'a' && c <= 'f') byte |= c - 'a' + 10;
      else return std::nullopt;  // NGINX writes lowercase only
    }
    out[i] = static_cast<uint8_t>(byte);
  }
  return out;
}

std::string md5ToHex(const Md5& md5) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out(32, '0');
  for (size_t i = 0; i < 16; ++i) {
    out[2 * i] = kDigits[md5[i] >> 4];
    out[2 * i + 1] = kDigits[md5[i] & 15];
  }
  return out;
}

}  // namespace esi
