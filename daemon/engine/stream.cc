#include "engine/stream.h"

#include <spdlog/spdlog.h>

#include "parser/include_uri.h"

namespace esi {

Stream::Stream(std::string uri, std::string authority, Stats& stats, uint64_t base,
               ParserLimits limits)
    : page_{std::move(uri), std::move(authority)}, stats_(stats), base_(base),
      parser_(*this, limits) {}

void Stream::record(size_t maxBytes) {
  recording_ = true;
  maxRecordBytes_ = maxBytes;
}

bool Stream::resumeInside(const std::vector<ProgramStep>& before, TextContext context) {
  parser_.resume(context);
  std::vector<Instruction> replayed;  // the connector has them already
  unsigned tries = 0;
  for (const ProgramStep& step : before) {
    if (const auto* open = std::get_if<BlockOpen>(&step)) {
      parser_.replay(open->block, true);
      tries += open->block == Block::TRY;
    } else if (const auto* close = std::get_if<BlockClose>(&step)) {
      parser_.replay(close->block, false);
      tries -= close->block == Block::TRY;
    } else {
      continue;
    }
    evaluator_.step(step, replayed);
  }
  return tries == 0;
}

void Stream::feed(std::string_view bytes) {
  stats_.bytes += bytes.size();
  bytesFed_ += bytes.size();
  if (recording_) {
    if (body_.size() + bytes.size() > maxRecordBytes_) {
      recording_ = false;
      body_ = {};
      program_ = {};
    } else {
      body_.append(bytes);
    }
  }
  parser_.feed(bytes);
}

void Stream::finish() { parser_.finish(); }

std::vector<Instruction> Stream::takeInstructions() { return std::exchange(pending_, {}); }

void Stream::add(ProgramStep step) {
  evaluator_.step(step, pending_);
  if (!recording_) return;
  if (const auto* run = std::get_if<VerbatimRun>(&step)) {
    appendVerbatim(program_, run->offset, run->length, run->context);
  } else {
    program_.push_back(std::move(step));
  }
}

void Stream::verbatim(uint64_t offset, uint64_t length) {
  // Split as the wire needs; add() merges the pieces again where it can.
  std::vector<ProgramStep> runs;
  appendVerbatim(runs, base_ + offset, length, parser_.runContext());
  for (ProgramStep& run : runs) add(std::move(run));
}

void Stream::include(std::string_view src, std::string_view alt,
                     bool continueOnError) {
  ++stats_.includes;
  ++includes_;
  IncludeStep step;
  step.src = Template::compile(src);
  if (!alt.empty()) step.alt = Template::compile(alt);
  step.continueOnError = continueOnError;
  if (!step.src.hasReferences() && !(step.alt && step.alt->hasReferences())) {
    step.resolved = resolveOnce(step);
  } else {
    ++stats_.fragmentsDeferred;
  }
  add(std::move(step));
}

// Logs what is refused: the page decides, not the request.
std::optional<IncludeCall> Stream::resolveOnce(const IncludeStep& step) {
  const RequestVariables none;
  IncludeCall call;
  call.continueOnError = step.continueOnError;
  const std::string src = step.src.render(none, Escaping::URL);
  IncludeUri resolved = resolveInclude(src, page_.uri, page_.authority);
  if (resolved.ok) {
    call.path = std::move(resolved.path);
    call.args = std::move(resolved.args);
    ++stats_.fragmentsResolved;
  } else {
    ++stats_.errors;
    ++stats_.fragmentsRefused;
    // Escaped and quoted: a src's CR or LF must not forge lines in the log.
    spdlog::warn("{:?}: include {:?} refused: {}", page_.uri, src, resolved.reason);
  }
  if (step.alt) {
    const std::string alt = step.alt->render(none, Escaping::URL);
    IncludeUri altResolved = resolveInclude(alt, page_.uri, page_.authority);
    if (altResolved.ok) {
      call.altPath = std::move(altResolved.path);
      call.altArgs = std::move(altResolved.args);
    } else {
      ++stats_.errors;
      spdlog::warn("{:?}: include alt {:?} refused: {}", page_.uri, alt,
                   altResolved.reason);
    }
  }
  return call;
}

void Stream::reference(std::string_view text) {
  add(LiteralStep{Template::compile(text)});
}

void Stream::open(Block block, std::string_view test) {
  BlockOpen step{block, {}};
  if (block == Block::WHEN) {
    step.test = Expression::compile(test);
    step.testReadsRequest = !step.test.uses().empty();
    if (!step.test.ok()) {
      // Once per parse: a plan keeps the compiled test and logs nothing.
      ++stats_.warnings;
      spdlog::warn("{:?}: <esi:when test={:?}> is malformed, taken as false: {}",
                   page_.uri, test, step.test.error());
    }
  }
  add(std::move(step));
}

void Stream::close(Block block) { add(BlockClose{block}); }

void Stream::warning(uint64_t offset, std::string_view what) {
  ++stats_.warnings;
  spdlog::warn("{:?}: ESI markup at byte {}: {}", page_.uri, offset, what);
}

}  // namespace esi
