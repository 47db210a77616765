// The streaming ESI parser fed a page in random chunks must say what it says
// when fed the whole page at once, and keep its streaming promises on the way
// (parser.h): verbatim ranges ascend, lie within the bytes fed and never below
// a released() already observed; released() never goes back nor past the
// bytes fed, and trails them by no more than a held tag.  References and
// constructs are reported as they are met, the same whatever the chunks;
// constructs are always well nested and in their places, at most
// kMaxBlockDepth deep, and all closed by the end.
//
// Input: 8 bytes of header, then the page.
//   byte 0       bits 0-1: ParserLimits::maxTagBytes (8192, 16, 64, 512)
//                bit 2: byte by byte instead of random chunks
//   bytes 1-7    seed of the chunk sizes

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "fuzz_check.h"
#include "parser/parser.h"

namespace esi {
namespace {

constexpr size_t kHeader = 8;
constexpr size_t kTagLimits[] = {8192, 16, 64, 512};
// Longest opener held before an ESI tag begins ("<![CDATA[" less its last
// byte); the tag limit does not count those.
constexpr uint64_t kLongestOpener = 8;

struct Parse {
  std::string assembled;  // verbatim bytes and include markers, in order
  std::string warnings;   // "offset: what\n" each
};

// Applies what the parser reports to the page and checks every promise as
// it is made.
class Assembler final : public ParserSink {
 public:
  Assembler(std::string_view page, ParserLimits limits)
      : page_(page), limits_(limits), parser_(*this, limits) {}

  void feedTo(size_t end) {
    const size_t start = fed_;
    fed_ = end;
    parser_.feed(page_.substr(start, end - start));
    const uint64_t released = parser_.released();
    FUZZ_CHECK(released >= released_);
    FUZZ_CHECK(released <= fed_);
    // Only a '<' whose meaning is open is held (parser.h: memory bounded by
    // maxTagBytes whatever the page).
    FUZZ_CHECK(fed_ - released <= limits_.maxTagBytes + kLongestOpener);
    released_ = released;
  }

  Parse finish() {
    parser_.finish();
    FUZZ_CHECK(parser_.released() >= released_);
    FUZZ_CHECK(parser_.released() == fed_);
    FUZZ_CHECK(blocks_.empty());
    return std::move(result_);
  }

  void verbatim(uint64_t offset, uint64_t length) override {
    FUZZ_CHECK(length > 0);
    FUZZ_CHECK(offset >= verbatimEnd_);
    FUZZ_CHECK(!anyVerbatim_ || offset > lastOffset_);
    FUZZ_CHECK(offset >= released_);
    FUZZ_CHECK(offset <= fed_ && length <= fed_ - offset);
    anyVerbatim_ = true;
    lastOffset_ = offset;
    verbatimEnd_ = offset + length;
    result_.assembled.append(page_.substr(offset, length));
  }

  void include(std::string_view src, std::string_view alt,
               bool continueOnError) override {
    FUZZ_CHECK(!src.empty());
    // Sizes first, so that no src or alt can forge a marker.
    result_.assembled += "\x01include " + std::to_string(src.size()) + " " +
                         std::to_string(alt.size()) + " " +
                         (continueOnError ? "continue " : "") +
                         std::string(src) + std::string(alt) + "\x01";
  }

  void reference(std::string_view text) override {
    FUZZ_CHECK(text.size() >= 4 && text.starts_with("$(") && text.ends_with(")"));
    FUZZ_CHECK(text.size() <= limits_.maxTagBytes);
    FUZZ_CHECK(text.find('<') == std::string_view::npos);
    result_.assembled += "\x01ref " + std::to_string(text.size()) + " " +
                         std::string(text) + "\x01";
  }

  void open(Block block, std::string_view test) override {
    const bool inChoose = !blocks_.empty() && blocks_.back() == Block::CHOOSE;
    const bool inTry = !blocks_.empty() && blocks_.back() == Block::TRY;
    switch (block) {
      case Block::WHEN:
      case Block::OTHERWISE: FUZZ_CHECK(inChoose); break;
      case Block::ATTEMPT:
      case Block::EXCEPT: FUZZ_CHECK(inTry); break;
      case Block::CHOOSE:
      case Block::TRY: break;
    }
    FUZZ_CHECK(block == Block::WHEN || test.empty());
    FUZZ_CHECK(blocks_.size() < kMaxBlockDepth);
    blocks_.push_back(block);
    result_.assembled += "\x01open " + std::string(nameOf(block)) + " " +
                         std::to_string(test.size()) + " " + std::string(test) +
                         "\x01";
  }

  void close(Block block) override {
    FUZZ_CHECK(!blocks_.empty() && blocks_.back() == block);
    blocks_.pop_back();
    result_.assembled += "\x01close " + std::string(nameOf(block)) + "\x01";
  }

  void warning(uint64_t offset, std::string_view what) override {
    FUZZ_CHECK(offset <= fed_);
    FUZZ_CHECK(!what.empty());
    result_.warnings += std::to_string(offset) + ": " + std::string(what) + "\n";
  }

 private:
  const std::string_view page_;
  const ParserLimits limits_;
  size_t fed_ = 0;
  uint64_t released_ = 0;
  uint64_t verbatimEnd_ = 0;
  uint64_t lastOffset_ = 0;
  bool anyVerbatim_ = false;
  std::vector<Block> blocks_;
  Parse result_;
  Parser parser_;
};

// splitmix64: chunk sizes that the header bytes decide, the same every run.
uint64_t nextRandom(uint64_t& state) {
  uint64_t z = (state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

std::vector<size_t> chunkEnds(size_t size, bool byteByByte, uint64_t seed) {
  std::vector<size_t> ends;
  for (size_t at = 0; at < size;) {
    size_t n = 1;
    if (!byteByByte) {
      // Mostly short chunks, so that boundaries fall inside constructs,
      // with the odd long one.
      const uint64_t r = nextRandom(seed);
      n = (r & 7) == 0 ? 1 + (r >> 8) % 4096 : 1 + (r >> 8) % 16;
    }
    at += std::min(n, size - at);
    ends.push_back(at);
  }
  return ends;
}

}  // namespace
}  // namespace esi

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace esi;
  if (size < kHeader) return 0;
  ParserLimits limits;
  limits.maxTagBytes = kTagLimits[data[0] & 3];
  const bool byteByByte = (data[0] & 4) != 0;
  uint64_t seed = 0;
  for (size_t i = 1; i < kHeader; ++i) seed = seed << 8 | data[i];
  const std::string_view page(reinterpret_cast<const char*>(data) + kHeader,
                              size - kHeader);

  Assembler whole(page, limits);
  whole.feedTo(page.size());
  const Parse expected = whole.finish();

  Assembler chunked(page, limits);
  for (const size_t end : chunkEnds(page.size(), byteByByte, seed)) {
    chunked.feedTo(end);
  }
  const Parse actual = chunked.finish();

  FUZZ_CHECK(actual.assembled == expected.assembled);
  FUZZ_CHECK(actual.warnings == expected.warnings);
  return 0;
}
