// WorkerSession: parse plans (the connector's ngx_http_esi_plan.c and the
// replay reports of ngx_http_esi_replay.c): a plan recorded from a parsed
// body, sent for a later hit, and the hits a worker replayed on its own.

#include "transport/worker_session.h"

#include <type_traits>

#include <capnp/message.h>
#include <capnp/serialize.h>
#include <spdlog/spdlog.h>

#include "esi.capnp.h"
#include "transport/worker_session_wire.h"

namespace esi {

using namespace session;  // worker_session_wire.h

namespace {

void encode(wire::Segment::Builder builder, const Segment& segment) {
  builder.setOffset(segment.offset);
  builder.setLength(segment.length);
  builder.setCrc(segment.crc);
  builder.setHead(kj::arrayPtr(segment.head.data(), segment.head.size()));
}

void encode(wire::PlanStep::Builder builder, const PlanCheck& check) {
  auto c = builder.initCheck();
  c.setOffset(check.offset);
  c.setBytes(kj::arrayPtr(reinterpret_cast<const kj::byte*>(check.bytes.data()),
                          check.bytes.size()));
}

}  // namespace

bool WorkerSession::lookUpPlan(uint32_t id, wire::Open::Reader open, const PageAddress& page,
                               const RequestValues& values, OpenPlan& result) {
  auto object = open.getObject();
  if (object.size() == 0) return true;
  auto planZone = open.getPlanZone();
  auto objectId = ObjectId::fromWire(
      std::string_view(reinterpret_cast<const char*>(object.begin()), object.size()));
  if (!objectId || planZone.size() == 0) {
    violation("open: malformed object identity or no plan zone");
    return false;
  }
  result.record = PlanKey{std::string(planZone.cStr(), planZone.size()), *objectId};
  plans_.configureZone(result.record->zone, open.getPlanZoneBytes());
  if (open.getPlanFailed()) {
    spdlog::info("{:?}: the worker found that its plan does not match the body at byte {}; "
                 "plan dropped", page.uri, open.getBase());
    result.failed = plans_.drop(result.record->zone, result.record->id);
    result.record.reset();
    ++stats_.planDrops;
  } else if (open.getBase() != 0) {
    violation("open: a base offset without a failed plan");
    return false;
  } else if (auto plan = plans_.find(result.record->zone, result.record->id)) {
    const uint64_t startNs = uv_hrtime();
    if (sendPlan(id, *plan, page, values, open.getSegments())) {
      ++stats_.planned;
      uint64_t fragments = 0;
      evaluation_.forEach([&fragments](const auto& step) {
        fragments += std::is_same_v<std::decay_t<decltype(step)>, IncludeCall>;
      });
      tracePage(page.uri, open.getStatus(), "plan", fragments, plan->length, startNs);
      result.answered = true;
      return true;
    }
    result.record.reset();  // parse this body; the plan stays for other requests
    ++stats_.planMisses;
  } else {
    ++stats_.planMisses;
  }
  return true;
}

void WorkerSession::recordPlan(const StreamEntry& entry) {
  const Stream& stream = *entry.stream;
  // Nothing to record, or the body outgrew what a plan may keep.
  if (!entry.plan || !stream.recording()) return;
  std::optional<Plan> plan = buildPlan(stream.recordedProgram(), stream.recordedBody());
  if (!plan) return;
  // A plan travels as one message: it must fit the ring with room to spare.
  if (plan->bytes() > esi_ring_max_payload(&rings_.responses()) / 2) return;
  if (entry.stitchLevel != 0) plan->deflateRuns(stream.recordedBody(), entry.stitchLevel, arena_);
  plans_.record(entry.plan->zone, entry.plan->id, std::move(*plan));
}

bool WorkerSession::sendPlan(uint32_t id, const Plan& plan, const PageAddress& page,
                             const RequestValues& values, bool segments) {
  plan.evaluate(page, values, evaluation_);
  capnp::MallocMessageBuilder message(firstSegment_);
  auto response = message.initRoot<wire::Response>();
  response.setStream(id);
  auto body = response.initPlan();
  body.setLength(plan.length);
  auto list = body.initSteps(static_cast<unsigned>(evaluation_.size()));
  unsigned i = 0;
  // Both ascending: a run has its segment when it is exactly a segmented
  // run of the page (one this request merged with another has none).
  auto segment = segments ? plan.segments.begin() : plan.segments.end();
  bool named = false;
  evaluation_.forEach([&](const auto& step) {
    auto builder = list[i++];
    encode(builder, step);
    if constexpr (std::is_same_v<std::decay_t<decltype(step)>, VerbatimRun>) {
      while (segment != plan.segments.end() && segment->runOffset < step.offset) ++segment;
      if (segment != plan.segments.end() && segment->runOffset == step.offset &&
          segment->runLength == step.length) {
        encode(builder.getVerbatim().initSegment(), *segment);
        named = true;
      }
    }
  });
  if (named) body.setPin(plan.lease.slot() + 1);
  body.setReusable(!plan.readsRequest);
  // A plan travels as one message: with this request's values it must fit
  // the ring with room to spare.
  if (capnp::computeSerializedSizeInWords(message) * sizeof(capnp::word) >
      esi_ring_max_payload(&rings_.responses()) / 2) {
    return false;
  }
  if (named) {
    // Before the worker can read the plan: from here until it lowers the
    // count, the extent stays as it is even if the plan goes.
    pins_->pin(plan.lease.slot());
    ++stats_.stitched;
  }
  send(message);
  return true;
}

bool WorkerSession::handleReplayed(wire::Replayed::Reader replayed) {
  auto zone = replayed.getZone();
  auto object = replayed.getObject();
  auto uri = replayed.getUri();
  auto id = ObjectId::fromWire(
      std::string_view(reinterpret_cast<const char*>(object.begin()), object.size()));
  if (!id || zone.size() == 0 || tooLong(zone, kMaxOpenFieldBytes) ||
      tooLong(uri, kMaxOpenFieldBytes)) {
    violation("replayed: malformed object identity, plan zone or uri");
    return false;
  }
  // The plan may be gone from the store by now (the worker's copy lives a
  // second): the hit is counted all the same.
  plans_.replayed(std::string_view(zone.cStr(), zone.size()), *id);
  ++stats_.planned;
  ++stats_.replayed;
  if (replayed.getStitched()) ++stats_.stitched;
  // The worker did it all: no fragments or bytes that esid saw, no time.
  tracePage(std::string_view(uri.cStr(), uri.size()), replayed.getStatus(), "replay", 0, 0,
            uv_hrtime());
  return true;
}

}  // namespace esi
