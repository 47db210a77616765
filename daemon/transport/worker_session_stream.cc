// WorkerSession: a response's stream (the connector's
// ngx_http_esi_stream.c): open, body, end and cancel, and the splices and
// failures that answer them.

#include "transport/worker_session.h"

#include <algorithm>

#include <capnp/message.h>
#include <spdlog/spdlog.h>

#include "esi.capnp.h"
#include "transport/worker_session_wire.h"

namespace esi {

using namespace session;  // worker_session_wire.h

namespace {

// A splice grows until about this size, then continues in the next message.
constexpr size_t kSpliceBudgetBytes = size_t{32} * 1024;
constexpr size_t kMaxStreamsPerWorker = 65536;
// Open.vars: a request header value, longer than any NGINX takes by default
// (esi_expr reads 8 KiB of each).
constexpr size_t kMaxVarBytes = size_t{64} * 1024;
// A body esid keeps whole while it records the body's plan; a longer one is
// parsed every time.
constexpr size_t kMaxRecordedBody = 16 << 20;

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

}  // namespace

bool WorkerSession::handleOpen(uint32_t id, wire::Open::Reader open) {
  auto uri = open.getUri();
  auto authority = open.getAuthority();
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

  OpenPlan plan;
  if (!lookUpPlan(id, open, page, *values, plan)) return false;
  if (plan.answered) return true;

  auto stream = std::make_unique<Stream>(page.uri, page.authority, stats_, open.getBase(),
                                         parserLimits(open));
  stream->setRequestValues(std::move(*values));
  if (plan.failed) {
    // The worker replayed the plan up to base, perhaps into a construct.
    // Never into a try: the worker checks a try whole before it runs any of
    // it and drops the plan before it (proto/README.md, Plans), since it
    // cannot leave what an attempt holds to esid.  A base inside one is a
    // worker's mistake: the stream fails, and the plan is forgotten.
    const auto resumption = plan.failed->resumeAt(open.getBase());
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
  if (plan.record) {
    // No plan yet: the worker waits for this (empty) answer before it sends
    // the body, which esid keeps to record the plan from.
    entry.stream->record(kMaxRecordedBody);
    entry.plan = std::move(plan.record);
    entry.stitchLevel = open.getStitchLevel();
    sendSplice(id, entry, false);
  }
  return true;
}

bool WorkerSession::handleBody(uint32_t id, capnp::Data::Reader body) {
  auto it = streams_.find(id);
  if (it == streams_.end()) {
    violation("body for a stream that is not open");
    return false;
  }
  it->second.stream->feed(
      std::string_view(reinterpret_cast<const char*>(body.begin()), body.size()));
  sendSplice(id, it->second, false);
  return true;
}

bool WorkerSession::handleEnd(uint32_t id) {
  auto it = streams_.find(id);
  if (it == streams_.end()) {
    violation("end of a stream that is not open");
    return false;
  }
  it->second.stream->finish();
  sendSplice(id, it->second, true);
  recordPlan(it->second);
  closeStream(it, "parse");
  return true;
}

bool WorkerSession::handleCancel(uint32_t id) {
  auto it = streams_.find(id);
  if (it != streams_.end()) closeStream(it, "cancel");
  return true;
}

void WorkerSession::closeStream(Streams::iterator it, std::string_view how) {
  const StreamEntry& entry = it->second;
  tracePage(entry.stream->uri(), entry.status, how, entry.stream->includes(),
            entry.stream->bytesFed(), entry.openedNs);
  streams_.erase(it);
  --stats_.activeStreams;
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

void WorkerSession::sendFail(uint32_t id, std::string_view reason) {
  capnp::MallocMessageBuilder message;
  auto response = message.initRoot<wire::Response>();
  response.setStream(id);
  response.setFail(std::string(reason));
  send(message);
}

}  // namespace esi
