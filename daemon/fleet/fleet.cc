#include "fleet/fleet.h"

#include <hiredis/hiredis.h>

#include <algorithm>
#include <chrono>
#include <random>
#include <stdexcept>

#include <spdlog/spdlog.h>

namespace esi {

namespace {

// Entries read (and applied together) at a time.
constexpr size_t kBatch = 256;
constexpr const char* kBatchText = "256";
// A blocking read waits this long, then reads again (a liveness check too).
constexpr uint64_t kBlockMs = 2000;
// XADDs on the wire at once; beyond, entries wait in the queue.
constexpr size_t kMaxInFlight = 1024;
constexpr uint64_t kHeartbeatMs = 1000;
// The position is written at most this often (and when esid stops): after
// a crash a node replays at most this much again, which purges only again.
constexpr uint64_t kSaveMs = 100;
constexpr int kAttempts = 3;
// Acknowledgements of one purge live this long.
constexpr const char* kAckSeconds = "3600";
// A node whose heartbeat is older than this is shown as away.
constexpr uint64_t kRecentMs = 10000;

uint64_t wallMs() {
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::milliseconds>(
                                   std::chrono::system_clock::now().time_since_epoch())
                                   .count());
}

std::string_view text(const redisReply* r) { return {r->str, r->len}; }

bool isString(const redisReply* r) {
  return r != nullptr && (r->type == REDIS_REPLY_STRING || r->type == REDIS_REPLY_STATUS);
}

using Pairs = std::vector<std::pair<std::string_view, const redisReply*>>;

// A field/value array (XINFO, HGETALL) as pairs; nullopt if it is not one.
std::optional<Pairs> pairs(const redisReply* r) {
  if (r == nullptr || r->type != REDIS_REPLY_ARRAY || r->elements % 2 != 0) return std::nullopt;
  Pairs out;
  for (size_t i = 0; i < r->elements; i += 2) {
    if (!isString(r->element[i])) return std::nullopt;
    out.emplace_back(text(r->element[i]), r->element[i + 1]);
  }
  return out;
}

}  // namespace

Fleet::Fleet(uv_loop_t* loop, FleetOptions options, Apply apply, Zones zones)
    : loop_(loop), options_(std::move(options)), apply_(std::move(apply)),
      zones_(std::move(zones)),
      reader_(loop, options_.redis, "fleet reader",
              {[this] { readNext(); }, [this] { reading_ = waiting_ = false; }}),
      writer_(loop, options_.redis, "fleet writer",
              {[this] {
                 heartbeat();  // listed among the nodes at once
                 flush();
               },
               [this] { queue_.putBack(std::exchange(unanswered_, {})); }}),
      heartbeat_(new uv_timer_t), saveTimer_(new uv_timer_t), queue_(options_.queueLimit) {
  uv_timer_init(loop_, heartbeat_);
  uv_timer_init(loop_, saveTimer_);
  heartbeat_->data = this;
  saveTimer_->data = this;
  // Names this run's purges apart from the last run's: uid = node:boot:n.
  std::random_device random;
  boot_ = std::to_string(random() % 1000000);
}

Fleet::~Fleet() { stop(); }

void Fleet::start() {
  state_.emplace(options_.stateDir, options_.stream);
  if (std::optional<FleetState> stored = state_->load()) {
    position_ = stored->position;
    knownZones_ = std::move(stored->zones);
  }
  if (position_) {
    spdlog::info("fleet: node {} resumes {} after entry {} ({})", options_.node, options_.stream,
                 position_->last.text(), state_->path());
  } else {
    spdlog::info("fleet: node {} joins {} at its end (no {} yet)", options_.node, options_.stream,
                 state_->path());
  }
  started_ = true;
  uv_timer_start(heartbeat_, [](uv_timer_t* t) { static_cast<Fleet*>(t->data)->heartbeat(); },
                 kHeartbeatMs, kHeartbeatMs);
  reader_.start();
  writer_.start();
}

