// One response body being processed: feeds the parser, compiles what it
// finds into program steps (engine/program.h) and evaluates them at once
// for the request, giving splice instructions for the connector.  The
// "fetch" step of Varnish's split happens here: an include's src is
// resolved against the page before the connector ever sees it.

#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "engine/program.h"
#include "engine/stats.h"
#include "parser/parser.h"

namespace esi {

class Stream final : private ParserSink {
 public:
  // base: the stream offset of the first byte fed (the worker dropped a
  // plan there; the parse starts afresh, outside any construct).
  Stream(std::string uri, std::string authority, Stats& stats, uint64_t base = 0,
         ParserLimits limits = {});

  // What the request's variables read; before the first feed().
  void setRequestValues(RequestValues values) { values_ = std::move(values); }

  // The parse starts inside the constructs the steps before base leave
  // open (a plan's, whose replay stopped at base), in the text context
  // there: each construct is replayed into the parser and evaluated for
  // this request.  False when one left open is a try: the connector never
  // has esid parse from inside one (the attempt's held output and its
  // markers are the connector's).
  bool resumeInside(const std::vector<ProgramStep>& before, TextContext context);

  void feed(std::string_view bytes);
  void finish();

  // Instructions found since the last call, in stream order.
  std::vector<Instruction> takeInstructions();
  uint64_t released() const { return base_ + parser_.released(); }

  // Keep the body and the program, for a parse plan, as long as the body
  // stays within maxBytes; a longer body is not recorded.
  void record(size_t maxBytes);
  bool recording() const { return recording_; }
  const std::string& recordedBody() const { return body_; }
  const std::vector<ProgramStep>& recordedProgram() const { return program_; }

  // For the trace: the page's path, its includes and the bytes fed so far.
  const std::string& uri() const { return page_.uri; }
  uint64_t includes() const { return includes_; }
  uint64_t bytesFed() const { return bytesFed_; }

 private:
  void verbatim(uint64_t offset, uint64_t length) override;
  void include(std::string_view src, std::string_view alt,
               bool continueOnError) override;
  void reference(std::string_view text) override;
  void open(Block block, std::string_view test) override;
  void close(Block block) override;
  void warning(uint64_t offset, std::string_view what) override;

  void add(ProgramStep step);
  std::optional<IncludeCall> resolveOnce(const IncludeStep& step);

  const PageAddress page_;
  Stats& stats_;
  const uint64_t base_;
  RequestValues values_;
  Evaluator evaluator_{page_, values_};
  std::vector<Instruction> pending_;
  bool recording_ = false;
  size_t maxRecordBytes_ = 0;
  std::string body_;
  std::vector<ProgramStep> program_;
  uint64_t includes_ = 0;
  uint64_t bytesFed_ = 0;
  Parser parser_;
};

}  // namespace esi
