#include "variants/zone_index.h"

#include <algorithm>

namespace esi {

namespace {

// Reports buffered while a scan runs; past this the scan cannot be trusted
// to end complete, and the zone stays unknown until the next one.
constexpr size_t kMaxReportsDuringScan = 1 << 20;
// Keys in doubt past which the whole zone is simply unknown.
constexpr size_t kMaxDoubtful = 4096;
constexpr size_t kEntryOverhead = 128;

}  // namespace

void ZoneIndex::record(StoredFile stored) {
  if (scanning_) {
    if (duringScan_.size() < kMaxReportsDuringScan) {
      duringScan_.push_back(stored);
    } else {
      spoiledDuringScan_ = true;
    }
  }
  add(std::move(stored));
}

void ZoneIndex::add(StoredFile&& stored) {
  auto [it, fresh] = entries_.try_emplace(stored.main);
  Entry& entry = it->second;
  if (fresh) {
    entry.key = std::move(stored.key);
    lru_.push_front(stored.main);
    entry.lru = lru_.begin();
  } else {
    bytes_ -= entryBytes(entry);
    lru_.splice(lru_.begin(), lru_, entry.lru);
  }
  if (std::find(entry.files.begin(), entry.files.end(), stored.file) == entry.files.end()) {
    entry.files.push_back(stored.file);
  }
  for (std::string& tag : stored.tags) {
    if (std::find(entry.tags.begin(), entry.tags.end(), tag) == entry.tags.end()) {
      tags_[tag].insert(stored.main);
      entry.tags.push_back(std::move(tag));
    }
  }
  bytes_ += entryBytes(entry);

  if (entry.files.size() > kMaxVariants) {
    drop(stored.main, true);
  }
  while (bytes_ > maxBytes_ && !lru_.empty()) {
    const Md5 victim = lru_.back();  // drop() erases the list node
    drop(victim, true);
  }
}

void ZoneIndex::drop(const Md5& main, bool doubt) {
  auto it = entries_.find(main);
  if (it == entries_.end()) return;
  for (const std::string& tag : it->second.tags) {
    auto t = tags_.find(tag);
    t->second.erase(main);
    if (t->second.empty()) tags_.erase(t);
  }
  bytes_ -= entryBytes(it->second);
  lru_.erase(it->second.lru);
  entries_.erase(it);
  if (!doubt) return;
  if (complete_) {
    doubtful_.insert(main);
    if (doubtful_.size() > kMaxDoubtful) {
      complete_ = false;
      doubtful_.clear();
    }
  } else {
    droppedWhileIncomplete_ = true;
  }
}

size_t ZoneIndex::entryBytes(const Entry& entry) const {
  size_t bytes = kEntryOverhead + entry.key.size() + entry.files.size() * sizeof(Md5);
  for (const std::string& tag : entry.tags) bytes += tag.size() + sizeof(std::string);
  return bytes;
}

std::optional<std::vector<Md5>> ZoneIndex::filesOf(const Md5& main) const {
  if (!complete_ || doubtful_.count(main) != 0) return std::nullopt;
  auto it = entries_.find(main);
  if (it == entries_.end()) return std::vector<Md5>{};
  return it->second.files;
}

std::optional<std::vector<Md5>> ZoneIndex::keysWithTag(std::string_view tag) const {
  if (!sure()) return std::nullopt;
  auto t = tags_.find(std::string(tag));
  if (t == tags_.end()) return std::vector<Md5>{};
  return std::vector<Md5>(t->second.begin(), t->second.end());
}

std::optional<std::vector<Md5>> ZoneIndex::keysWithPrefix(std::string_view prefix) const {
  if (!sure()) return std::nullopt;
  std::vector<Md5> keys;
  for (const auto& [main, entry] : entries_) {
    if (std::string_view(entry.key).substr(0, prefix.size()) == prefix) keys.push_back(main);
  }
  return keys;
}

std::optional<std::vector<Md5>> ZoneIndex::keysWhere(const TagsPredicate& accept) const {
  if (!sure()) return std::nullopt;
  std::vector<Md5> keys;
  for (const auto& [main, entry] : entries_) {
    if (accept(entry.tags)) keys.push_back(main);
  }
  return keys;
}

void ZoneIndex::forget(const std::vector<Md5>& mains) {
  for (const Md5& main : mains) {
    drop(main, false);
    doubtful_.erase(main);  // provably nothing left of it
  }
}

void ZoneIndex::doubtAll() {
  if (scanning_) spoiledDuringScan_ = true;
  complete_ = false;
  doubtful_.clear();
}

void ZoneIndex::beginScan() {
  scanning_ = true;
  spoiledDuringScan_ = false;
  duringScan_.clear();
}

void ZoneIndex::finishScan(std::vector<StoredFile> found, bool complete) {
  entries_.clear();
  tags_.clear();
  lru_.clear();
  doubtful_.clear();
  bytes_ = 0;
  complete_ = false;
  droppedWhileIncomplete_ = false;
  for (StoredFile& file : found) add(std::move(file));
  for (StoredFile& file : duringScan_) add(std::move(file));
  duringScan_.clear();
  scanning_ = false;
  // A key dropped while rebuilding left no doubt behind to answer with.
  complete_ = complete && !spoiledDuringScan_ && !droppedWhileIncomplete_;
}

ZoneIndexStats ZoneIndex::stats() const {
  ZoneIndexStats s;
  s.keys = entries_.size();
  for (const auto& [main, entry] : entries_) s.files += entry.files.size();
  s.bytes = bytes_;
  s.doubtful = doubtful_.size();
  s.complete = complete_;
  return s;
}

}  // namespace esi
