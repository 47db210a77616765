// WorkerSession: purges (the connector's ngx_http_esi_purge.c): a
// worker's purge answered with its files, and the orders (esictl, the fleet)
// a worker carries out as its own.

#include "transport/worker_session.h"

#include <algorithm>

#include <capnp/message.h>

#include "esi.capnp.h"
#include "transport/worker_session_wire.h"

namespace esi {

using namespace session;  // worker_session_wire.h

namespace {

// File names per Purged message: 256 KiB, well inside the smallest ring.
constexpr size_t kFilesPerPurged = size_t{16} * 1024;

// Counts and traces a purge once esid answered it.
void notePurge(Stats& stats, TraceRing* trace, const PurgeQuery& query,
               const PurgeOutcome& outcome, uint64_t startNs) {
  const uint64_t elapsedNs = uv_hrtime() - startNs;
  stats.purgeSeconds.observe(static_cast<double>(elapsedNs) / 1e9);
  if (!outcome.error.empty()) {
    ++stats.purgeErrors;
  } else {
    ++stats.purges[static_cast<size_t>(query.kind)][query.soft ? 1 : 0][outcome.scanned ? 1 : 0];
  }
  if (trace == nullptr) return;
  TraceEntry entry;
  entry.kind = TraceEntry::Kind::kPurge;
  entry.url = std::string_view(query.value).substr(0, TraceRing::kMaxUrlBytes);
  entry.how = std::string(query.soft ? "soft " : "") + purgeKindName(query.kind);
  entry.fragments = outcome.files.size();
  entry.micros = elapsedNs / 1000;
  entry.zone = query.zone;
  entry.path = outcome.scanned ? "directory" : "index";
  entry.error = outcome.error;
  trace->add(std::move(entry));
}

}  // namespace

bool WorkerSession::takePurgeOrder(uint32_t order, const PurgeQuery& query,
                                   const PurgeOrderOptions& options) {
  if (stopped_ || pending_.size() >= kMaxPendingAnswers) return false;
  heldOrders_.push_back(HeldOrder{order, query, options, false, {}});
  capnp::MallocMessageBuilder message;
  auto response = message.initRoot<wire::Response>();
  response.setStream(order);
  auto purge = response.initPurgeOrder();
  purge.setZone(query.zone);
  purge.setSoft(query.soft);
  switch (query.kind) {
    case PurgeQuery::Kind::kKey:
      purge.setKey(query.value);
      break;
    case PurgeQuery::Kind::kKeyPrefix:
      purge.setKeyPrefix(query.value);
      break;
    case PurgeQuery::Kind::kTag:
      purge.setTag(query.value);
      break;
    case PurgeQuery::Kind::kTagPattern:
      purge.setTagPattern(query.value);
      break;
  }
  send(message);
  if (stopped_) {
    heldOrders_.pop_back();
    return false;
  }
  return true;
}

bool WorkerSession::handlePurge(uint32_t id, wire::Purge::Reader purge) {
  PurgeQuery query;
  auto zone = purge.getZone();
  if (tooLong(zone, kMaxOpenFieldBytes)) {
    violation("purge: zone name too long");
    return false;
  }
  query.zone.assign(zone.cStr(), zone.size());
  capnp::Text::Reader value;
  switch (purge.which()) {
    case wire::Purge::KEY:
      query.kind = PurgeQuery::Kind::kKey;
      value = purge.getKey();
      break;
    case wire::Purge::KEY_PREFIX:
      query.kind = PurgeQuery::Kind::kKeyPrefix;
      value = purge.getKeyPrefix();
      break;
    case wire::Purge::TAG:
      query.kind = PurgeQuery::Kind::kTag;
      value = purge.getTag();
      break;
    case wire::Purge::TAG_PATTERN:
      query.kind = PurgeQuery::Kind::kTagPattern;
      value = purge.getTagPattern();
      break;
    default:
      violation("purge of an unknown kind");
      return false;
  }
  if (tooLong(value, kMaxKeyBytes)) {
    violation("purge: key too long");
    return false;
  }
  query.value.assign(value.cStr(), value.size());
  query.soft = purge.getSoft();
  std::optional<uint32_t> order;
  PurgeOrderOptions options;
  for (HeldOrder& held : heldOrders_) {
    if (!held.matched && held.query.kind == query.kind && held.query.zone == query.zone &&
        held.query.value == query.value) {
      held.matched = true;
      order = held.order;
      options = held.options;
      break;
    }
  }
  // The answer may come after a scan, by which time the worker may be gone;
  // the stats and the trace outlive every session.
  const uint64_t startNs = uv_hrtime();
  purger_.purge(query, [self = weak_from_this(), id, query, order, options, startNs,
                        &stats = stats_, trace = trace_,
                        &purger = purger_](const PurgeOutcome& outcome) {
    notePurge(stats, trace, query, outcome, startNs);
    auto session = self.lock();
    if (!session) {
      // Gone before its answer (esi_purge_timeout ends the connection):
      // nobody unlinks the files the index has just forgotten.
      if (!outcome.files.empty() && !query.soft) purger.connectionEnded(query.zone);
      return;
    }
    if (!outcome.files.empty()) session->onPurged_(outcome.files);
    FleetNote note;
    // A query refused as malformed would be refused on every node.
    if (session->feed_ && !options.fromFleet && !outcome.invalid) note = session->feed_(query, outcome, options.askAcks);
    if (order) {
      for (HeldOrder& held : session->heldOrders_) {
        if (held.order == *order) held.note = note;
      }
    }
    session->sendPurged(id, outcome, note.status);
  });
  return true;
}

bool WorkerSession::handlePurgeDone(uint32_t order, wire::PurgeDone::Reader done) {
  auto error = done.getError();
  if (tooLong(error, kMaxOpenFieldBytes)) {
    violation("purgeDone: error too long");
    return false;
  }
  PurgeOrderOutcome outcome{done.getCount(), done.getScanned(),
                            std::string(error.cStr(), error.size()), {}};
  const auto held = std::find_if(heldOrders_.begin(), heldOrders_.end(),
                                 [order](const HeldOrder& h) { return h.order == order; });
  if (held != heldOrders_.end()) {
    outcome.fleet = held->note;
    heldOrders_.erase(held);
  }
  orders_.done(this, order, std::move(outcome));
  return true;
}

void WorkerSession::sendPurged(uint32_t id, const PurgeOutcome& outcome,
                               const std::string& fleet) {
  if (stopped_) return;
  size_t next = 0;
  do {
    const size_t count = std::min(kFilesPerPurged, outcome.files.size() - next);
    capnp::MallocMessageBuilder message(count * 2 + 64);
    auto purged = message.initRoot<wire::Response>();
    purged.setStream(id);
    auto body = purged.initPurged();
    auto files = body.initFiles(static_cast<unsigned>(count * sizeof(Md5)));
    for (size_t i = 0; i < count; ++i) {
      std::copy(outcome.files[next + i].begin(), outcome.files[next + i].end(),
                files.begin() + i * sizeof(Md5));
    }
    body.setScanned(outcome.scanned);
    body.setError(outcome.error);
    body.setInvalid(outcome.invalid);
    body.setFleet(fleet);
    next += count;
    body.setMore(next < outcome.files.size());
    send(message);
  } while (next < outcome.files.size());
  // Outside serve() nobody else asks the worker for space.
  if (!pending_.empty()) {
    const uint32_t need = static_cast<uint32_t>(pending_.front().size() * sizeof(capnp::word));
    if (!esi_ring_wait_space(&rings_.responses(), need)) flushPending();
  }
}

}  // namespace esi
