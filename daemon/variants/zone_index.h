// What esid knows of one NGINX cache zone: for each key, the files (the main
// one and its Vary variants) stored under it, and the purge tags they carry.
//
// The index never guesses.  It answers for a key only while the zone is
// known complete: a full scan of the zone's directory finished, and every
// file NGINX stored or served since was reported.  A key whose entry had to
// be dropped (too many variants, evicted for memory) is in doubt until the
// next scan, and so is any tag or prefix question while one key is.  Callers
// treat "unknown" as "scan first", so being unsure costs a scan, never a
// stale variant left behind.

#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <list>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "variants/cache_file.h"

namespace esi {

struct Md5Hash {
  size_t operator()(const Md5& md5) const noexcept {
    size_t h;
    static_assert(sizeof(h) <= sizeof(Md5));
    __builtin_memcpy(&h, md5.data(), sizeof(h));
    return h;
  }
};

struct StoredFile {
  Md5 main;                       // MD5 of the key
  Md5 file;                       // the file's name: main, or a variant hash
  std::string key;
  std::vector<std::string> tags;
};

struct ZoneIndexStats {
  size_t keys = 0;
  size_t files = 0;
  size_t bytes = 0;
  size_t doubtful = 0;
  bool complete = false;
};

class ZoneIndex {
 public:
  static constexpr size_t kMaxVariants = 64;

  explicit ZoneIndex(size_t maxBytes) : maxBytes_(maxBytes) {}

  // NGINX stored or served this file.
  void record(StoredFile stored);

  // Every file of the key, or nullopt when the index cannot be sure.
  std::optional<std::vector<Md5>> filesOf(const Md5& main) const;
  // Every key (as its MD5) carrying the tag / starting with prefix, or
  // nullopt when the index cannot be sure.
  std::optional<std::vector<Md5>> keysWithTag(std::string_view tag) const;
  std::optional<std::vector<Md5>> keysWithPrefix(std::string_view prefix) const;
  // Every key whose tags (in the order first stored) the predicate accepts,
  // or nullopt when the index cannot be sure.  Reads only: another thread
  // may run it while the loop calls nothing that changes the index.
  using TagsPredicate = std::function<bool(const std::vector<std::string>& tags)>;
  std::optional<std::vector<Md5>> keysWhere(const TagsPredicate& accept) const;
  // Whether a question about tags or prefixes can be answered.
  bool sure() const { return complete_ && doubtful_.empty(); }

  // A purge just removed every file of these keys.
  void forget(const std::vector<Md5>& mains);

  // Reports may have been lost (a worker's connection ended, or a worker
  // announced the zone again): nothing is sure until the next full scan.
  void doubtAll();

  // A full scan starts; reports until finishScan() are replayed on top of it.
  void beginScan();
  // The scan's findings.  complete: it read the whole directory.
  void finishScan(std::vector<StoredFile> found, bool complete);
  bool scanning() const { return scanning_; }

  ZoneIndexStats stats() const;

 private:
  struct Entry {
    std::string key;
    std::vector<Md5> files;
    std::vector<std::string> tags;
    std::list<Md5>::iterator lru;
  };

  void add(StoredFile&& stored);
  void drop(const Md5& main, bool doubt);
  size_t entryBytes(const Entry& entry) const;

  const size_t maxBytes_;
  size_t bytes_ = 0;
  bool complete_ = false;
  bool scanning_ = false;
  bool spoiledDuringScan_ = false;
  bool droppedWhileIncomplete_ = false;
  std::unordered_map<Md5, Entry, Md5Hash> entries_;
  std::unordered_map<std::string, std::unordered_set<Md5, Md5Hash>> tags_;
  std::unordered_set<Md5, Md5Hash> doubtful_;
  std::list<Md5> lru_;  // front: most recently recorded
  std::vector<StoredFile> duringScan_;
};

}  // namespace esi
