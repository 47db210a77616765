// Streaming ESI parser: the "parse" part of Varnish's parse / fetch / deliver
// split.  It reads a response body in arbitrary chunks and reports, in stream
// order, which byte ranges go out unchanged and which ESI constructs replace the
// rest.  It never copies verbatim bytes: ranges are stream offsets, and the
// bytes stay with whoever holds the body.  Memory is bounded by
// ParserLimits::maxTagBytes whatever the page size.
//
// Structure (ESI 1.0 choose/when/otherwise, try/attempt/except) is reported
// as it is found, always well nested: a construct in the wrong place or a
// stray end tag is dropped with a warning, an end tag that skips inner
// constructs closes them with a warning, and whatever is open at the end
// of the stream is closed there with a warning.  <esi:when> and
// <esi:otherwise> count only directly inside <esi:choose>; <esi:attempt>
// (one, first) and <esi:except> (one) only directly inside <esi:try>.
// Constructs nest at most kMaxBlockDepth deep; a deeper one is dropped with
// a warning, and so is the next end tag of any construct.

#pragma once

#include <cstddef>
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

// choose, when and otherwise; try, attempt and except.
enum class Block : uint8_t { CHOOSE, WHEN, OTHERWISE, TRY, ATTEMPT, EXCEPT };
std::string_view nameOf(Block block);

constexpr size_t kMaxBlockDepth = 64;

// How the parser reads the text of a run: inside how many <esi:vars>
// ($(...) is substituted) and whether inside <!--esi (whose "-->" is
// markup).  A parse resumed in the middle of a page starts in its run's.
struct TextContext {
  uint8_t varsDepth = 0;  // at most 255: deeper nesting reads the same
  bool esiComment = false;
  bool operator==(const TextContext&) const = default;
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

  // A $(...) reference inside <esi:vars>, as written (a well-formed one, as
  // expr/syntax.h reads them; anything else stays text).  References hold
  // no '<' and are at most maxTagBytes long.
  virtual void reference(std::string_view text) = 0;

  // A construct opens; test is the entity-decoded test attribute of
  // <esi:when> (empty when absent), empty for the others.
  virtual void open(Block block, std::string_view test) = 0;
  virtual void close(Block block) = 0;

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

  // A construct that opened (opens) or closed before the first byte fed, as
  // the parse of the bytes before reported it, in order: the parse starts
  // inside what is left open.  Nothing is reported.
  void replay(Block block, bool opens);

  // Before the first byte fed: the text it starts in.
  void resume(TextContext context);

  // Inside ParserSink::verbatim(): the text that run is in.
  TextContext runContext() const;

  // End of stream: everything still pending is resolved.
  void finish();

  // No later verbatim() starts below this offset.
  uint64_t released() const;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace esi