void Fleet::stop() {
  if (stopped_) return;
  stopped_ = true;
  if (dirty_) save();
  reader_.stop();
  writer_.stop();
  closeTimer(heartbeat_);
  closeTimer(saveTimer_);
  if (!queue_.empty() || inFlight_ > 0) {
    spdlog::warn("fleet: stopping with {} purge(s) not appended to {}: the other nodes will "
                 "not see them", queue_.size() + inFlight_, options_.stream);
  }
}

// --- Reading ---------------------------------------------------------------

void Fleet::readNext() {
  if (stopped_ || !reader_.ready() || reading_ || waiting_ || applying_ > 0 ||
      !awaitingWorkers_.empty()) {
    return;
  }
  const std::vector<std::string> served = zones_();
  if (served.empty()) {
    if (!parked_) spdlog::info("fleet: waiting for an NGINX worker before reading {}", options_.stream);
    parked_ = true;
    return;
  }
  parked_ = false;
  noteZones(served);
  if (!position_) {
    locate();
    return;
  }
  // The stream's counters and the entries after ours in one transaction:
  // the gap check and the read see the same stream.
  reading_ = true;
  const auto queued = [this](const redisReply* r) {
    if (r != nullptr && r->type == REDIS_REPLY_ERROR) reader_.drop("MULTI refused: " + std::string(text(r)));
  };
  reader_.command({"MULTI"}, queued);
  reader_.command({"XINFO", "STREAM", options_.stream}, queued);
  reader_.command({"XREAD", "COUNT", kBatchText, "STREAMS", options_.stream, position_->last.text()},
                  queued);
  reader_.command({"EXEC"}, [this](const redisReply* r) { onRead(r); });
}

// A node without a position starts at the stream's end.
void Fleet::locate() {
  reading_ = true;
  reader_.command({"XINFO", "STREAM", options_.stream}, [this](const redisReply* r) {
    if (r == nullptr) return;
    reading_ = false;
    FleetPosition start;
    if (r->type != REDIS_REPLY_ERROR) {
      const auto fields = pairs(r);
      if (!fields) {
        reader_.drop("XINFO STREAM answered garbage");
        return;
      }
      for (const auto& [name, value] : *fields) {
        if (name == "last-generated-id" && isString(value)) {
          start.last = StreamId::parse(text(value)).value_or(StreamId{});
        } else if (name == "entries-added" && value->type == REDIS_REPLY_INTEGER) {
          start.ordinal = static_cast<uint64_t>(value->integer);
        }
      }
    }
    if (!start.ordinal) start.ordinal = 0;
    position_ = start;
    spdlog::info("fleet: starting after entry {} of {}", start.last.text(), options_.stream);
    save();
    readNext();
  });
}

