#include "transport/worker_session.h"

#include <sys/socket.h>

#include <algorithm>
#include <cstring>
#include <span>
#include <type_traits>

#include <capnp/serialize.h>
#include <kj/io.h>
#include <spdlog/spdlog.h>

#include "esi.capnp.h"
#include "transport/fd_passing.h"

namespace esi {

namespace {

// Answers queued beyond this stop esid from reading more requests until the
// worker drains its ring: back-pressure instead of unbounded memory.
constexpr size_t kMaxPendingAnswers = 256;
// Request records one session handles before other sessions get a turn.
constexpr size_t kRecordsPerTurn = 64;
// A splice grows until about this size, then continues in the next message.
constexpr size_t kSpliceBudgetBytes = size_t{32} * 1024;
constexpr size_t kMaxStreamsPerWorker = 65536;
constexpr size_t kMaxOpenFieldBytes = size_t{16} * 1024;
constexpr size_t kMaxKeyBytes = size_t{64} * 1024;
// Open.vars: a request header value, longer than any NGINX takes by default
// (esi_expr reads 8 KiB of each).
constexpr size_t kMaxVarBytes = size_t{64} * 1024;
// File names per Purged message: 256 KiB, well inside the smallest ring.
constexpr size_t kFilesPerPurged = size_t{16} * 1024;
// Files per Response.forget (16 KiB); a purge of more tells each worker to
// forget every object it keeps (it keeps at most 1,024 plain ones).
constexpr size_t kForgetFiles = 1024;
// esi_purge_tag_headers, all of its names.
constexpr size_t kMaxTagHeadersBytes = 4096;
// A body esid keeps whole while it records the body's plan; a longer one is
// parsed every time.
constexpr size_t kMaxRecordedBody = 16 << 20;
// The first segment of every splice and plan answer, reused: 32 KiB holds
// a splice's budget and the plans of most pages.
constexpr size_t kFirstSegmentWords = 4096;

bool tooLong(capnp::Text::Reader text, size_t limit) { return text.size() > limit; }

// A zone's directory must be absolute and plainly named: esid reads below
// it on a worker's word.
bool plainAbsolutePath(std::string_view path) {
  if (path.empty() || path.front() != '/') return false;
  for (size_t at = 0; at != std::string_view::npos;) {
    const size_t next = path.find('/', at + 1);
    const std::string_view segment = path.substr(at + 1, next == std::string_view::npos ? next : next - at - 1);
    if (segment == "." || segment == "..") return false;
    at = next;
  }
  return path.find('\0') == std::string_view::npos;
}

size_t instructionBytes(const Instruction& instruction) {
  constexpr size_t kFixed = 64;
  if (auto* call = std::get_if<IncludeCall>(&instruction)) {
    return kFixed + call->path.size() + call->args.size() +
           call->altPath.size() + call->altArgs.size();
  }
  if (auto* literal = std::get_if<LiteralText>(&instruction)) {
    return kFixed + literal->bytes.size();
  }
  return kFixed;
}

std::string textOf(capnp::Text::Reader text) { return std::string(text.cStr(), text.size()); }

// Splice instructions and plan steps share these members.
template <typename Builder>
void encode(Builder builder, const VerbatimRun& run) {
  auto verbatim = builder.initVerbatim();
  verbatim.setOffset(run.offset);
  verbatim.setLength(run.length);
}

template <typename Builder>
void encode(Builder builder, const IncludeCall& call) {
  auto include = builder.initInclude();
  include.setPath(call.path);
  include.setArgs(call.args);
  include.setAltPath(call.altPath);
  include.setAltArgs(call.altArgs);
  include.setContinueOnError(call.continueOnError);
}

template <typename Builder>
void encode(Builder builder, const LiteralText& literal) {
  builder.setLiteral(kj::arrayPtr(reinterpret_cast<const kj::byte*>(literal.bytes.data()),
                                  literal.bytes.size()));
}

template <typename Builder>
void encode(Builder builder, TryMark mark) {
  switch (mark) {
    case TryMark::START: builder.setTryStart(); break;
    case TryMark::EXCEPT: builder.setTryExcept(); break;
    case TryMark::END: builder.setTryEnd(); break;
  }
}

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

// Open.vars, each value bounded; nullopt when one is too long.
std::optional<RequestValues> requestValues(wire::RequestVars::Reader vars) {
  for (auto text : {vars.getHost(), vars.getUserAgent(), vars.getReferer(),
                    vars.getAcceptLanguage(), vars.getQueryString(), vars.getCookies()}) {
    if (tooLong(text, kMaxVarBytes)) return std::nullopt;
  }
  return RequestValues{textOf(vars.getHost()),           textOf(vars.getUserAgent()),
                       textOf(vars.getReferer()),        textOf(vars.getAcceptLanguage()),
                       textOf(vars.getQueryString()),    textOf(vars.getCookies())};
}

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

void WorkerSession::sendForget(const std::vector<Md5>& files) {
  // An identity a worker keeps is never that of a later store, so a lost
  // forget costs memory for a second, never a wrong byte.
  if (stopped_ || pending_.size() >= kMaxPendingAnswers) return;
  const size_t listed = files.size() <= kForgetFiles ? files.size() : 0;
  capnp::MallocMessageBuilder message(listed * 2 + 16);
  auto response = message.initRoot<wire::Response>();
  response.setStream(0);
  auto forget = response.initForget(static_cast<unsigned>(listed * sizeof(Md5)));
  for (size_t i = 0; i < listed; ++i) {
    std::copy(files[i].begin(), files[i].end(), forget.begin() + i * sizeof(Md5));
  }
  send(message);
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
      case wire::Request::BODY: {
        auto it = streams_.find(id);
        if (it == streams_.end()) {
          violation("body for a stream that is not open");
          return false;
        }
        auto body = request.getBody();
        it->second.stream->feed(std::string_view(
            reinterpret_cast<const char*>(body.begin()), body.size()));
        sendSplice(id, it->second, false);
        return true;
      }
      case wire::Request::END: {
        auto it = streams_.find(id);
        if (it == streams_.end()) {
          violation("end of a stream that is not open");
          return false;
        }
        it->second.stream->finish();
        sendSplice(id, it->second, true);
        recordPlan(it->second);
        tracePage(it->second.stream->uri(), it->second.status, "parse",
                  it->second.stream->includes(), it->second.stream->bytesFed(),
                  it->second.openedNs);
        streams_.erase(it);
        --stats_.activeStreams;
        return true;
      }
      case wire::Request::CANCEL: {
        auto it = streams_.find(id);
        if (it == streams_.end()) return true;
        tracePage(it->second.stream->uri(), it->second.status, "cancel",
                  it->second.stream->includes(), it->second.stream->bytesFed(),
                  it->second.openedNs);
        streams_.erase(it);
        --stats_.activeStreams;
        return true;
      }
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

bool WorkerSession::handleOpen(uint32_t id, wire::Open::Reader open) {
  auto uri = open.getUri();
  auto authority = open.getAuthority();
  auto object = open.getObject();
  auto planZone = open.getPlanZone();
  if (tooLong(uri, kMaxOpenFieldBytes) || tooLong(authority, kMaxOpenFieldBytes) ||
      tooLong(planZone, kMaxOpenFieldBytes)) {
    violation("open: uri, authority or plan zone too long");
    return false;
  }
  if (streams_.size() >= kMaxStreamsPerWorker) {
    violation("too many open streams");
    return false;
  }
  if (streams_.contains(id)) {
    violation("stream opened twice");
    return false;
  }
  std::optional<RequestValues> values = requestValues(open.getVars());
  if (!values) {
    violation("open: a request variable longer than 64 KiB");
    return false;
  }
  if (open.getStitchLevel() > 9) {
    violation("open: a stitch level above 9");
    return false;
  }
  const PageAddress page{textOf(uri), textOf(authority)};

  std::optional<PlanKey> planKey;
  std::shared_ptr<const Plan> failedPlan;
  if (object.size() != 0) {
    auto objectId = ObjectId::fromWire(
        std::string_view(reinterpret_cast<const char*>(object.begin()), object.size()));
    if (!objectId || planZone.size() == 0) {
      violation("open: malformed object identity or no plan zone");
      return false;
    }
    planKey = PlanKey{std::string(planZone.cStr(), planZone.size()), *objectId};
    plans_.configureZone(planKey->zone, open.getPlanZoneBytes());
    if (open.getPlanFailed()) {
      spdlog::info("{:?}: the worker found that its plan does not match the body at byte {}; "
                   "plan dropped", std::string_view(uri.cStr(), uri.size()), open.getBase());
      failedPlan = plans_.drop(planKey->zone, planKey->id);
      planKey.reset();
      ++stats_.planDrops;
    } else if (open.getBase() != 0) {
      violation("open: a base offset without a failed plan");
      return false;
    } else if (auto plan = plans_.find(planKey->zone, planKey->id)) {
      const uint64_t startNs = uv_hrtime();
      if (sendPlan(id, *plan, page, *values, open.getSegments())) {
        ++stats_.planned;
        uint64_t fragments = 0;
        evaluation_.forEach([&fragments](const auto& step) {
          fragments += std::is_same_v<std::decay_t<decltype(step)>, IncludeCall>;
        });
        tracePage(page.uri, open.getStatus(), "plan", fragments, plan->length, startNs);
        return true;
      }
      planKey.reset();  // parse this body; the plan stays for other requests
      ++stats_.planMisses;
    } else {
      ++stats_.planMisses;
    }
  }

  auto stream = std::make_unique<Stream>(page.uri, page.authority, stats_, open.getBase(),
                                         parserLimits(open));
  stream->setRequestValues(std::move(*values));
  if (failedPlan) {
    // The worker replayed the plan up to base, perhaps into a construct.
    // Never into a try: the worker checks a try whole before it runs any of
    // it and drops the plan before it (proto/README.md, Plans), since it
    // cannot leave what an attempt holds to esid.  A base inside one is a
    // worker's mistake: the stream fails, and the plan is forgotten.
    const auto resumption = failedPlan->resumeAt(open.getBase());
    if (resumption && !stream->resumeInside(resumption->before, resumption->context)) {
      sendFail(id, "the plan stopped matching inside <esi:try>");
      return true;
    }
  }
  StreamEntry& entry = streams_[id];
  entry.stream = std::move(stream);
  entry.status = open.getStatus();
  entry.openedNs = uv_hrtime();
  ++stats_.streams;
  ++stats_.activeStreams;
  if (planKey) {
    // No plan yet: the worker waits for this (empty) answer before it sends
    // the body, which esid keeps to record the plan from.
    entry.stream->record(kMaxRecordedBody);
    entry.plan = std::move(planKey);
    entry.stitchLevel = open.getStitchLevel();
    sendSplice(id, entry, false);
  }
  return true;
}

// The connector checks esi_max_tag_size's range; a value outside it is
// clamped rather than trusted, since it sizes what a stream may buffer.
ParserLimits WorkerSession::parserLimits(wire::Open::Reader open) {
  ParserLimits limits;
  const uint32_t asked = open.getMaxTagBytes();
  if (asked == 0) return limits;
  limits.maxTagBytes =
      std::clamp<size_t>(asked, ParserLimits::kMinTagBytes, ParserLimits::kMaxTagBytes);
  if (limits.maxTagBytes != asked && !tagLimitWarned_) {
    tagLimitWarned_ = true;
    spdlog::warn("a worker asked for maxTagBytes {}, outside {}..{}; {} is used",
                 asked, ParserLimits::kMinTagBytes, ParserLimits::kMaxTagBytes,
                 limits.maxTagBytes);
  }
  return limits;
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

void WorkerSession::sendFail(uint32_t id, std::string_view reason) {
  capnp::MallocMessageBuilder message;
  auto response = message.initRoot<wire::Response>();
  response.setStream(id);
  response.setFail(std::string(reason));
  send(message);
}

bool WorkerSession::handleZone(wire::Zone::Reader zone) {
  auto name = zone.getName();
  auto path = zone.getPath();
  if (name.size() == 0 || tooLong(name, kMaxOpenFieldBytes) || tooLong(path, kMaxOpenFieldBytes) ||
      !plainAbsolutePath(std::string_view(path.cStr(), path.size()))) {
    violation("zone: bad name or path");
    return false;
  }
  auto names = zone.getTagHeaders();
  if (tooLong(names, kMaxTagHeadersBytes)) {
    violation("zone: tag headers too long");
    return false;
  }
  std::vector<std::string> tagHeaders;
  splitTags(std::string_view(names.cStr(), names.size()), tagHeaders);
  purger_.announce(std::string_view(name.cStr(), name.size()),
                   std::string_view(path.cStr(), path.size()), zone.getIndexBytes(),
                   zone.getLostReports(), std::move(tagHeaders));
  zones_.emplace(name.cStr(), name.size());
  if (!stopped_) orders_.serves(std::string_view(name.cStr(), name.size()), this);
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

bool WorkerSession::handleStored(wire::Stored::Reader stored) {
  auto zone = stored.getZone();
  auto key = stored.getKey();
  auto file = stored.getFile();
  auto tags = stored.getTags();
  if (file.size() != sizeof(Md5) || tooLong(zone, kMaxOpenFieldBytes) ||
      tooLong(key, kMaxKeyBytes) || tooLong(tags, kMaxKeyBytes)) {
    violation("stored: bad file name, key or tags");
    return false;
  }
  StoredFile record;
  record.key.assign(key.cStr(), key.size());
  record.main = md5Of(record.key);
  std::copy(file.begin(), file.end(), record.file.begin());
  std::string_view rest(tags.cStr(), tags.size());
  while (!rest.empty()) {
    const size_t start = rest.find_first_not_of(' ');
    if (start == std::string_view::npos) break;
    const size_t end = rest.find(' ', start);
    record.tags.emplace_back(rest.substr(start, end == std::string_view::npos ? end : end - start));
    rest = end == std::string_view::npos ? std::string_view() : rest.substr(end);
  }
  purger_.stored(std::string_view(zone.cStr(), zone.size()), std::move(record));
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
                        &stats = stats_, trace = trace_](const PurgeOutcome& outcome) {
    notePurge(stats, trace, query, outcome, startNs);
    auto session = self.lock();
    if (!session) return;
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

void WorkerSession::sendSplice(uint32_t id, StreamEntry& entry, bool last) {
  std::vector<Instruction> instructions = entry.stream->takeInstructions();
  size_t next = 0;
  do {
    size_t count = 0;
    for (size_t bytes = 0; next + count < instructions.size() && bytes < kSpliceBudgetBytes; ++count) {
      bytes += instructionBytes(instructions[next + count]);
    }
    const bool final = next + count == instructions.size();
    if (final) entry.releasedSent = entry.stream->released();

    capnp::MallocMessageBuilder message(firstSegment_);
    auto response = message.initRoot<wire::Response>();
    response.setStream(id);
    auto splice = response.initSplice();
    splice.setReleased(entry.releasedSent);
    splice.setLast(last && final);
    splice.setAnswered(final);
    auto list = splice.initInstructions(static_cast<unsigned>(count));
    for (size_t i = 0; i < count; ++i) {
      std::visit([&](const auto& instruction) { encode(list[i], instruction); },
                 instructions[next + i]);
    }
    send(message);
    next += count;
  } while (next < instructions.size());
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
