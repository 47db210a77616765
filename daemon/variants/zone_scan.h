// Walks a cache zone's directory and reads each file's key, variant and tags,
// as NGINX's cache loader walks it after a restart.  Runs on a thread of its
// own: it touches no esid state, and reports progress through atomics.

#pragma once

#include <atomic>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "variants/zone_index.h"

namespace esi {

struct ScanProgress {
  std::atomic<uint64_t> files{0};
  // The zone's first-level directories, and how many the walk has entered:
  // a coarse measure of how far it is (esictl's progress bar).
  std::atomic<uint64_t> dirs{0};
  std::atomic<uint64_t> dirsEntered{0};
  std::atomic<bool> cancel{false};
};

struct ScanResult {
  std::vector<StoredFile> files;
  uint64_t unreadable = 0;  // named like cache files but not parseable
  bool complete = false;    // the whole tree was read
  std::string error;        // why not, when !complete
};

// tagHeaders: the response headers whose values are the files' tags.
ScanResult scanZone(const std::string& path, ScanProgress& progress,
                    const std::vector<std::string>& tagHeaders = defaultTagHeaders());

Md5 md5Of(std::string_view bytes);

}  // namespace esi