void Fleet::onRead(const redisReply* reply) {
  if (reply == nullptr) return;  // the connection went; it reads again once back
  reading_ = false;
  if (reply->type != REDIS_REPLY_ARRAY || reply->elements != 2) {
    reader_.drop("the read transaction answered garbage");
    return;
  }
  const redisReply* infoReply = reply->element[0];
  const redisReply* entries = reply->element[1];

  StreamInfo info;
  if (infoReply->type == REDIS_REPLY_ERROR &&
      text(infoReply).find("no such key") == std::string_view::npos) {
    reader_.drop("XINFO STREAM refused: " + std::string(text(infoReply)));
    return;
  }
  if (infoReply->type != REDIS_REPLY_ERROR) {
    const auto fields = pairs(infoReply);
    if (!fields) {
      reader_.drop("XINFO STREAM answered garbage");
      return;
    }
    info.exists = true;
    for (const auto& [name, value] : *fields) {
      if (name == "length" && value->type == REDIS_REPLY_INTEGER) {
        info.length = static_cast<uint64_t>(value->integer);
      } else if (name == "entries-added" && value->type == REDIS_REPLY_INTEGER) {
        info.entriesAdded = static_cast<uint64_t>(value->integer);
      } else if (name == "last-generated-id" && isString(value)) {
        info.lastGenerated = StreamId::parse(text(value)).value_or(StreamId{});
      }
    }
  }

  FleetPosition& at = *position_;
  // [[stream, [[id, [field, value, ...]], ...]]] or nil.
  std::vector<std::pair<StreamId, const redisReply*>> read;
  if (entries->type != REDIS_REPLY_NIL) {
    if (entries->type != REDIS_REPLY_ARRAY || entries->elements != 1 ||
        entries->element[0]->type != REDIS_REPLY_ARRAY || entries->element[0]->elements != 2 ||
        entries->element[0]->element[1]->type != REDIS_REPLY_ARRAY) {
      reader_.drop("XREAD answered garbage");
      return;
    }
    const redisReply* list = entries->element[0]->element[1];
    for (size_t i = 0; i < list->elements; ++i) {
      const redisReply* e = list->element[i];
      std::optional<StreamId> id;
      if (e->type == REDIS_REPLY_ARRAY && e->elements == 2 && isString(e->element[0])) {
        id = StreamId::parse(text(e->element[0]));
      }
      if (!id || *id <= (read.empty() ? at.last : read.back().first)) {
        reader_.drop("XREAD answered an entry out of order or without an ID");
        return;
      }
      read.emplace_back(*id, e->element[1]);
    }
  }

  // From here on purges are ordered, and may complete at once.
  issuing_ = true;
  const std::optional<StreamId> wasHeldAt = std::exchange(heldAt_, std::nullopt);
  const StreamId origin{};
  if ((!info.exists && at.last != origin) || (info.exists && info.lastGenerated < at.last)) {
    // The stream is not the one this node read: Redis lost it or it was
    // deleted.  What it held after our position is unknown.
    gap(0, "the stream " + options_.stream + " was reset (it ends at " + info.lastGenerated.text() +
               ", this node had applied up to " + at.last.text() + ")");
    at = FleetPosition{origin, 0};
    positionChanged();
    batchEnd_ = at;
    batchFull_ = true;  // read again at once, from the start
    issuing_ = false;
    if (applying_ == 0) finishBatch();
    return;
  }
  if (at.ordinal) {
    if (const uint64_t lost = lostEntries(*at.ordinal, info.entriesAdded, info.length); lost > 0) {
      gap(lost, std::to_string(lost) + " entries of " + options_.stream +
                    " were trimmed before this node read them");
      at.ordinal = info.entriesAdded - info.length;
      positionChanged();
    }
  }

  batch_.clear();
  // Read now, not when the read was sent: NGINX may have gone meanwhile.
  const std::vector<std::string> served = zones_();
  noteZones(served);
  size_t taken = 0;  // entries read that this batch moves past
  for (const auto& [id, fieldsReply] : read) {
    std::vector<std::pair<std::string_view, std::string_view>> fields;
    bool parsed = fieldsReply->type == REDIS_REPLY_ARRAY && fieldsReply->elements % 2 == 0;
    for (size_t i = 0; parsed && i < fieldsReply->elements; i += 2) {
      parsed = isString(fieldsReply->element[i]) && isString(fieldsReply->element[i + 1]);
      if (parsed) fields.emplace_back(text(fieldsReply->element[i]), text(fieldsReply->element[i + 1]));
    }
    std::string why = "not a list of fields";
    std::optional<FleetEntry> entry = parsed ? decodeEntry(fields, &why) : std::nullopt;
    if (!entry) {
      spdlog::warn("fleet: skipping entry {} of {}: {}", id.text(), options_.stream, why);
      ++skipped_;
    } else if (entry->node == options_.node) {
      ++own_;  // carried out here already
    } else if (awaitsNginx(entry->query.zone, served)) {
      // The position stays before it: applied, in order, once NGINX is back.
      if (wasHeldAt != id) {
        spdlog::warn("fleet: entry {} from {} waits: no NGINX worker here serves zone \"{}\" "
                     "now; it and the entries after it are applied once one does",
                     id.text(), entry->node, entry->query.zone);
      }
      heldAt_ = id;
      heldZone_ = entry->query.zone;
      break;
    } else if (std::find(served.begin(), served.end(), entry->query.zone) == served.end()) {
      spdlog::warn("fleet: skipping entry {} from {}: no NGINX worker here serves zone \"{}\"",
                   id.text(), entry->node, entry->query.zone);
      ++skipped_;
    } else {
      batch_.push_back(Item{id, std::move(*entry)});
    }
    ++taken;
  }

  batchEnd_ = at;
  if (taken > 0) {
    batchEnd_.last = read[taken - 1].first;
    if (batchEnd_.ordinal) *batchEnd_.ordinal += taken;
  }
  batchFull_ = !heldAt_ && read.size() == kBatch;
  // A hand-set position learns its ordinal once it has read to the end.
  if (!batchEnd_.ordinal && !batchFull_ && !heldAt_ && info.exists) {
    batchEnd_.ordinal = info.entriesAdded;
  }
  lagEntries_ = batchEnd_.ordinal && info.entriesAdded > *batchEnd_.ordinal
                    ? info.entriesAdded - *batchEnd_.ordinal
                    : 0;
  lagMs_ = info.lastGenerated.ms > batchEnd_.last.ms ? info.lastGenerated.ms - batchEnd_.last.ms : 0;

  for (size_t i = 0; i < batch_.size(); ++i) applyItem(i);
  issuing_ = false;
  if (applying_ == 0 && awaitingWorkers_.empty()) finishBatch();
}

