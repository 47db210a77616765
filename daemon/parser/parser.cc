// The parser is a byte-driven state machine in the manner of Varnish's
// cache_esi_parse.c.  Verbatim output is a run of stream offsets that grows
// as text is consumed and is cut wherever markup is dropped.  The only bytes
// ever kept are those of a '<' whose meaning is not yet known.

#include "parser/parser.h"

#include <algorithm>
#include <optional>
#include <vector>

#include "expr/syntax.h"

namespace esi {
namespace {

bool isSpace(char c) { return c == ' ' || c == '\t' || c == '\r' || c == '\n'; }

std::string_view trimLeft(std::string_view text) {
  while (!text.empty() && isSpace(text.front())) text.remove_prefix(1);
  return text;
}

// --------------------------------------------------------------------------
// Attribute values

std::optional<char32_t> entityValue(std::string_view name) {
  if (name == "amp") return U'&';
  if (name == "lt") return U'<';
  if (name == "gt") return U'>';
  if (name == "quot") return U'"';
  if (name == "apos") return U'\'';
  if (name.size() < 2 || name[0] != '#') return std::nullopt;

  // XML spells the hexadecimal form with a lowercase 'x' only.
  const bool hex = name[1] == 'x';
  const std::string_view digits = name.substr(hex ? 2 : 1);
  if (digits.empty() || digits.size() > 7) return std::nullopt;
  char32_t codePoint = 0;
  for (const char c : digits) {
    unsigned digit;
    if (c >= '0' && c <= '9') {
      digit = c - '0';
    } else if (hex && c >= 'a' && c <= 'f') {
      digit = c - 'a' + 10;
    } else if (hex && c >= 'A' && c <= 'F') {
      digit = c - 'A' + 10;
    } else {
      return std::nullopt;
    }
    codePoint = codePoint * (hex ? 16 : 10) + digit;
  }
  if (codePoint == 0 || codePoint > 0x10ffff ||
      (codePoint >= 0xd800 && codePoint <= 0xdfff)) {
    return std::nullopt;
  }
  return codePoint;
}

void appendUtf8(std::string& out, char32_t c) {
  if (c < 0x80) {
    out += static_cast<char>(c);
  } else if (c < 0x800) {
    out += static_cast<char>(0xc0 | (c >> 6));
    out += static_cast<char>(0x80 | (c & 0x3f));
  } else if (c < 0x10000) {
    out += static_cast<char>(0xe0 | (c >> 12));
    out += static_cast<char>(0x80 | ((c >> 6) & 0x3f));
    out += static_cast<char>(0x80 | (c & 0x3f));
  } else {
    out += static_cast<char>(0xf0 | (c >> 18));
    out += static_cast<char>(0x80 | ((c >> 12) & 0x3f));
    out += static_cast<char>(0x80 | ((c >> 6) & 0x3f));
    out += static_cast<char>(0x80 | (c & 0x3f));
  }
}

// Anything that is not a well-formed entity stays as written.
std::string decodeEntities(std::string_view in) {
  // "&#x" and seven digits and ";" is the longest entityValue() reads.
  constexpr size_t LONGEST_ENTITY = 11;
  std::string out;
  out.reserve(in.size());
  for (;;) {
    const size_t amp = in.find('&');
    out.append(in.substr(0, amp));
    if (amp == std::string_view::npos) return out;
    in.remove_prefix(amp);
    const size_t semi = in.substr(0, LONGEST_ENTITY).find(';');
    if (semi != std::string_view::npos) {
      if (const auto c = entityValue(in.substr(1, semi - 1))) {
        appendUtf8(out, *c);
        in.remove_prefix(semi + 1);
        continue;
      }
    }
    out += '&';
    in.remove_prefix(1);
  }
}

struct Attribute {
  std::string_view name;
  std::string_view value;
};

enum class AttributeScan { FOUND, END, MALFORMED };

// Takes the next name="value" (or 'value', or an unquoted value as Varnish
// accepts) off the front of text.
AttributeScan nextAttribute(std::string_view& text, Attribute& attribute) {
  text = trimLeft(text);
  if (text.empty()) return AttributeScan::END;

  size_t n = 0;
  while (n < text.size() && !isSpace(text[n]) && text[n] != '=' &&
         text[n] != '"' && text[n] != '\'') {
    ++n;
  }
  if (n == 0) return AttributeScan::MALFORMED;
  attribute.name = text.substr(0, n);

  text = trimLeft(text.substr(n));
  if (text.empty() || text.front() != '=') return AttributeScan::MALFORMED;
  text = trimLeft(text.substr(1));
  if (text.empty()) return AttributeScan::MALFORMED;

  if (text.front() == '"' || text.front() == '\'') {
    const size_t close = text.find(text.front(), 1);
    if (close == std::string_view::npos) return AttributeScan::MALFORMED;
    attribute.value = text.substr(1, close - 1);
    text.remove_prefix(close + 1);
  } else {
    n = 0;
    while (n < text.size() && !isSpace(text[n])) ++n;
    attribute.value = text.substr(0, n);
    text.remove_prefix(n);
  }
  return AttributeScan::FOUND;
}

// --------------------------------------------------------------------------
// What a '<' may open.  A construct is known once the held bytes match one
// of these and no longer one could still match.

enum class Opener { ESI_COMMENT, COMMENT, CDATA, ESI_TAG };

struct OpenerText {
  std::string_view text;
  Opener opener;
};

constexpr OpenerText OPENERS[] = {
    {"<!--esi", Opener::ESI_COMMENT}, {"<!--", Opener::COMMENT},
    {"<![CDATA[", Opener::CDATA},     {"<esi:", Opener::ESI_TAG},
    {"</esi:", Opener::ESI_TAG},
};

constexpr std::string_view BLOCK_NAMES[] = {"choose", "when",    "otherwise",
                                            "try",    "attempt", "except"};

std::optional<Block> blockNamed(std::string_view name) {
  for (size_t i = 0; i < std::size(BLOCK_NAMES); ++i) {
    if (BLOCK_NAMES[i] == name) return static_cast<Block>(i);
  }
  return std::nullopt;
}

}  // namespace

std::string_view nameOf(Block block) {
  return BLOCK_NAMES[static_cast<size_t>(block)];
}

struct Parser::State {
  enum class Mode {
    TEXT,     // text, or dropped content inside <esi:remove>
    OPENER,   // after '<', holding bytes until the construct is known
    ESI_TAG,  // holding an <esi:...> or </esi:...> until its '>'
    COMMENT,  // inside <!-- -->, until "-->"
    CDATA,    // inside <![CDATA[ ]]>, until "]]>"
    REFERENCE,  // in <esi:vars>, holding a "$(" until its ')'
  };

