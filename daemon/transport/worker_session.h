// One NGINX worker's connection: its rings, its streams, and the loop that
// answers every request record with splice instructions.  Its member
// functions live in one file per message family, as the connector's do:
// worker_session.cc (the connection, as ngx_http_esi_daemon.c),
// worker_session_stream.cc, _plan.cc, _purge.cc and _purge_index.cc.

#pragma once

#include <uv.h>

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <unordered_map>

#include <capnp/message.h>
#include <kj/array.h>

#include "engine/stats.h"
#include "engine/stream.h"
#include "esi.capnp.h"
#include "plans/plan_store.h"
#include "segments/segment_arena.h"
#include "transport/purge_orders.h"
#include "trace/trace_ring.h"
#include "transport/shared_rings.h"
#include "variants/purger.h"

namespace esi {

class WorkerSession : public std::enable_shared_from_this<WorkerSession>,
                      public PurgeOrderTaker {
 public:
  // Called when the session must end: a protocol violation or a broken ring.
  using FatalHandler = std::function<void(std::string_view reason)>;
  // Called with the cache files a purge of this worker's is about to remove.
  using PurgedHandler = std::function<void(const std::vector<Md5>& files)>;

  // Throws std::system_error when the rings cannot be created.  The arena
  // must outlive the session.
  WorkerSession(uv_loop_t* loop, int socketFd, uint32_t ringSize, Stats& stats,
                Purger& purger, PurgeOrders& orders, PlanStore& plans,
                SegmentArena& arena, FatalHandler onFatal, PurgedHandler onPurged,
                PurgeFeed feed = nullptr);  // feed: see PurgeFeed
  ~WorkerSession() override;
  WorkerSession(const WorkerSession&) = delete;
  WorkerSession& operator=(const WorkerSession&) = delete;

  // Sends the Welcome with the ring and arena fds and starts serving.  False when the
  // socket would not take it.
  bool start();

  // Stops serving; the session may be destroyed afterwards.
  void shutdown();

  // Reads what the worker wrote without waking esid (its replayed hits'
  // reports, which wait for the next wake-up): before esid tells anyone
  // its counts.
  void catchUp();

  // The worker's end of the socket closed.  Cache reports it wrote before
  // are still in the ring: read them, so that the zone's index stays sure.
  void drainReports();

  bool takePurgeOrder(uint32_t order, const PurgeQuery& query,
                      const PurgeOrderOptions& options) override;

  // Tells the worker that a purge removes these files (Response.forget): it
  // forgets what it keeps of them.
  void sendForget(const std::vector<Md5>& files);

  // Where pages and purges are traced (esictl log); none by default.  Must
  // outlive the session.
  void setTrace(TraceRing* trace) { trace_ = trace; }

  // Bytes waiting in the rings now, each way, and their size.
  struct RingUse {
    uint64_t requests = 0;
    uint64_t responses = 0;
    uint64_t capacity = 0;  // of both rings
  };
  RingUse ringUse();

 private:
  // The plan a stream records, once it ends.
  struct PlanKey {
    std::string zone;
    ObjectId id;
  };
  struct StreamEntry {
    std::unique_ptr<Stream> stream;
    uint64_t releasedSent = 0;
    std::optional<PlanKey> plan;
    int stitchLevel = 0;  // the plan's segments' deflate level; 0: none
    uint32_t status = 0;  // for the trace
    uint64_t openedNs = 0;
  };

  using Streams = std::unordered_map<uint32_t, StreamEntry>;
  // What a stream's open makes of its object's plan (lookUpPlan).
  struct OpenPlan {
    bool answered = false;           // the plan was sent: no stream
    std::optional<PlanKey> record;   // none stored yet: record it from the body
    std::shared_ptr<const Plan> failed;  // the worker's copy stopped matching
  };

  // The connection (worker_session.cc): the loop, the dispatch of each
  // request to its family, the answers' way back.
  static void onPoll(uv_poll_t* handle, int status, int events);
  void serve();
  bool drainRequests(size_t& turn);
  // reportsOnly: the stream is over; only zone and stored records count.
  bool handleRequest(const uint8_t* payload, uint32_t length, bool reportsOnly = false);
  void send(capnp::MessageBuilder& message);
  void flushPending();
  // Publishes an answer written into the ring's reserved slot.
  void commitAnswer(uint32_t length);
  void violation(std::string_view reason);
  void tracePage(std::string_view url, uint32_t status, std::string_view how,
                 uint64_t fragments, uint64_t bytes, uint64_t sinceNs);

  // Streams (worker_session_stream.cc).
  bool handleOpen(uint32_t id, wire::Open::Reader open);
  bool handleBody(uint32_t id, capnp::Data::Reader body);
  bool handleEnd(uint32_t id);
  bool handleCancel(uint32_t id);
  // Traces the stream's page as `how` ("parse", "cancel") and forgets it.
  void closeStream(Streams::iterator it, std::string_view how);
  ParserLimits parserLimits(wire::Open::Reader open);
  void sendSplice(uint32_t id, StreamEntry& entry, bool last);
  void sendFail(uint32_t id, std::string_view reason);

  // Plans (worker_session_plan.cc).
  // False on a violation; result.answered when a stored plan was sent.
  bool lookUpPlan(uint32_t id, wire::Open::Reader open, const PageAddress& page,
                  const RequestValues& values, OpenPlan& result);
  // False when the plan, evaluated for this request, is too large to send.
  // With segments (a gzip-stitched response) its runs name their segments,
  // pinned for this connection.
  bool sendPlan(uint32_t id, const Plan& plan, const PageAddress& page,
                const RequestValues& values, bool segments);
  void recordPlan(const StreamEntry& entry);
  bool handleReplayed(wire::Replayed::Reader replayed);

  // Purges (worker_session_purge.cc); takePurgeOrder above.
  bool handlePurge(uint32_t id, wire::Purge::Reader purge);
  bool handlePurgeDone(uint32_t order, wire::PurgeDone::Reader done);
  void sendPurged(uint32_t id, const PurgeOutcome& outcome, const std::string& fleet);

  // The variant index's feed (worker_session_purge_index.cc); sendForget
  // above.
  bool handleZone(wire::Zone::Reader zone);
  bool handleStored(wire::Stored::Reader stored);

  const int socketFd_;
  Stats& stats_;
  Purger& purger_;
  PurgeOrders& orders_;
  PlanStore& plans_;
  SegmentArena& arena_;
  FatalHandler onFatal_;
  PurgedHandler onPurged_;
  PurgeFeed feed_;
  TraceRing* trace_ = nullptr;
  SharedRings rings_;
  // In a mapping of its own: retired to the arena when the session ends.
  std::unique_ptr<PinTable> pins_;
  uv_poll_t* poll_;
  bool stopped_ = false;
  Streams streams_;
  std::deque<kj::Array<capnp::word>> pending_;
  // What sendSplice() and sendPlan() build their messages in, kept zeroed.
  kj::Array<capnp::word> firstSegment_;
  PlanEvaluation evaluation_;  // sendPlan()'s, reused
  // Orders handed to this worker.  The worker carries each out as its own
  // purge, which does not name the order: the first purge of the same
  // query that arrives is taken for it (two equal purges are one), so
  // that a fleet entry is not told to the fleet again and an esictl
  // order learns what became of it there.
  struct HeldOrder {
    uint32_t order;
    PurgeQuery query;
    PurgeOrderOptions options;
    bool matched = false;
    FleetNote note;
  };
  std::deque<HeldOrder> heldOrders_;
  // Zones this worker announced: their indexes are in doubt when it goes
  // with reports unread.
  std::set<std::string, std::less<>> zones_;
  bool reportsDrained_ = false;
  // A worker's out-of-range esi_max_tag_size is reported once, not per page.
  bool tagLimitWarned_ = false;
};

}  // namespace esi