void Fleet::gap(uint64_t lost, const std::string& why) {
  ++gaps_;
  lost_ += lost;
  lastGap_ = why;
  const std::vector<std::string> zones = zones_();
  std::string names;
  for (const std::string& zone : zones) names += (names.empty() ? "" : ", ") + zone;
  if (options_.onGap == GapAction::kLog) {
    spdlog::error("fleet: purges lost: {}; fleet_on_gap = log, so nothing is purged here: zones "
                  "{} may serve objects the fleet purged", why, names);
    return;
  }
  spdlog::error("fleet: purges lost: {}; purging zones {} entirely (fleet_on_gap = purge_all)",
                why, names);
  for (const std::string& zone : zones) {
    ++applying_;
    apply_(PurgeQuery{PurgeQuery::Kind::kKeyPrefix, zone, ""},
           [this, zone](uint64_t count, const std::string& error) {
             --applying_;
             if (error.empty()) {
               spdlog::warn("fleet: zone {} purged entirely after the gap: {} file(s)", zone, count);
             } else {
               spdlog::error("fleet: the purge of zone {} after the gap failed: {}", zone, error);
             }
             if (!issuing_ && applying_ == 0 && awaitingWorkers_.empty()) finishBatch();
           });
  }
}

void Fleet::applyItem(size_t index) {
  ++applying_;
  apply_(batch_[index].entry.query, [this, index](uint64_t count, const std::string& error) {
    --applying_;
    itemDone(index, count, error);
  });
}

void Fleet::itemDone(size_t index, uint64_t count, const std::string& error) {
  Item& item = batch_[index];
  if (error.empty()) {
    ++applied_;
    spdlog::debug("fleet: entry {} from {} applied: {} file(s)", item.id.text(), item.entry.node,
                  count);
    if (item.entry.askAcks) ack(item.entry.uid, count);
  } else if (awaitsNginx(item.entry.query.zone, zones_())) {
    awaitingWorkers_.push_back(index);  // the workers went; they come back
  } else if (++item.attempts < kAttempts) {
    applyItem(index);
    return;
  } else {
    ++failed_;
    spdlog::error("fleet: entry {} from {} ({} \"{}\" in zone {}) failed {} times, skipped: {}",
                  item.id.text(), item.entry.node,
                  entryKindName(item.entry.query.kind),
                  item.entry.query.value, item.entry.query.zone, kAttempts, error);
  }
  if (!issuing_ && applying_ == 0 && awaitingWorkers_.empty()) finishBatch();
}

