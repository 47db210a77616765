// One response body being processed: feeds the parser and turns what it finds
// into splice instructions for the connector.  The "fetch" step of Varnish's
// split happens here: an include's src is resolved against the page before
// the connector ever sees it.

#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "engine/stats.h"
#include "parser/parser.h"

namespace esi {

struct VerbatimRun {
  uint64_t offset;
  uint32_t length;
};

struct IncludeCall {
  std::string path;  // empty: src was refused
  std::string args;
  std::string altPath;
  std::string altArgs;
  bool continueOnError = false;
};

using Instruction = std::variant<VerbatimRun, IncludeCall>;

class Stream final : private ParserSink {
 public:
  // base: the stream offset of the first byte fed (the worker dropped a
  // plan there; the parse starts afresh, outside any construct).
  Stream(std::string uri, std::string authority, Stats& stats, uint64_t base = 0,
         ParserLimits limits = {});

  void feed(std::string_view bytes);
  void finish();

  // Instructions found since the last call, in stream order.
  std::vector<Instruction> takeInstructions();
  uint64_t released() const { return base_ + parser_.released(); }

  // Keep the body and every instruction, for a parse plan, as long as the
  // body stays within maxBytes; a longer body is not recorded.
  void record(size_t maxBytes);
  bool recording() const { return recording_; }
  const std::string& recordedBody() const { return body_; }
  const std::vector<Instruction>& recordedInstructions() const { return recorded_; }

 private:
  void verbatim(uint64_t offset, uint64_t length) override;
  void include(std::string_view src, std::string_view alt,
               bool continueOnError) override;
  void warning(uint64_t offset, std::string_view what) override;

  const std::string uri_;
  const std::string authority_;
  Stats& stats_;
  const uint64_t base_;
  std::vector<Instruction> pending_;
  bool recording_ = false;
  size_t maxRecordBytes_ = 0;
  std::string body_;
  std::vector<Instruction> recorded_;
  Parser parser_;
};

}  // namespace esi
