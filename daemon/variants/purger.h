// Answers what a purge must remove, for every zone the workers announced:
// from the zone's index when it is sure, otherwise after a scan of the
// zone's directory on libuv's thread pool.  A pattern purge is evaluated
// on the thread pool too, over the index (which stands still meanwhile:
// reports wait, and so do the zone's other purges) or over what a scan
// found.  Nothing here ever blocks the loop, and nothing here ever runs on
// an NGINX worker.

#pragma once

#include <uv.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "metrics/histogram.h"
#include "variants/zone_index.h"
#include "variants/zone_scan.h"

namespace esi {

struct PurgeQuery {
  // kTagPattern: value is an RE2 pattern searched in each object's tags
  // joined with commas (tag_pattern.h).
  enum class Kind { kKey, kKeyPrefix, kTag, kTagPattern };
  Kind kind = Kind::kKey;
  std::string zone;
  std::string value;
  bool soft = false;  // the files are marked stale and stay
};

// "exact", "wildcard", "tag": as metrics and the trace name a kind.
const char* purgeKindName(PurgeQuery::Kind kind);

struct PurgeOutcome {
  std::vector<Md5> files;
  bool scanned = false;
  std::string error;
  bool invalid = false;  // error says what is wrong with the query itself
};

class Purger {
 public:
  using Done = std::function<void(PurgeOutcome)>;

  explicit Purger(uv_loop_t* loop) : loop_(loop) {}
  ~Purger();
  Purger(const Purger&) = delete;
  Purger& operator=(const Purger&) = delete;

  // A worker serves this zone.  The first announcement starts a scan that
  // builds its index, as NGINX's cache loader does after a restart.
  // lostReports: the worker dropped reports of files it stored (while esid
  // was away, say), so the index of a known zone is in doubt.  tagHeaders:
  // the response headers that carry the zone's tags, for its scans (empty:
  // defaultTagHeaders()).
  void announce(std::string_view zone, std::string_view path, uint64_t indexBytes,
                bool lostReports, std::vector<std::string> tagHeaders = {});

  // A worker's connection that announced the zone ended with reports esid
  // could not read: the index is in doubt.
  void connectionEnded(std::string_view zone);

  // NGINX stored or served a file of the zone.
  void stored(std::string_view zone, StoredFile file);

  // done runs on the loop, at once or when a scan or a pattern's match
  // finishes.
  void purge(PurgeQuery query, Done done);

  // Asks running scans to stop early; the loop still waits for them.
  void close();

  nlohmann::json zones() const;
  // How long each scan of a zone's directory took, and how many failed.
  const Histogram& scanSeconds() const { return scanSeconds_; }
  uint64_t scansFailed() const { return scansFailed_; }
  // What the index holds for one key: its files, and whether it is sure.
  nlohmann::json variants(std::string_view zone, std::string_view key) const;

 private:
  struct Scan {
    uv_work_t work;
    Purger* purger;
    std::string zone;
    std::string path;
    std::vector<std::string> tagHeaders;
    ScanProgress progress;
    ScanResult result;
    uint64_t startNs = 0;
  };
  // A pattern purge on the thread pool: over the index, which nothing
  // changes until it is done, or over the files a scan found.
  struct Match {
    uv_work_t work;
    Purger* purger;
    std::string zone;
    PurgeQuery query;
    Done done;
    const ZoneIndex* index = nullptr;
    std::shared_ptr<const std::vector<StoredFile>> found;
    bool scanned = false;
    std::vector<Md5> keys;  // the index's keys it matched
    PurgeOutcome outcome;
  };
  struct Zone {
    std::string path;
    std::vector<std::string> tagHeaders;
    uint64_t indexBytes = 0;
    std::unique_ptr<ZoneIndex> index;
    std::unique_ptr<Scan> scan;
    std::unique_ptr<Match> match;
    // What happened to the index while a match read it, applied after.
    std::vector<StoredFile> heldReports;
    bool heldDoubt = false;
    std::vector<std::pair<PurgeQuery, Done>> waiting;
    uint64_t scansDone = 0;
    uint64_t purges = 0;
    std::string lastError;
  };

  // Answers the query, or has it wait for a scan or a match.
  void dispatch(const std::string& name, Zone& zone, PurgeQuery query, Done done);
  void startScan(const std::string& name, Zone& zone);
  void scanDone(const std::string& name, Zone& zone);
  // found: the files a scan found when the index is unsure; else the index.
  void startMatch(const std::string& name, Zone& zone, PurgeQuery query, Done done,
                  std::shared_ptr<const std::vector<StoredFile>> found, bool scanned);
  void matchDone(const std::string& name, Zone& zone);
  void doubt(Zone& zone);
  // The files the query names, per the index; nullopt when it is unsure.
  std::optional<std::vector<Md5>> fromIndex(Zone& zone, const PurgeQuery& query);

  uv_loop_t* loop_;
  std::map<std::string, Zone, std::less<>> zones_;
  Histogram scanSeconds_;
  uint64_t scansFailed_ = 0;
};

}  // namespace esi