void Fleet::workersChanged() {
  if (stopped_ || zones_().empty()) return;
  noteZones(zones_());
  if (!awaitingWorkers_.empty()) {
    const std::vector<size_t> retry = std::exchange(awaitingWorkers_, {});
    issuing_ = true;
    for (size_t index : retry) applyItem(index);
    issuing_ = false;
    if (applying_ == 0 && awaitingWorkers_.empty()) finishBatch();
    return;
  }
  if (parked_) readNext();
}

void Fleet::finishBatch() {
  batch_.clear();
  if (position_ && (batchEnd_.last != position_->last || batchEnd_.ordinal != position_->ordinal)) {
    *position_ = batchEnd_;
    positionChanged();
  }
  if (heldAt_) {
    parked_ = true;  // until a worker announces a zone (workersChanged)
  } else if (batchFull_) {
    batchFull_ = false;
    readNext();
  } else {
    waitForEntries();
  }
}

// Blocks on the reader connection until an entry follows ours; then reads
// it (and the stream's counters) in a transaction.
void Fleet::waitForEntries() {
  if (stopped_ || !reader_.ready() || waiting_ || reading_) return;
  waiting_ = true;
  reader_.command({"XREAD", "COUNT", "1", "BLOCK", std::to_string(kBlockMs), "STREAMS",
                   options_.stream, position_->last.text()},
                  [this](const redisReply* r) {
                    if (r == nullptr) return;
                    waiting_ = false;
                    if (r->type == REDIS_REPLY_ERROR) {
                      reader_.drop("XREAD refused: " + std::string(text(r)));
                      return;
                    }
                    readNext();
                  },
                  kBlockMs + RedisLink::kCommandTimeoutMs);
}

void Fleet::positionChanged() {
  dirty_ = true;
  if (uv_is_active(reinterpret_cast<uv_handle_t*>(saveTimer_)) == 0 && !stopped_) {
    uv_timer_start(saveTimer_, [](uv_timer_t* t) { static_cast<Fleet*>(t->data)->save(); },
                   kSaveMs, 0);
  }
}

void Fleet::noteZones(const std::vector<std::string>& served) {
  bool added = false;
  for (const std::string& zone : served) added = knownZones_.insert(zone).second || added;
  if (added) positionChanged();
}

bool Fleet::awaitsNginx(const std::string& zone, const std::vector<std::string>& served) const {
  if (std::find(served.begin(), served.end(), zone) != served.end()) return false;
  return served.empty() || knownZones_.count(zone) > 0;
}

void Fleet::save() {
  if (!position_) return;
  try {
    state_->save(FleetState{*position_, knownZones_});
    dirty_ = false;
    lastSaveError_.clear();
  } catch (const std::exception& e) {
    if (lastSaveError_ != e.what()) {
      spdlog::error("fleet: cannot keep the position in {}: {}; a restart would replay from "
                    "an older one", state_->path(), e.what());
    }
    lastSaveError_ = e.what();
  }
}

// --- Publishing --------------------------------------------------------------

Publication Fleet::published(const PurgeQuery& query, uint64_t count, bool askAcks) {
  FleetEntry entry{options_.node, query,
                   options_.node + ":" + boot_ + ":" + std::to_string(++sequence_), askAcks};
  if (std::string why = checkEntry(entry); !why.empty()) {
    ++refused_;
    spdlog::warn("fleet: the purge of \"{}\" in zone {} is not published: {}",
                 query.value.substr(0, 128), query.zone, why);
    return {"refused", ""};
  }
  if (askAcks) originCounts_[entry.uid] = count;
  const std::string uid = entry.uid;
  if (queue_.empty() && send(entry)) return {"published", uid};
  queue_.push(std::move(entry));
  return {"pending", uid};
}

