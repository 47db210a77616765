#include "variants/zone_scan.h"

#include <fcntl.h>
#include <openssl/evp.h>
#include <unistd.h>

#include <filesystem>
#include <system_error>

#include "esi/cache_file.h"
#include "base/unique_fd.h"

namespace esi {

namespace {

// Most cache headers fit in the first page; larger ones are read again.
constexpr size_t kFirstRead = 4096;
// levels= allows at most three directory levels below the zone's root.
constexpr int kMaxDepth = 3;

bool readHead(const std::filesystem::path& file, std::string& head) {
  UniqueFd fd(::open(file.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW));
  if (!fd) return false;
  head.resize(kFirstRead);
  ssize_t n = pread(fd.get(), head.data(), head.size(), 0);
  if (n < 0) return false;
  head.resize(static_cast<size_t>(n));
  // body_start (a u16) says how much the header block spans.
  constexpr size_t kBodyStartAt = ESI_CACHE_FILE_BODY_START_AT;
  if (head.size() >= kBodyStartAt + sizeof(uint16_t)) {
    uint16_t bodyStart;
    __builtin_memcpy(&bodyStart, head.data() + kBodyStartAt, sizeof(bodyStart));
    if (bodyStart > head.size() && head.size() == kFirstRead) {
      head.resize(bodyStart);
      n = pread(fd.get(), head.data(), head.size(), 0);
      if (n < 0) return false;
      head.resize(static_cast<size_t>(n));
    }
  }
  return true;
}

}  // namespace

Md5 md5Of(std::string_view bytes) {
  Md5 out;
  unsigned int len = 0;
  EVP_Digest(bytes.data(), bytes.size(), out.data(), &len, EVP_md5(), nullptr);
  return out;
}

ScanResult scanZone(const std::string& path, ScanProgress& progress,
                    const std::vector<std::string>& tagHeaders) {
  namespace fs = std::filesystem;
  ScanResult result;
  std::error_code ec;
  uint64_t dirs = 0;
  for (fs::directory_iterator top(path, ec); !ec && top != fs::directory_iterator();
       top.increment(ec)) {
    if (top->is_directory(ec)) ++dirs;
  }
  progress.dirs.store(dirs, std::memory_order_relaxed);
  fs::recursive_directory_iterator it(path, fs::directory_options::none, ec);
  if (ec) {
    result.error = "cannot read " + path + ": " + ec.message();
    return result;
  }
  std::string head;
  std::string why;
  for (; it != fs::recursive_directory_iterator(); it.increment(ec)) {
    if (ec) {
      result.error = "walking " + path + ": " + ec.message();
      return result;
    }
    if (progress.cancel.load(std::memory_order_relaxed)) {
      result.error = "cancelled";
      return result;
    }
    if (it.depth() > kMaxDepth) {
      it.disable_recursion_pending();
      continue;
    }
    if (!it->is_regular_file(ec)) {
      if (it.depth() == 0 && it->is_directory(ec)) {
        progress.dirsEntered.fetch_add(1, std::memory_order_relaxed);
      }
      continue;
    }
    const std::string name = it->path().filename().string();
    const auto fileMd5 = md5FromHex(name);
    if (!fileMd5) continue;  // temporary files and strangers
    progress.files.fetch_add(1, std::memory_order_relaxed);
    if (!readHead(it->path(), head)) {
      // Evicted between the listing and the read: nothing to index.
      continue;
    }
    auto parsed = parseCacheFile(head, &why, tagHeaders);
    if (!parsed) {
      ++result.unreadable;
      continue;
    }
    StoredFile stored;
    stored.main = md5Of(parsed->key);
    stored.file = *fileMd5;
    stored.key = std::move(parsed->key);
    stored.tags = std::move(parsed->tags);
    result.files.push_back(std::move(stored));
  }
  result.complete = true;
  return result;
}

}  // namespace esi
