// What esid did, page by page and purge by purge, for `esictl log`: a ring
// of a fixed number of entries, the oldest overwritten by the newest.
// Readers ask for what came after the last entry they saw; esid never
// waits for a reader, and one that falls behind is told how many entries
// it missed.

#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace esi {

struct TraceEntry {
  enum class Kind { kPage, kPurge };

  uint64_t seq = 0;       // set by the ring: 1, 2, ...
  int64_t unixMs = 0;     // set by the ring: wall clock
  Kind kind = Kind::kPage;
  // A page: its path, the status NGINX answers with (0: the worker did
  // not say), how esid served it ("parse", "plan", "replay", "cancel",
  // "fail"), its includes, body bytes and esid's time on it.
  // A purge: the key, prefix or tag in url, how it went ("exact",
  // "wildcard", "tag", "soft exact"...), the files it removed in
  // fragments, its zone, where the answer came from and its error.
  std::string url;
  uint32_t status = 0;
  std::string how;
  uint64_t fragments = 0;
  uint64_t bytes = 0;
  uint64_t micros = 0;
  std::string zone;
  std::string path;  // a purge's: "index" or "directory"
  std::string error;

  nlohmann::json toJson() const;
};

// Which entries a reader wants: status 0 is any (and the only one purges
// pass), an empty prefix any URL.
struct TraceFilter {
  uint32_t status = 0;
  std::string prefix;

  bool passes(const TraceEntry& entry) const;
};

struct TraceSlice {
  std::vector<TraceEntry> entries;  // after the reader's, oldest first
  uint64_t missed = 0;  // entries overwritten before the reader saw them
  uint64_t last = 0;    // the newest entry's seq: the reader's next "after"
};

class TraceRing {
 public:
  static constexpr size_t kDefaultEntries = 4096;
  static constexpr size_t kMaxUrlBytes = 512;  // longer ones are cut

  explicit TraceRing(size_t entries = kDefaultEntries);

  void add(TraceEntry entry);

  // The entries with seq > after that pass the filter.
  TraceSlice since(uint64_t after, const TraceFilter& filter) const;

  uint64_t last() const { return next_ - 1; }
  size_t capacity() const { return slots_.size(); }

 private:
  std::vector<TraceEntry> slots_;
  uint64_t next_ = 1;
};

}  // namespace esi