bool Fleet::send(const FleetEntry& entry) {
  if (stopped_ || !writer_.ready() || inFlight_ >= kMaxInFlight) return false;
  std::vector<std::string> args = {"XADD", options_.stream, "MAXLEN", "~",
                                   std::to_string(options_.maxEntries), "*"};
  for (auto& [name, value] : encodeEntry(entry)) {
    args.push_back(std::move(name));
    args.push_back(std::move(value));
  }
  if (!writer_.command(args, [this, entry](const redisReply* r) { onAdded(entry, r); })) return false;
  ++inFlight_;
  return true;
}

void Fleet::onAdded(const FleetEntry& entry, const redisReply* reply) {
  --inFlight_;
  if (reply == nullptr) {
    unanswered_.push_back(entry);  // back in the queue when the writer reconnects
    return;
  }
  if (reply->type != REDIS_REPLY_STRING) {
    unanswered_.push_back(entry);
    writer_.drop(reply->type == REDIS_REPLY_ERROR ? "XADD refused: " + std::string(text(reply))
                                                  : "XADD answered garbage");
    return;
  }
  ++published_;
  if (auto it = originCounts_.find(entry.uid); it != originCounts_.end()) {
    ack(entry.uid, it->second);
    originCounts_.erase(it);
  }
  flush();
}

void Fleet::flush() {
  if (!unanswered_.empty()) queue_.putBack(std::exchange(unanswered_, {}));
  if (!writer_.ready()) return;
  if (std::set<std::string> lost = queue_.takeLostZones(); !lost.empty()) {
    std::vector<FleetEntry> whole;
    for (const std::string& zone : lost) {
      spdlog::error("fleet: purges of zone {} were dropped from the full queue ({} entries) "
                    "while Redis was away{}", zone, options_.queueLimit,
                    options_.onGap == GapAction::kPurgeAll
                        ? ": asking every node to purge the zone entirely"
                        : "");
      if (options_.onGap == GapAction::kPurgeAll) {
        whole.push_back(FleetEntry{options_.node, PurgeQuery{PurgeQuery::Kind::kKeyPrefix, zone, ""},
                                   options_.node + ":" + boot_ + ":" + std::to_string(++sequence_)});
      }
    }
    queue_.putBack(std::move(whole));
  }
  while (!queue_.empty()) {
    FleetEntry entry = queue_.pop();
    if (!send(entry)) {
      queue_.putBack({std::move(entry)});
      return;
    }
  }
}

void Fleet::ack(const std::string& uid, uint64_t count) {
  const std::string name = key("acks:" + uid);
  writer_.command({"HSET", name, options_.node, std::to_string(count)}, [](const redisReply*) {});
  writer_.command({"EXPIRE", name, kAckSeconds}, [](const redisReply*) {});
}

void Fleet::heartbeat() {
  if (!writer_.ready()) return;
  nlohmann::json beat = {{"at", wallMs()},
                         {"last", position_ ? position_->last.text() : ""},
                         {"ordinal", position_ && position_->ordinal ? *position_->ordinal : 0},
                         {"applied", applied_},
                         {"published", published_},
                         {"pending", queue_.size()},
                         {"gaps", gaps_},
                         {"lag_entries", lagEntries_}};
  // A write every second: a primary demoted to a read-only replica under
  // this connection is found out within one, even when no purge comes.
  writer_.command({"HSET", key("nodes"), options_.node, beat.dump()}, [this](const redisReply* r) {
    if (r != nullptr && r->type == REDIS_REPLY_ERROR && text(r).substr(0, 8) == "READONLY") {
      writer_.drop("HSET refused: " + std::string(text(r)));
    }
  });
}

// --- Views -------------------------------------------------------------------

