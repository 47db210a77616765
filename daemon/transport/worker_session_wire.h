// What the files of WorkerSession share (worker_session.cc the connection,
// worker_session_stream.cc, _plan.cc, _purge.cc and _purge_index.cc the
// message families, as the connector's files): the bounds of what a worker
// sends, and the steps that splices and plans both carry.  Private to
// esi_transport.

#pragma once

#include <cstddef>
#include <string>

#include <capnp/blob.h>
#include <kj/array.h>

#include "engine/stream.h"
#include "esi.capnp.h"

namespace esi::session {

// Answers queued beyond this stop esid from reading more requests until the
// worker drains its ring: back-pressure instead of unbounded memory.
constexpr size_t kMaxPendingAnswers = 256;
constexpr size_t kMaxOpenFieldBytes = size_t{16} * 1024;
constexpr size_t kMaxKeyBytes = size_t{64} * 1024;

inline bool tooLong(capnp::Text::Reader text, size_t limit) { return text.size() > limit; }

inline std::string textOf(capnp::Text::Reader text) {
  return std::string(text.cStr(), text.size());
}

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

}  // namespace esi::session
