#include "variants/purger.h"

#include <algorithm>
#include <utility>

#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "variants/tag_pattern.h"

namespace esi {

const char* purgeKindName(PurgeQuery::Kind kind) {
  switch (kind) {
    case PurgeQuery::Kind::kKey:
      return "exact";
    case PurgeQuery::Kind::kKeyPrefix:
      return "wildcard";
    case PurgeQuery::Kind::kTag:
      return "tag";
    case PurgeQuery::Kind::kTagPattern:
      return "pattern";
  }
  return "unknown";
}

namespace {

// Reports held while a pattern's match reads the index; past this the
// zone is doubted instead, as when a worker loses reports.
constexpr size_t kMaxHeldReports = size_t{1} << 20;

}  // namespace

Purger::~Purger() { close(); }

void Purger::close() {
  for (auto& [name, zone] : zones_) {
    if (zone.scan) zone.scan->progress.cancel = true;
  }
}

void Purger::announce(std::string_view name, std::string_view path, uint64_t indexBytes,
                      bool lostReports, std::vector<std::string> tagHeaders) {
  auto it = zones_.find(name);
  if (it != zones_.end()) {
    if (it->second.path != path) {
      spdlog::warn("zone {}: announced at {} and at {}; keeping the first",
                   name, it->second.path, path);
    }
    if (lostReports) {
      spdlog::info("zone {}: a worker lost cache reports; its next purge reads the directory",
                   name);
      doubt(it->second);
    }
    return;
  }
  Zone& zone = zones_[std::string(name)];
  zone.path = path;
  if (tagHeaders.empty()) {
    zone.tagHeaders = defaultTagHeaders();
  } else {
    zone.tagHeaders = std::move(tagHeaders);
  }
  zone.indexBytes = indexBytes;
  zone.index = std::make_unique<ZoneIndex>(indexBytes);
  spdlog::info("zone {} at {}: building its variant index", name, path);
  startScan(std::string(name), zone);
}

void Purger::connectionEnded(std::string_view name) {
  auto it = zones_.find(name);
  if (it == zones_.end()) return;
  spdlog::info("zone {}: a worker's connection ended with reports or answers unread; its "
               "next purge reads the directory", name);
  doubt(it->second);
}

void Purger::doubt(Zone& zone) {
  if (zone.match) {
    zone.heldDoubt = true;
  } else {
    zone.index->doubtAll();
  }
}

void Purger::stored(std::string_view name, StoredFile file) {
  auto it = zones_.find(name);
  if (it == zones_.end()) return;  // not announced: nothing to keep complete
  Zone& zone = it->second;
  if (!zone.match) {
    zone.index->record(std::move(file));
  } else if (zone.heldReports.size() < kMaxHeldReports) {
    zone.heldReports.push_back(std::move(file));
  } else {
    zone.heldDoubt = true;
  }
}

void Purger::purge(PurgeQuery query, Done done) {
  auto it = zones_.find(query.zone);
  if (it == zones_.end()) {
    done(PurgeOutcome{{}, false, "unknown zone \"" + query.zone + "\""});
    return;
  }
  ++it->second.purges;
  dispatch(it->first, it->second, std::move(query), std::move(done));
}

void Purger::dispatch(const std::string& name, Zone& zone, PurgeQuery query, Done done) {
  if (zone.scan || zone.match) {
    zone.waiting.emplace_back(std::move(query), std::move(done));
    return;
  }
  if (query.kind == PurgeQuery::Kind::kTagPattern) {
    if (zone.index->sure()) {
      startMatch(name, zone, std::move(query), std::move(done), nullptr, false);
      return;
    }
  } else if (auto files = fromIndex(zone, query)) {
    done(PurgeOutcome{std::move(*files), false, {}, false});
    return;
  }
  startScan(name, zone);
  zone.waiting.emplace_back(std::move(query), std::move(done));
}

std::optional<std::vector<Md5>> Purger::fromIndex(Zone& zone, const PurgeQuery& query) {
  std::optional<std::vector<Md5>> keys;
  switch (query.kind) {
    case PurgeQuery::Kind::kKey:
      keys = std::vector<Md5>{md5Of(query.value)};
      break;
    case PurgeQuery::Kind::kKeyPrefix:
      keys = zone.index->keysWithPrefix(query.value);
      break;
    case PurgeQuery::Kind::kTag:
      keys = zone.index->keysWithTag(query.value);
      break;
    case PurgeQuery::Kind::kTagPattern:
      return std::nullopt;  // evaluated on the thread pool: startMatch()
  }
  if (!keys) return std::nullopt;
  std::vector<Md5> files;
  for (const Md5& key : *keys) {
    auto ofKey = zone.index->filesOf(key);
    if (!ofKey) return std::nullopt;
    files.insert(files.end(), ofKey->begin(), ofKey->end());
  }
  // The purge removes them all: provably nothing is left of these keys.
  // A soft one leaves them where they are.
  if (!query.soft) zone.index->forget(*keys);
  return files;
}

void Purger::startScan(const std::string& name, Zone& zone) {
  zone.scan = std::make_unique<Scan>();
  Scan& scan = *zone.scan;
  scan.work.data = &scan;
  scan.purger = this;
  scan.zone = name;
  scan.path = zone.path;
  scan.tagHeaders = zone.tagHeaders;
  scan.startNs = uv_hrtime();
  zone.index->beginScan();
  uv_queue_work(
      loop_, &scan.work,
      [](uv_work_t* work) {
        auto* s = static_cast<Scan*>(work->data);
        s->result = scanZone(s->path, s->progress, s->tagHeaders);
      },
      [](uv_work_t* work, int) {
        auto* s = static_cast<Scan*>(work->data);
        Purger* self = s->purger;
        auto it = self->zones_.find(s->zone);
        self->scanDone(it->first, it->second);
      });
}

void Purger::scanDone(const std::string& name, Zone& zone) {
  std::unique_ptr<Scan> scan = std::move(zone.scan);
  ScanResult& result = scan->result;
  ++zone.scansDone;
  zone.lastError = result.error;
  scanSeconds_.observe(static_cast<double>(uv_hrtime() - scan->startNs) / 1e9);
  if (!result.complete) {
    ++scansFailed_;
    spdlog::error("zone {}: scan of {} failed: {}", name, zone.path, result.error);
  } else {
    spdlog::info("zone {}: {} files indexed ({} unreadable)", name,
                 result.files.size(), result.unreadable);
  }

  // Waiters are answered from what the scan saw plus what was stored
  // meanwhile, which the index holds when it could keep it all; an index
  // too small (or off) answers from the scan alone.
  const auto found = std::make_shared<const std::vector<StoredFile>>(result.files);
  zone.index->finishScan(std::move(result.files), result.complete);

  const ZoneIndexStats s = zone.index->stats();
  if (result.complete && !s.complete && zone.indexBytes > 0 && s.files > 0) {
    // Too small an index is safe (purges read the directory) but slow:
    // say how much would do.
    const uint64_t needed = s.bytes / s.files * found->size() * 5 / 4;
    spdlog::warn("zone {}: esi_purge_index {} holds {} of {} files, so every purge of "
                 "this zone reads its directory; about {}m would hold them all",
                 name, zone.indexBytes, s.files, found->size(), needed / (1 << 20) + 1);
  }

  auto waiting = std::exchange(zone.waiting, {});
  for (auto& [query, done] : waiting) {
    if (zone.match) {
      // a pattern's match reads the index now: the rest wait for it
      zone.waiting.emplace_back(std::move(query), std::move(done));
      continue;
    }
    if (query.kind == PurgeQuery::Kind::kTagPattern && result.complete) {
      startMatch(name, zone, std::move(query), std::move(done),
                 zone.index->sure() ? nullptr : found, true);
      continue;
    }
    PurgeOutcome outcome;
    outcome.scanned = true;
    if (!result.complete) {
      outcome.error = "scan failed: " + result.error;
    } else if (auto files = fromIndex(zone, query)) {
      outcome.files = std::move(*files);
    } else {
      for (const StoredFile& file : *found) {
        const bool match =
            (query.kind == PurgeQuery::Kind::kKey && file.key == query.value) ||
            (query.kind == PurgeQuery::Kind::kKeyPrefix &&
             file.key.compare(0, query.value.size(), query.value) == 0) ||
            (query.kind == PurgeQuery::Kind::kTag &&
             std::find(file.tags.begin(), file.tags.end(), query.value) != file.tags.end());
        if (match) outcome.files.push_back(file.file);
      }
    }
    done(std::move(outcome));
  }
}

void Purger::startMatch(const std::string& name, Zone& zone, PurgeQuery query, Done done,
                        std::shared_ptr<const std::vector<StoredFile>> found, bool scanned) {
  zone.match = std::make_unique<Match>();
  Match& match = *zone.match;
  match.work.data = &match;
  match.purger = this;
  match.zone = name;
  match.query = std::move(query);
  match.done = std::move(done);
  match.index = found ? nullptr : zone.index.get();
  match.found = std::move(found);
  match.scanned = scanned;
  uv_queue_work(
      loop_, &match.work,
      [](uv_work_t* work) {
        auto* m = static_cast<Match*>(work->data);
        m->outcome.scanned = m->scanned;
        const auto pattern = TagPattern::compile(m->query.value, &m->outcome.error);
        if (!pattern) {
          m->outcome.invalid = true;
          return;
        }
        std::string scratch;
        if (m->found) {
          for (const StoredFile& file : *m->found) {
            if (pattern->matches(file.tags, scratch)) m->outcome.files.push_back(file.file);
          }
          return;
        }
        // The index was sure when the match started, and stands still.
        auto keys = m->index->keysWhere(
            [&](const std::vector<std::string>& tags) { return pattern->matches(tags, scratch); });
        if (!keys) return;
        m->keys = std::move(*keys);
        for (const Md5& key : m->keys) {
          if (auto files = m->index->filesOf(key)) {
            m->outcome.files.insert(m->outcome.files.end(), files->begin(), files->end());
          }
        }
      },
      [](uv_work_t* work, int) {
        auto* m = static_cast<Match*>(work->data);
        Purger* self = m->purger;
        auto it = self->zones_.find(m->zone);
        self->matchDone(it->first, it->second);
      });
}

void Purger::matchDone(const std::string& name, Zone& zone) {
  std::unique_ptr<Match> match = std::move(zone.match);
  PurgeOutcome& outcome = match->outcome;
  if (outcome.invalid) {
    spdlog::warn("zone {}: pattern purge refused: {}", name, outcome.error);
  } else {
    spdlog::info("zone {}: pattern purge{} finds {} file(s) in its {}", name,
                 match->query.soft ? " (soft)" : "", outcome.files.size(),
                 match->found ? "directory" : "index");
  }
  // As fromIndex(): nothing is left of the keys a purge removes.  What was
  // reported meanwhile happened after the purge, so it comes after.
  if (!match->query.soft) zone.index->forget(match->keys);
  for (StoredFile& file : zone.heldReports) zone.index->record(std::move(file));
  zone.heldReports.clear();
  if (std::exchange(zone.heldDoubt, false)) zone.index->doubtAll();
  match->done(std::move(outcome));
  auto waiting = std::exchange(zone.waiting, {});
  for (auto& [query, done] : waiting) dispatch(name, zone, std::move(query), std::move(done));
}

nlohmann::json Purger::variants(std::string_view name, std::string_view key) const {
  auto it = zones_.find(name);
  if (it == zones_.end()) return nullptr;
  const auto files = it->second.index->filesOf(md5Of(key));
  nlohmann::json out = {{"zone", it->first},
                        {"key", key},
                        {"main", md5ToHex(md5Of(key))},
                        {"known", files.has_value()}};
  nlohmann::json list = nlohmann::json::array();
  if (files) {
    for (const Md5& file : *files) list.push_back(md5ToHex(file));
  }
  out["files"] = list;
  return out;
}

nlohmann::json Purger::zones() const {
  nlohmann::json out = nlohmann::json::object();
  for (const auto& [name, zone] : zones_) {
    const ZoneIndexStats s = zone.index->stats();
    out[name] = {{"path", zone.path},
                 {"index_bytes_max", zone.indexBytes},
                 {"index_bytes", s.bytes},
                 {"keys", s.keys},
                 {"files", s.files},
                 {"keys_in_doubt", s.doubtful},
                 {"complete", s.complete},
                 {"scanning", zone.scan != nullptr},
                 {"matching", zone.match != nullptr},
                 {"scan_files_read", zone.scan ? zone.scan->progress.files.load() : 0},
                 {"scan_dirs", zone.scan ? zone.scan->progress.dirs.load() : 0},
                 {"scan_dirs_entered", zone.scan ? zone.scan->progress.dirsEntered.load() : 0},
                 {"scans", zone.scansDone},
                 {"purges", zone.purges},
                 {"last_scan_error", zone.lastError}};
  }
  return out;
}

}  // namespace esi
