// The fleet: every esid of a site's NGINX servers on one Redis stream, so
// that a purge carried out at one node reaches every other.
//
// A node appends each purge it carried out (published()) to the stream,
// once, with its zone, kind, value and its own name; while Redis is away
// the entries wait in a bounded queue and go out, in order, when it is
// back.  Every node reads the stream from the last entry it applied (kept
// in state_dir, so a node that was down replays what it missed) and has
// each other node's entry carried out on its own zones by the Apply
// callback (esid: PurgeOrders::order, as `esictl purge` does).  A node that
// finds entries it needed already trimmed from the stream has lost purges:
// it says so and, with fleet_on_gap = purge_all, purges the zones whole.
//
// Redis is never waited for: published() returns at once, reading runs on
// the loop, and both connections reconnect by themselves (RedisLink).

#pragma once

#include <uv.h>

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "fleet/entry.h"
#include "fleet/pending_queue.h"
#include "fleet/redis_link.h"
#include "fleet/state_file.h"

struct redisReply;

namespace esi {

enum class GapAction { kPurgeAll, kLog };

struct FleetOptions {
  RedisAddress redis;
  std::string node;                    // fleet_node: this node's name
  std::string stream = "esi:purges";   // fleet_stream
  std::string stateDir = "/var/lib/esid";
  GapAction onGap = GapAction::kPurgeAll;
  uint64_t maxEntries = 100000;        // XADD MAXLEN ~: what the stream keeps
  size_t queueLimit = 10000;           // entries waiting while Redis is away
};

// What became of a purge in the fleet: status "published" (handed to a live
// connection to a primary that answered on it; kept until Redis answers the
// XADD, and appended again should it refuse it), "pending" (queued until
// such a connection is back) or "refused"
// (not an entry the others could take, see checkEntry); uid names it for
// acknowledgements.
struct Publication {
  std::string status;
  std::string uid;
};

class Fleet {
 public:
  // The outcome of one applied entry: files removed, or why not.
  using Applied = std::function<void(uint64_t count, const std::string& error)>;
  // Carries a purge out on this node's zones; done runs once, maybe at once.
  using Apply = std::function<void(const PurgeQuery& query, Applied done)>;
  // The zones this node's NGINX workers serve now; empty: none attached
  // yet, and the stream waits (workersChanged() resumes it).  An entry for
  // a zone no worker serves now waits too, when this node's NGINX served
  // that zone before (kept in the state file): NGINX is stopped or
  // restarting, and the entry is applied, in order, once it is back.  An
  // entry for a zone this node never served is skipped.
  using Zones = std::function<std::vector<std::string>()>;
  using Answer = std::function<void(nlohmann::json)>;

  Fleet(uv_loop_t* loop, FleetOptions options, Apply apply, Zones zones);
  ~Fleet();
  Fleet(const Fleet&) = delete;
  Fleet& operator=(const Fleet&) = delete;

  // Reads the position and connects.  Throws std::runtime_error when the
  // state file cannot be read or state_dir cannot be written, or is not
  // esid's alone (StateFile).
  void start();
  // Saves the position and closes both connections.
  void stop();

  // A purge was carried out here (count files removed): tell the fleet.
  Publication published(const PurgeQuery& query, uint64_t count, bool askAcks);

  // A worker announced a zone: entries waiting for one may go on.
  void workersChanged();

  // Counters for `esictl stats`, named fleet_*.
  nlohmann::json stats() const;
  // `esictl fleet`: this node, and every node's last heartbeat from Redis.
  void describe(const Answer& answer);
  // Which nodes acknowledged the purge uid, with their counts.
  void acks(const std::string& uid, const Answer& answer);

  const FleetOptions& options() const { return options_; }

 private:
  struct Item {
    StreamId id;
    FleetEntry entry;
    int attempts = 0;
  };
  struct StreamInfo {
    bool exists = false;
    uint64_t length = 0;
    uint64_t entriesAdded = 0;
    StreamId lastGenerated;
  };

  // Reading.
  void readNext();
  void locate();
  void onRead(const redisReply* reply);
  void waitForEntries();
  void gap(uint64_t lost, const std::string& why);
  void applyItem(size_t index);
  void itemDone(size_t index, uint64_t count, const std::string& error);
  void finishBatch();
  void positionChanged();
  void save();
  // Remembers the zones served now among this node's; true if one is new.
  void noteZones(const std::vector<std::string>& served);
  // An entry for zone must wait for this node's NGINX to serve it again.
  bool awaitsNginx(const std::string& zone, const std::vector<std::string>& served) const;

  // Publishing.
  bool send(const FleetEntry& entry);
  void onAdded(const FleetEntry& entry, const redisReply* reply);
  void flush();
  void heartbeat();
  void ack(const std::string& uid, uint64_t count);
  std::string key(const std::string& suffix) const { return options_.stream + ":" + suffix; }

  uv_loop_t* loop_;
  FleetOptions options_;
  Apply apply_;
  Zones zones_;
  std::optional<StateFile> state_;  // from start() on
  RedisLink reader_;
  RedisLink writer_;
  uv_timer_t* heartbeat_;
  uv_timer_t* saveTimer_;
  bool started_ = false;
  bool stopped_ = false;

  // Reading: the position, the read or wait under way, the batch applying.
  std::optional<FleetPosition> position_;
  bool reading_ = false;
  bool waiting_ = false;
  bool parked_ = false;  // no worker serves a zone yet, or the zone of heldAt_
  std::set<std::string> knownZones_;  // served here since the state file began
  std::optional<StreamId> heldAt_;    // the entry the stream waits at
  std::string heldZone_;              // and its zone
  std::vector<Item> batch_;
  size_t applying_ = 0;
  bool issuing_ = false;
  std::vector<size_t> awaitingWorkers_;
  FleetPosition batchEnd_;
  bool batchFull_ = false;
  bool dirty_ = false;
  std::string lastSaveError_;

  // Publishing.
  PendingQueue queue_;
  std::vector<FleetEntry> unanswered_;  // sent, then the connection went
  size_t inFlight_ = 0;
  std::map<std::string, uint64_t> originCounts_;  // uid -> count, for acks
  std::string boot_;
  uint64_t sequence_ = 0;

  // Counters.
  uint64_t published_ = 0;
  uint64_t applied_ = 0;
  uint64_t own_ = 0;
  uint64_t skipped_ = 0;
  uint64_t failed_ = 0;
  uint64_t gaps_ = 0;
  uint64_t lost_ = 0;
  uint64_t refused_ = 0;
  uint64_t lagEntries_ = 0;
  uint64_t lagMs_ = 0;
  std::string lastGap_;
};

}  // namespace esi
