// Streaming ESI parser: the "parse" part of Varnish's parse / fetch / deliver
// split.  It reads a response body in arbitrary chunks and reports, in stream
// order, which byte ranges go out unchanged and which ESI constructs replace the
// rest.  It never copies verbatim bytes: ranges are stream offsets, and the
// bytes stay with whoever holds the body.  Memory is bounded by
// ParserLimits::maxTagBytes whatever the page size.

#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

namespace esi {

struct ParserLimits {
  // The range esi_max_tag_size may set.
  static constexpr size_t kMinTagBytes = 256;
  static constexpr size_t kMaxTagBytes = size_t{1} << 20;

  // Longest ESI tag, from its '<' to its '>' with the attributes, buffered
  // across chunks; a longer one is passed through as text with a warning.
  size_t maxTagBytes = 8192;
};

class ParserSink {
 public:
  virtual ~ParserSink() = default;

  // Stream bytes [offset, offset + length) go out unchanged.
  virtual void verbatim(uint64_t offset, uint64_t length) = 0;

  // An <esi:include>; attribute values are entity-decoded, src is non-empty,
  // alt is empty when absent.
  virtual void include(std::string_view src, std::string_view alt,
                       bool continueOnError) = 0;

  // Odd markup; the parse goes on.  offset is where the construct began.
  virtual void warning(uint64_t offset, std::string_view what) = 0;
};

class Parser {
 public:
  explicit Parser(ParserSink& sink, ParserLimits limits = {});
  ~Parser();
  Parser(const Parser&) = delete;
  Parser& operator=(const Parser&) = delete;

  // The next bytes of the stream.
  void feed(std::string_view chunk);

  // End of stream: everything still pending is resolved.
  void finish();

  // No later verbatim() starts below this offset.
  uint64_t released() const;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace esi