nlohmann::json Fleet::stats() const {
  return {{"fleet_connected", reader_.ready() && writer_.ready() ? 1 : 0},
          {"fleet_published", published_},
          {"fleet_pending", queue_.size() + inFlight_},
          {"fleet_applied", applied_},
          {"fleet_own", own_},
          {"fleet_skipped", skipped_},
          {"fleet_failed", failed_},
          {"fleet_refused", refused_},
          {"fleet_dropped", queue_.dropped()},
          {"fleet_gaps", gaps_},
          {"fleet_lost", lost_},
          {"fleet_lag_entries", lagEntries_},
          {"fleet_lag_ms", lagMs_}};
}

void Fleet::describe(const Answer& answer) {
  nlohmann::json self = {{"node", options_.node},
                         {"stream", options_.stream},
                         {"redis", options_.redis.text()},
                         {"tls", options_.redis.tls},
                         {"connected", reader_.ready() && writer_.ready()},
                         {"last", position_ ? position_->last.text() : ""},
                         {"state_file", state_ ? state_->path() : ""},
                         {"on_gap", options_.onGap == GapAction::kLog ? "log" : "purge_all"},
                         {"last_gap", lastGap_},
                         {"waiting_at", heldAt_ ? heldAt_->text() : ""},
                         {"waiting_zone", heldAt_ ? heldZone_ : ""},
                         {"stats", stats()},
                         {"nodes", nlohmann::json::array()}};
  if (!writer_.ready()) {
    answer(std::move(self));
    return;
  }
  auto info = std::make_shared<StreamInfo>();
  writer_.command({"XINFO", "STREAM", options_.stream}, [info](const redisReply* r) {
    const auto fields = pairs(r);
    if (!fields) return;
    info->exists = true;
    for (const auto& [name, value] : *fields) {
      if (name == "entries-added" && value->type == REDIS_REPLY_INTEGER) {
        info->entriesAdded = static_cast<uint64_t>(value->integer);
      } else if (name == "length" && value->type == REDIS_REPLY_INTEGER) {
        info->length = static_cast<uint64_t>(value->integer);
      } else if (name == "last-generated-id" && isString(value)) {
        info->lastGenerated = StreamId::parse(text(value)).value_or(StreamId{});
      }
    }
  });
  const bool sent = writer_.command(
      {"HGETALL", key("nodes")}, [info, self, answer](const redisReply* r) mutable {
        self["stream_entries"] = info->length;
        self["stream_entries_added"] = info->entriesAdded;
        self["stream_last"] = info->lastGenerated.text();
        const uint64_t now = wallMs();
        for (const auto& [name, value] : pairs(r).value_or(Pairs{})) {
          if (!isString(value)) continue;
          const nlohmann::json beat = nlohmann::json::parse(text(value), nullptr, false);
          if (!beat.is_object()) continue;
          const uint64_t at = beat.value("at", uint64_t{0});
          const uint64_t ordinal = beat.value("ordinal", uint64_t{0});
          self["nodes"].push_back(
              {{"node", name},
               {"last", beat.value("last", "")},
               {"lag_entries", info->entriesAdded > ordinal ? info->entriesAdded - ordinal : 0},
               {"seen_ms_ago", now > at ? now - at : 0},
               {"recent", now < at + kRecentMs},
               {"applied", beat.value("applied", uint64_t{0})},
               {"pending", beat.value("pending", uint64_t{0})},
               {"gaps", beat.value("gaps", uint64_t{0})}});
        }
        answer(std::move(self));
      });
  if (!sent) answer(std::move(self));
}

void Fleet::acks(const std::string& uid, const Answer& answer) {
  const bool sent = writer_.command({"HGETALL", key("acks:" + uid)}, [answer](const redisReply* r) {
    nlohmann::json out = {{"acks", nlohmann::json::object()}};
    for (const auto& [node, count] : pairs(r).value_or(Pairs{})) {
      if (isString(count)) out["acks"][std::string(node)] = std::string(text(count));
    }
    answer(std::move(out));
  });
  if (!sent) answer({{"error", "Redis is not reachable now"}});
}

}  // namespace esi