  // An open construct; for try, which of its parts came already.
  struct OpenBlock {
    Block block;
    bool attempted = false;
    bool excepted = false;
  };

  State(ParserSink& sink, ParserLimits limits) : sink(sink), limits(limits) {}

  void feed(std::string_view in);
  void finish();
  uint64_t released() const { return inRun ? runStart : pos; }

  void scanText(std::string_view& in);
  void scanOpener(std::string_view& in);
  void scanEsiTag(std::string_view& in);
  void scanUntil(std::string_view& in, char repeated);
  void scanReference(std::string_view& in);

  void open(Opener opener);
  void resolveTag();
  void openTag(std::string_view name, std::string_view attributes,
               bool selfClosing);
  void closeTag(std::string_view name);
  void include(std::string_view attributes, bool selfClosing);
  void openBlock(Block block, std::string_view attributes, bool selfClosing);
  void closeBlock(Block block);
  bool substituting() const { return varsDepth > 0 && removeDepth == 0; }
  TextContext context() const {
    return {static_cast<uint8_t>(std::min(varsDepth, 255u)), inEsiComment};
  }

  bool holding() const {
    return mode == Mode::OPENER || mode == Mode::ESI_TAG ||
           mode == Mode::REFERENCE || (mode == Mode::TEXT && closeMatch > 0);
  }
  void consume(std::string_view& in, size_t n) {
    in.remove_prefix(n);
    pos += n;
  }
  void cutRun(uint64_t end);
  void dropHeld();
  void keepHeld();
  void warn(uint64_t offset, std::string_view what);

  ParserSink& sink;
  const ParserLimits limits;

  Mode mode = Mode::TEXT;
  uint64_t pos = 0;  // stream offset of the next byte to consume

  // Outside <esi:remove>, [runStart, pos) goes out verbatim once it is no
  // longer held; inside, nothing does.
  bool inRun = true;
  uint64_t runStart = 0;
  TextContext runContext;  // as it was at runStart

  std::string tag;         // the held '<...' or "$(..." bytes
  uint64_t holdStart = 0;  // where the held '<...' or "--" begins
  int closeMatch = 0;      // "--" or "]]" seen of a closing "-->" or "]]>"
  char tagQuote = 0;       // in ESI_TAG: open quote, or '=' before a value

