// WorkerSession: the connection (the connector's ngx_http_esi_daemon.c):
// the rings and the Welcome, the loop that reads the worker's requests and
// hands each to its family's handler, and the answers' way back.  The
// families: worker_session_stream.cc, _plan.cc, _purge.cc, _purge_index.cc.

#include "transport/worker_session.h"

#include <sys/socket.h>

#include <algorithm>
#include <cstring>
#include <span>

#include <capnp/serialize.h>
#include <kj/io.h>
#include <spdlog/spdlog.h>

#include "esi.capnp.h"
#include "transport/fd_passing.h"
#include "transport/worker_session_wire.h"

namespace esi {

using namespace session;  // worker_session_wire.h

namespace {

// Request records one session handles before other sessions get a turn.
constexpr size_t kRecordsPerTurn = 64;
// The first segment of every splice and plan answer, reused: 32 KiB holds
// a splice's budget and the plans of most pages.
constexpr size_t kFirstSegmentWords = 4096;

// The worker at the other end, for its pin table to outlive the session
// only while it lives; 0 when the kernel does not say.
pid_t peerPid(int socketFd) {
  ucred cred{};
  socklen_t len = sizeof(cred);
  if (getsockopt(socketFd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) return 0;
  return cred.pid;
}

// Bytes between a ring's indexes, as both sides published them; the
// worker's may be anything, so never more than the ring.
uint64_t queuedBytes(const esi_ring_t& ring) {
  const uint32_t head = __atomic_load_n(&ring.ctl->head, __ATOMIC_ACQUIRE);
  const uint32_t tail = __atomic_load_n(&ring.ctl->tail, __ATOMIC_ACQUIRE);
  return std::min<uint32_t>(tail - head, ring.size);
}

}  // namespace

WorkerSession::WorkerSession(uv_loop_t* loop, int socketFd, uint32_t ringSize,
                             Stats& stats, Purger& purger, PurgeOrders& orders,
                             PlanStore& plans, SegmentArena& arena, FatalHandler onFatal,
                             PurgedHandler onPurged, PurgeFeed feed)
    : socketFd_(socketFd), stats_(stats), purger_(purger), orders_(orders), plans_(plans),
      arena_(arena), onFatal_(std::move(onFatal)), onPurged_(std::move(onPurged)),
      feed_(std::move(feed)),
      rings_(ringSize),
      pins_(PinTable::map(arena, rings_.memfd(), rings_.pinsOffset(), peerPid(socketFd))),
      poll_(new uv_poll_t),
      firstSegment_(kj::heapArray<capnp::word>(kFirstSegmentWords)) {
  // MallocMessageBuilder takes it zeroed, and zeroes what it used again.
  std::memset(firstSegment_.begin(), 0, firstSegment_.size() * sizeof(capnp::word));
  uv_poll_init(loop, poll_, rings_.daemonEventfd());
  poll_->data = this;
  ++stats_.connections;
  ++stats_.activeConnections;
}

WorkerSession::~WorkerSession() {
  shutdown();
  uv_close(reinterpret_cast<uv_handle_t*>(poll_),
           [](uv_handle_t* h) { delete reinterpret_cast<uv_poll_t*>(h); });
  stats_.activeStreams -= streams_.size();
  --stats_.activeConnections;
  orders_.withdraw(this);
  // Answers the worker never read may be purges it never carried out,
  // though the index already forgot their files.
  const bool answersUnread = !pending_.empty() || esi_ring_used(&rings_.responses()) > 0;
  if (!reportsDrained_ || answersUnread) {
    for (const std::string& zone : zones_) purger_.connectionEnded(zone);
  }
  // Requests of the worker may still be sending segments it pinned.
  arena_.retire(std::move(pins_));
}

bool WorkerSession::start() {
  capnp::MallocMessageBuilder message;
  auto welcome = message.initRoot<wire::Welcome>();
  welcome.setVersion(wire::PROTOCOL_VERSION);
  welcome.setRingSize(rings_.ringSize());
  welcome.setDaemonPid(static_cast<uint32_t>(getpid()));
  welcome.setArenaSize(arena_.size());
  kj::Array<capnp::word> bytes = capnp::messageToFlatArray(message);

  const int fds[4] = {rings_.memfd(), rings_.workerEventfd(),
                      rings_.daemonEventfd(), arena_.memfd()};
  // The socket is otherwise idle, so a short message goes out whole or not
  // at all.
  if (!sendWithFds(socketFd_, std::as_bytes(std::span(bytes.begin(), bytes.end())),
                   fds)) {
    spdlog::warn("worker connection: cannot send the rings: {}", std::strerror(errno));
    return false;
  }
  uv_poll_start(poll_, UV_READABLE, onPoll);
  return true;
}

void WorkerSession::shutdown() {
  if (stopped_) return;
  stopped_ = true;
  uv_poll_stop(poll_);
}

void WorkerSession::catchUp() {
  // All that the ring held, not a turn's worth (turns keep the loop fair
  // between workers): a count asked for now includes every hit reported
  // so far.  The worker may write on meanwhile; a full ring's worth of
  // the smallest records bounds the turns.
  const size_t turns = rings_.ringSize() / (kRecordsPerTurn * ESI_RECORD_HEADER) + 1;
  for (size_t i = 0; i < turns && !stopped_; ++i) {
    flushPending();
    size_t turn = kRecordsPerTurn;
    if (!drainRequests(turn)) return;
    if (turn > 0) break;  // empty, or waiting for room for its answers
  }
  if (!stopped_) serve();
}

void WorkerSession::drainReports() {
  if (stopped_) return;  // a violation: what is left in the ring is suspect
  stopped_ = true;
  uv_poll_stop(poll_);
  // The ring holds at most ringSize bytes, so this ends.
  for (;;) {
    const uint8_t* payload;
    uint32_t length;
    switch (esi_ring_peek(&rings_.requests(), &payload, &length)) {
      case ESI_RING_EMPTY:
        reportsDrained_ = true;
        return;
      case ESI_RING_CORRUPT:
        spdlog::warn("worker connection: corrupt ring after the worker left");
        return;
      case ESI_RING_OK:
        break;
    }
    if (!handleRequest(payload, length, true)) return;
    esi_ring_release(&rings_.requests());
  }
}

void WorkerSession::onPoll(uv_poll_t* handle, int status, int) {
  auto* self = static_cast<WorkerSession*>(handle->data);
  if (status < 0) {
    self->violation(uv_strerror(status));
    return;
  }
  self->rings_.clearWakeups();
  self->serve();
}

void WorkerSession::serve() {
  // One worker's busy ring must not keep the loop from the others: after a
  // turn's worth of records, wake ourselves and let the loop go round.
  size_t turn = kRecordsPerTurn;
  while (!stopped_) {
    flushPending();
    if (!drainRequests(turn)) return;
    if (turn == 0) {
      rings_.wakeDaemon();
      return;
    }
    if (!pending_.empty()) {
      // Wait for the worker to free space for the oldest answer.
      const uint32_t need = static_cast<uint32_t>(pending_.front().size() * sizeof(capnp::word));
      if (esi_ring_wait_space(&rings_.responses(), need)) return;
      continue;
    }
    if (esi_ring_wait_data(&rings_.requests())) return;
  }
}

bool WorkerSession::drainRequests(size_t& turn) {
  while (!stopped_ && turn > 0 && pending_.size() < kMaxPendingAnswers) {
    const uint8_t* payload;
    uint32_t length;
    switch (esi_ring_peek(&rings_.requests(), &payload, &length)) {
      case ESI_RING_EMPTY:
        return true;
      case ESI_RING_CORRUPT:
        violation("corrupt request ring");
        return false;
      case ESI_RING_OK:
        break;
    }
    stats_.ringBytesIn += length;
    if (!handleRequest(payload, length)) return false;
    if (esi_ring_release(&rings_.requests())) {
      ++stats_.workerWaits;
      rings_.wakeWorker();
    }
    --turn;
  }
  return !stopped_;
}

bool WorkerSession::handleRequest(const uint8_t* payload, uint32_t length,
                                  bool reportsOnly) {
  if (length % sizeof(capnp::word) != 0) {
    violation("request length is not a whole number of words");
    return false;
  }
  try {
    kj::ArrayPtr<const capnp::word> words(
        reinterpret_cast<const capnp::word*>(payload), length / sizeof(capnp::word));
    capnp::ReaderOptions options;
    options.traversalLimitInWords = words.size() * 2 + 64;
    options.nestingLimit = 8;
    capnp::FlatArrayMessageReader reader(words, options);
    auto request = reader.getRoot<wire::Request>();
    const uint32_t id = request.getStream();

    if (reportsOnly) {
      switch (request.which()) {
        case wire::Request::ZONE:
          return handleZone(request.getZone());
        case wire::Request::STORED:
          return handleStored(request.getStored());
        default:
          return true;
      }
    }

    switch (request.which()) {
      case wire::Request::OPEN:
        return handleOpen(id, request.getOpen());
      case wire::Request::BODY:
        return handleBody(id, request.getBody());
      case wire::Request::END:
        return handleEnd(id);
      case wire::Request::CANCEL:
        return handleCancel(id);
      case wire::Request::ZONE:
        return handleZone(request.getZone());
      case wire::Request::STORED:
        return handleStored(request.getStored());
      case wire::Request::PURGE:
        return handlePurge(id, request.getPurge());
      case wire::Request::PURGE_DONE:
        return handlePurgeDone(id, request.getPurgeDone());
      case wire::Request::REPLAYED:
        return handleReplayed(request.getReplayed());
    }
    violation("unknown request");
    return false;
  } catch (const kj::Exception& e) {
    violation(e.getDescription().cStr());
    return false;
  }
}

void WorkerSession::send(capnp::MessageBuilder& message) {
  const auto segments = message.getSegmentsForOutput();
  if (segments.size() == 1 && pending_.empty()) {
    // Nothing waits before it: written straight into the ring, if it has
    // room (else queued like any other).
    esi_ring_t& ring = rings_.responses();
    const size_t length = capnp::computeSerializedSizeInWords(segments) * sizeof(capnp::word);
    void* slot = length <= esi_ring_max_payload(&ring)
                     ? esi_ring_reserve(&ring, static_cast<uint32_t>(length))
                     : nullptr;
    if (slot != nullptr) {
      kj::ArrayOutputStream out(kj::arrayPtr(static_cast<kj::byte*>(slot), length));
      capnp::writeMessage(out, segments);
      commitAnswer(static_cast<uint32_t>(length));
      return;
    }
  }
  kj::Array<capnp::word> bytes;
  if (segments.size() == 1) {
    bytes = capnp::messageToFlatArray(segments);
  } else {
    // The worker reads single-segment messages only: copy into one segment
    // large enough for everything.
    capnp::MallocMessageBuilder single(capnp::computeSerializedSizeInWords(message) + 16);
    single.setRoot(message.getRoot<wire::Response>().asReader());
    bytes = capnp::messageToFlatArray(single);
  }
  pending_.push_back(std::move(bytes));
  flushPending();
}

void WorkerSession::flushPending() {
  esi_ring_t& ring = rings_.responses();
  while (!pending_.empty()) {
    const kj::Array<capnp::word>& bytes = pending_.front();
    const uint32_t length = static_cast<uint32_t>(bytes.size() * sizeof(capnp::word));
    if (length > esi_ring_max_payload(&ring)) {
      violation("an answer does not fit the ring");
      return;
    }
    void* slot = esi_ring_reserve(&ring, length);
    if (slot == nullptr) {
      ++stats_.ringFull;
      return;
    }
    std::memcpy(slot, bytes.begin(), length);
    commitAnswer(length);
    pending_.pop_front();
  }
}

void WorkerSession::commitAnswer(uint32_t length) {
  stats_.ringBytesOut += length;
  if (esi_ring_commit(&rings_.responses(), length)) rings_.wakeWorker();
}

void WorkerSession::violation(std::string_view reason) {
  if (stopped_) return;
  ++stats_.errors;
  ++stats_.protocolErrors;
  spdlog::error("worker connection: {}; closing it", reason);
  shutdown();
  onFatal_(reason);
}

void WorkerSession::tracePage(std::string_view url, uint32_t status, std::string_view how,
                              uint64_t fragments, uint64_t bytes, uint64_t sinceNs) {
  if (trace_ == nullptr) return;
  TraceEntry entry;
  entry.url = url.substr(0, TraceRing::kMaxUrlBytes);
  entry.status = status;
  entry.how = how;
  entry.fragments = fragments;
  entry.bytes = bytes;
  entry.micros = (uv_hrtime() - sinceNs) / 1000;
  trace_->add(std::move(entry));
}

WorkerSession::RingUse WorkerSession::ringUse() {
  RingUse use;
  use.requests = queuedBytes(rings_.requests());
  use.responses = queuedBytes(rings_.responses());
  use.capacity = uint64_t{2} * rings_.ringSize();
  return use;
}

}  // namespace esi
