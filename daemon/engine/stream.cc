#include "engine/stream.h"

#include <limits>

#include <spdlog/spdlog.h>

#include "parser/include_uri.h"

namespace esi {

Stream::Stream(std::string uri, std::string authority, Stats& stats, uint64_t base,
               ParserLimits limits)
    : uri_(std::move(uri)), authority_(std::move(authority)), stats_(stats), base_(base),
      parser_(*this, limits) {}

void Stream::record(size_t maxBytes) {
  recording_ = true;
  maxRecordBytes_ = maxBytes;
}

void Stream::feed(std::string_view bytes) {
  stats_.bytes += bytes.size();
  if (recording_) {
    if (body_.size() + bytes.size() > maxRecordBytes_) {
      recording_ = false;
      body_ = {};
      recorded_ = {};
    } else {
      body_.append(bytes);
    }
  }
  parser_.feed(bytes);
}

void Stream::finish() { parser_.finish(); }

std::vector<Instruction> Stream::takeInstructions() {
  if (recording_) recorded_.insert(recorded_.end(), pending_.begin(), pending_.end());
  return std::exchange(pending_, {});
}

void Stream::verbatim(uint64_t offset, uint64_t length) {
  offset += base_;
  // The wire carries 32-bit lengths; longer runs go out as several.
  constexpr uint64_t kMaxRun = std::numeric_limits<uint32_t>::max();
  while (length > 0) {
    const uint64_t run = std::min(length, kMaxRun);
    if (!pending_.empty()) {
      if (auto* last = std::get_if<VerbatimRun>(&pending_.back());
          last && last->offset + last->length == offset &&
          last->length + run <= kMaxRun) {
        last->length += static_cast<uint32_t>(run);
        offset += run;
        length -= run;
        continue;
      }
    }
    pending_.push_back(VerbatimRun{offset, static_cast<uint32_t>(run)});
    offset += run;
    length -= run;
  }
}

void Stream::include(std::string_view src, std::string_view alt,
                     bool continueOnError) {
  ++stats_.includes;
  IncludeCall call;
  call.continueOnError = continueOnError;

  IncludeUri resolved = resolveInclude(src, uri_, authority_);
  if (resolved.ok) {
    call.path = std::move(resolved.path);
    call.args = std::move(resolved.args);
  } else {
    ++stats_.errors;
    // Escaped and quoted: a src's CR or LF must not forge lines in the log.
    spdlog::warn("{}: include {:?} refused: {}", uri_, src, resolved.reason);
  }

  if (!alt.empty()) {
    IncludeUri altResolved = resolveInclude(alt, uri_, authority_);
    if (altResolved.ok) {
      call.altPath = std::move(altResolved.path);
      call.altArgs = std::move(altResolved.args);
    } else {
      ++stats_.errors;
      spdlog::warn("{}: include alt {:?} refused: {}", uri_, alt,
                   altResolved.reason);
    }
  }

  pending_.push_back(std::move(call));
}

void Stream::warning(uint64_t offset, std::string_view what) {
  ++stats_.warnings;
  spdlog::warn("{}: ESI markup at byte {}: {}", uri_, offset, what);
}

}  // namespace esi