  unsigned removeDepth = 0;
  uint64_t removeStart = 0;
  bool inEsiComment = false;
  uint64_t esiCommentStart = 0;
  uint64_t commentStart = 0;  // of the HTML comment or CDATA section
  bool includeOpen = false;   // an <esi:include ...> awaits </esi:include>
  unsigned varsDepth = 0;

  // In REFERENCE: inside {key}, after '|', inside a quoted default, after a
  // backslash there.
  bool referenceKey = false;
  bool referenceDefault = false;
  bool referenceQuote = false;
  bool referenceEscape = false;

  std::vector<OpenBlock> blocks;  // at most kMaxBlockDepth
  unsigned blocksDropped = 0;     // too deep: their end tags are dropped too
};

// --------------------------------------------------------------------------
// Output bookkeeping

// Reports the run up to end, where markup that is dropped begins.
void Parser::State::cutRun(uint64_t end) {
  if (inRun && end > runStart) {
    sink.verbatim(runStart, end - runStart);
    runStart = end;
  }
}

// The held bytes are markup that goes out as nothing.
void Parser::State::dropHeld() {
  cutRun(holdStart);
  inRun = removeDepth == 0;
  runStart = pos;
  runContext = context();
  tag.clear();
  closeMatch = 0;
  mode = Mode::TEXT;
}

// The held bytes are text after all, which outside <esi:remove> the run
// already covers.
void Parser::State::keepHeld() {
  tag.clear();
  closeMatch = 0;
  mode = Mode::TEXT;
}

// Verbatim output before offset is reported first, to keep stream order.
void Parser::State::warn(uint64_t offset, std::string_view what) {
  cutRun(offset);
  sink.warning(offset, what);
}

// --------------------------------------------------------------------------
// Scanning

void Parser::State::feed(std::string_view in) {
  while (!in.empty()) {
    switch (mode) {
      case Mode::TEXT: scanText(in); break;
      case Mode::OPENER: scanOpener(in); break;
      case Mode::ESI_TAG: scanEsiTag(in); break;
      case Mode::COMMENT: scanUntil(in, '-'); break;
      case Mode::CDATA: scanUntil(in, ']'); break;
      case Mode::REFERENCE: scanReference(in); break;
    }
  }
  // Hand over what is certain so the caller can send it and free its buffer.
  cutRun(holding() ? holdStart : pos);
}

void Parser::State::scanText(std::string_view& in) {
  const bool references = substituting();
  if (!inEsiComment) {
    const size_t lt = references ? in.find_first_of("<$") : in.find('<');
    if (lt == std::string_view::npos) {
      consume(in, in.size());
      return;
    }
    consume(in, lt);
  } else {
    // Inside <!--esi, also look for the "-->" that ends it.
    while (!in.empty() && in.front() != '<' &&
           !(references && in.front() == '$')) {
      const char c = in.front();
      consume(in, 1);
      if (c == '-') {
        if (closeMatch == 0) {
          holdStart = pos - 1;
        } else if (closeMatch == 2) {
          ++holdStart;  // "--->": the first dash is text
        }
        closeMatch = std::min(closeMatch + 1, 2);
      } else if (c == '>' && closeMatch == 2) {
        inEsiComment = false;
        dropHeld();
        return;
      } else {
        closeMatch = 0;
      }
    }
    if (in.empty()) return;
    closeMatch = 0;
  }
  holdStart = pos;
  if (in.front() == '$') {
    tag.assign(1, '$');
    consume(in, 1);
    referenceKey = referenceDefault = referenceQuote = referenceEscape = false;
    mode = Mode::REFERENCE;
    return;
  }
  tag.assign(1, '<');
  consume(in, 1);
  mode = Mode::OPENER;
}

void Parser::State::scanOpener(std::string_view& in) {
  while (!in.empty()) {
    tag += in.front();
    const OpenerText* complete = nullptr;
    bool longer = false;
    for (const auto& candidate : OPENERS) {
      if (candidate.text.starts_with(tag)) {
        if (candidate.text.size() == tag.size()) complete = &candidate;
        longer |= candidate.text.size() > tag.size();
      }
    }
    if (complete == nullptr && !longer) {
      // This byte settles it, and belongs to whatever follows the opener.
      tag.pop_back();
      for (const auto& candidate : OPENERS) {
        if (tag.starts_with(candidate.text)) {
          open(candidate.opener);  // "<!--" not followed by "esi"
          return;
        }
      }
      keepHeld();
      return;
    }
    consume(in, 1);
    if (complete != nullptr && !longer) {
      open(complete->opener);
      return;
    }
  }
}

void Parser::State::open(Opener opener) {
  switch (opener) {
    case Opener::ESI_COMMENT:
      if (inEsiComment) warn(holdStart, "<!--esi inside <!--esi");
      inEsiComment = true;
      esiCommentStart = holdStart;
      dropHeld();
      break;
    case Opener::COMMENT:
    case Opener::CDATA:
      commentStart = holdStart;
      keepHeld();
      mode = opener == Opener::COMMENT ? Mode::COMMENT : Mode::CDATA;
      break;
    case Opener::ESI_TAG:
      tagQuote = 0;
      mode = Mode::ESI_TAG;
      break;
  }
}

void Parser::State::scanUntil(std::string_view& in, char repeated) {
  size_t n = 0;
  while (n < in.size()) {
    const char c = in[n++];
    if (c == repeated) {
      closeMatch = std::min(closeMatch + 1, 2);
    } else if (c == '>' && closeMatch == 2) {
      consume(in, n);
      keepHeld();
      return;
    } else {
      closeMatch = 0;
    }
  }
  consume(in, n);
}

void Parser::State::scanEsiTag(std::string_view& in) {
  for (size_t n = 0; n < in.size(); ++n) {
    const char c = in[n];
    if (c == '<') {
      // XML allows no '<' in a tag, so this one starts something new.
      consume(in, n);
      warn(holdStart, "'<' inside an ESI tag, the tag taken as text");
      keepHeld();
      return;
    }
    if (tag.size() + n >= limits.maxTagBytes) {
      consume(in, n);
      warn(holdStart, "ESI tag longer than maxTagBytes, taken as text");
      keepHeld();
      return;
    }
    if (tagQuote == '"' || tagQuote == '\'') {
      if (c == tagQuote) tagQuote = 0;
    } else if (c == '>') {
      tag.append(in.substr(0, n + 1));
      consume(in, n + 1);
      resolveTag();
      return;
    } else if (c == '=') {
      tagQuote = '=';
    } else if (tagQuote == '=' && (c == '"' || c == '\'')) {
      tagQuote = c;
    } else if (!isSpace(c)) {
      tagQuote = 0;
    }
  }
  tag.append(in);
  consume(in, in.size());
}

// Holds "$(" and what follows up to the ')' that ends a reference, as
// expr::parseReference reads one; a byte no reference can hold there makes
// the held bytes text, and that byte is scanned afresh.
void Parser::State::scanReference(std::string_view& in) {
  for (size_t n = 0; n < in.size(); ++n) {
    const char c = in[n];
    const size_t at = tag.size() + n;
    bool text = false;
    if (at >= limits.maxTagBytes) {
      consume(in, n);
      warn(holdStart, "$( longer than maxTagBytes, taken as text");
      keepHeld();
      return;
    }
    if (at == 1) {
      text = c != '(';
    } else if (at == 2) {
      text = c < 'A' || c > 'Z';  // $(document) is jQuery's
    } else if (referenceQuote) {
      if (referenceEscape) {
        referenceEscape = false;
      } else if (c == '\\') {
        referenceEscape = true;
      } else if (c == '\'') {
        referenceQuote = false;
      }
      text = c == '<';
    } else if (referenceKey) {
      referenceKey = c != '}';
      text = c == '<';
    } else if (c == ')') {
      tag.append(in.substr(0, n + 1));
      consume(in, n + 1);
      size_t length = 0;
      if (expr::parseReference(tag, length) && length == tag.size()) {
        cutRun(holdStart);
        sink.reference(tag);
        dropHeld();
      } else {
        keepHeld();
      }
      return;
    } else if (c == '<' || c == '$') {
      text = true;
    } else if (c == '{' && !referenceDefault) {
      referenceKey = true;
    } else if (c == '|') {
      referenceDefault = true;
    } else if (c == '\'' && referenceDefault) {
      referenceQuote = true;
    }
    if (text) {
      consume(in, n);
      keepHeld();
      return;
    }
  }
  tag.append(in);
  consume(in, in.size());
}

// --------------------------------------------------------------------------
// ESI tags, whole

void Parser::State::resolveTag() {
  const bool endTag = tag[1] == '/';
  std::string_view body(tag);
  body.remove_prefix(endTag ? 6 : 5);  // "</esi:" or "<esi:"
  body.remove_suffix(1);               // '>'

  size_t n = 0;
  while (n < body.size() && !isSpace(body[n]) && body[n] != '/') ++n;
  const std::string_view name = body.substr(0, n);
  std::string_view attributes = body.substr(n);
  const bool selfClosing = !attributes.empty() && attributes.back() == '/';
  if (selfClosing) attributes.remove_suffix(1);

  if (removeDepth > 0) {
    // Everything is dropped; only the nesting of remove matters.
    if (name == "remove" && !selfClosing) {
      if (endTag) {
        --removeDepth;
      } else {
        warn(holdStart, "<esi:remove> inside <esi:remove>");
        ++removeDepth;
      }
    }
    dropHeld();
  } else if (endTag) {
    closeTag(name);
  } else {
    openTag(name, attributes, selfClosing);
  }
}

void Parser::State::openTag(std::string_view name, std::string_view attributes,
                            bool selfClosing) {
  if (name == "include") {
    include(attributes, selfClosing);
  } else if (const auto block = blockNamed(name)) {
    openBlock(*block, attributes, selfClosing);
  } else if (name == "remove") {
    if (selfClosing) {
      warn(holdStart, "<esi:remove/> removes nothing");
    } else {
      removeDepth = 1;
      removeStart = holdStart;
    }
  } else if (name == "vars") {
    if (!selfClosing) ++varsDepth;
  } else if (name != "comment") {
    warn(holdStart, "unknown ESI tag passed through");
    keepHeld();
    return;
  }
  dropHeld();
}

void Parser::State::closeTag(std::string_view name) {
  if (name == "remove") {
    warn(holdStart, "</esi:remove> without <esi:remove>");
  } else if (const auto block = blockNamed(name)) {
    closeBlock(*block);
  } else if (name == "include") {
    if (!includeOpen) warn(holdStart, "</esi:include> without <esi:include>");
    includeOpen = false;
  } else if (name == "vars") {
    if (varsDepth == 0) {
      warn(holdStart, "</esi:vars> without <esi:vars>");
    } else {
      --varsDepth;
    }
  } else if (name != "comment") {
    warn(holdStart, "unknown ESI end tag passed through");
    keepHeld();
    return;
  }
  dropHeld();
}

void Parser::State::include(std::string_view attributes, bool selfClosing) {
  std::string src;
  std::string alt;
  bool srcSeen = false;
  bool srcRepeated = false;
  bool continueOnError = false;
  Attribute attribute;
  AttributeScan scan;
  while ((scan = nextAttribute(attributes, attribute)) ==
         AttributeScan::FOUND) {
    if (attribute.name == "src") {
      srcRepeated |= srcSeen;
      srcSeen = true;
      src = decodeEntities(attribute.value);
    } else if (attribute.name == "alt") {
      alt = decodeEntities(attribute.value);
    } else if (attribute.name == "onerror") {
      continueOnError = decodeEntities(attribute.value) == "continue";
      if (!continueOnError) {
        warn(holdStart,
             "<esi:include> onerror other than \"continue\" ignored");
      }
    }
  }
  includeOpen = !selfClosing;

  if (scan == AttributeScan::MALFORMED) {
    warn(holdStart, "<esi:include> with malformed attributes dropped");
  } else if (srcRepeated) {
    // Which one was meant is anyone's guess; fetching neither is safe.
    warn(holdStart, "<esi:include> with more than one src dropped");
  } else if (src.empty()) {
    warn(holdStart, "<esi:include> without src dropped");
  } else {
    cutRun(holdStart);
    sink.include(src, alt, continueOnError);
  }
}

void Parser::State::openBlock(Block block, std::string_view attributes,
                              bool selfClosing) {
  OpenBlock* parent = blocks.empty() ? nullptr : &blocks.back();
  const Block parentBlock = parent ? parent->block : Block::WHEN;
  bool placed = true;
  switch (block) {
    case Block::CHOOSE:
    case Block::TRY:
      break;
    case Block::WHEN:
    case Block::OTHERWISE:
      placed = parentBlock == Block::CHOOSE;
      break;
    case Block::ATTEMPT:
      placed = parentBlock == Block::TRY && !parent->attempted &&
               !parent->excepted;
      break;
    case Block::EXCEPT:
      placed = parentBlock == Block::TRY && !parent->excepted;
      break;
  }
  if (blocksDropped > 0 || blocks.size() == kMaxBlockDepth) {
    warn(holdStart, "ESI constructs nested too deep, this one dropped");
    if (!selfClosing) ++blocksDropped;
    return;
  }
  if (!placed) {
    const std::string what = "<esi:" + std::string(nameOf(block)) +
                             "> out of place, dropped (its content stays)";
    warn(holdStart, what);
    return;
  }
  if (block == Block::ATTEMPT) parent->attempted = true;
  if (block == Block::EXCEPT) parent->excepted = true;

  std::string test;
  if (block == Block::WHEN) {
    Attribute attribute;
    AttributeScan scan;
    while ((scan = nextAttribute(attributes, attribute)) ==
           AttributeScan::FOUND) {
      if (attribute.name == "test") test = decodeEntities(attribute.value);
    }
    if (scan == AttributeScan::MALFORMED) {
      warn(holdStart, "<esi:when> with malformed attributes, test taken as empty");
      test.clear();
    }
  }
  cutRun(holdStart);
  sink.open(block, test);
  if (selfClosing) {
    sink.close(block);
  } else {
    blocks.push_back({block});
  }
}

void Parser::State::closeBlock(Block block) {
  if (blocksDropped > 0) {
    --blocksDropped;
    return;
  }
  const auto open = std::find_if(blocks.rbegin(), blocks.rend(),
                                 [&](const OpenBlock& b) { return b.block == block; });
  if (open == blocks.rend()) {
    warn(holdStart, "</esi:" + std::string(nameOf(block)) + "> without <esi:" +
                        std::string(nameOf(block)) + ">, dropped");
    return;
  }
  cutRun(holdStart);
  while (blocks.back().block != block) {
    warn(holdStart, "<esi:" + std::string(nameOf(blocks.back().block)) +
                        "> not closed before </esi:" + std::string(nameOf(block)) +
                        ">, closed there");
    sink.close(blocks.back().block);
    blocks.pop_back();
  }
  sink.close(block);
  blocks.pop_back();
}

// --------------------------------------------------------------------------

void Parser::State::finish() {
  switch (mode) {
    case Mode::TEXT:
      break;  // a held "--" is text
    case Mode::OPENER:
      // Only "<!--" can be complete yet held, waiting for a possible "esi".
      if (tag.starts_with("<!--")) {
        warn(holdStart, "HTML comment not closed at end of stream");
      }
      break;
    case Mode::ESI_TAG:
      warn(holdStart, "ESI tag not closed at end of stream");
      break;
    case Mode::COMMENT:
      warn(commentStart, "HTML comment not closed at end of stream");
      break;
    case Mode::CDATA:
      warn(commentStart, "CDATA section not closed at end of stream");
      break;
    case Mode::REFERENCE:
      break;  // "$(" without its ')' is text
  }
  keepHeld();
  if (inEsiComment) {
    warn(esiCommentStart, "<!--esi not closed at end of stream");
  }
  if (removeDepth > 0) {
    warn(removeStart, "<esi:remove> not closed at end of stream, rest dropped");
  }
  cutRun(pos);
  while (!blocks.empty()) {
    warn(pos, "<esi:" + std::string(nameOf(blocks.back().block)) +
                  "> not closed at end of stream, closed there");
    sink.close(blocks.back().block);
    blocks.pop_back();
  }
}

// --------------------------------------------------------------------------

Parser::Parser(ParserSink& sink, ParserLimits limits)
    : state_(std::make_unique<State>(sink, limits)) {}

Parser::~Parser() = default;

void Parser::feed(std::string_view chunk) { state_->feed(chunk); }

void Parser::replay(Block block, bool opens) {
  std::vector<State::OpenBlock>& blocks = state_->blocks;
  if (!opens) {
    if (!blocks.empty()) blocks.pop_back();
    return;
  }
  if (!blocks.empty()) {
    blocks.back().attempted |= block == Block::ATTEMPT;
    blocks.back().excepted |= block == Block::EXCEPT;
  }
  if (blocks.size() < kMaxBlockDepth) blocks.push_back({block});
}

void Parser::resume(TextContext context) {
  state_->varsDepth = context.varsDepth;
  state_->inEsiComment = context.esiComment;
  state_->esiCommentStart = state_->pos;
  state_->runContext = context;
}

TextContext Parser::runContext() const { return state_->runContext; }

void Parser::finish() { state_->finish(); }

uint64_t Parser::released() const { return state_->released(); }

}  // namespace esi
