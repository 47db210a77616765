// A page's structure, as the parse found it, and its evaluation for one
// request.  The structure is the same for every request; what goes out is
// not: a $(...) value, a `when` test, an include src with a variable.  So a
// stream compiles what it parses into program steps (templates and
// expressions compiled once) and an Evaluator turns them into the flat
// instructions the connector runs: at once for a page being parsed, and on
// every hit for a parse plan (plans/plan_store.h), with each request's own
// variables.
//
// What the evaluator emits, per step:
//   - verbatim runs, literal values ($(...) in <esi:vars>, HTML-escaped) and
//     includes (src and alt rendered and resolved, see renderInclude) only
//     where they are chosen: outside any construct, in the first <esi:when>
//     whose test is true or else the first <esi:otherwise>, in <esi:attempt>
//     and <esi:except>.  Content of a choose outside its branches and of a
//     try outside attempt and except is dropped, as ESI 1.0 says; a branch
//     not chosen emits nothing, so its includes are never fetched.
//   - for each try that is itself chosen: tryStart at <esi:try>, tryExcept
//     at <esi:except> (or at </esi:try> when there is none), tryEnd at
//     </esi:try>: the connector holds the attempt's output and decides.
// A test is evaluated only when its choose is chosen and no branch before it
// was; request variables are built only when a value, an include or a test
// that names a variable is evaluated.

#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "expr/expression.h"
#include "expr/template.h"
#include "expr/variables.h"
#include "parser/include_uri.h"
#include "parser/parser.h"

namespace esi {

// --------------------------------------------------------------------------
// Instructions: what the connector runs (proto/esi.capnp Instruction).

struct VerbatimRun {
  uint64_t offset;
  uint32_t length;
  TextContext context{};  // recorded in plans: where a dropped one resumes
};

struct IncludeCall {
  std::string path;  // empty: src was refused
  std::string args;
  std::string altPath;
  std::string altArgs;
  bool continueOnError = false;
};

struct LiteralText {
  std::string bytes;
};

enum class TryMark : uint8_t { START, EXCEPT, END };

using Instruction = std::variant<VerbatimRun, IncludeCall, LiteralText, TryMark>;

// Appends a run to instructions or program steps, merged with the last one
// where that is the run just before it, in the same context; runs longer
// than a wire length go out as several.
template <typename Step>
void appendVerbatim(std::vector<Step>& out, uint64_t offset, uint64_t length,
                    TextContext context = {}) {
  constexpr uint64_t kMaxRun = std::numeric_limits<uint32_t>::max();
  while (length > 0) {
    const uint64_t run = std::min(length, kMaxRun);
    auto* last = out.empty() ? nullptr : std::get_if<VerbatimRun>(&out.back());
    if (last != nullptr && last->offset + last->length == offset &&
        last->length + run <= kMaxRun && last->context == context) {
      last->length += static_cast<uint32_t>(run);
    } else {
      out.emplace_back(VerbatimRun{offset, static_cast<uint32_t>(run), context});
    }
    offset += run;
    length -= run;
  }
}

// --------------------------------------------------------------------------
// Program steps: what the parse found.

// A $(...) in <esi:vars>.
struct LiteralStep {
  Template value;
};

struct IncludeStep {
  Template src;
  std::optional<Template> alt;
  bool continueOnError = false;
  // Resolved once when neither src nor alt holds a reference.
  std::optional<IncludeCall> resolved;
};

struct BlockOpen {
  Block block;
  Expression test;            // WHEN only
  bool testReadsRequest = false;  // it names a variable
};

struct BlockClose {
  Block block;
};

using ProgramStep =
    std::variant<VerbatimRun, LiteralStep, IncludeStep, BlockOpen, BlockClose>;

// The page an include is resolved against.
struct PageAddress {
  std::string uri;        // decoded path
  std::string authority;  // Host
};

// The request values variables read (proto/esi.capnp RequestVars), owned.
struct RequestValues {
  std::string host;
  std::string userAgent;
  std::string referer;
  std::string acceptLanguage;
  std::string queryString;
  std::string cookies;  // only those the connector's esi_cookies allows
};

// src rendered for one request and resolved against the page.  A value in
// the path is percent-encoded whole, so that it decodes to exactly itself
// and never joins the text around it into an escape; and it must be
// non-empty, hold no '/' or '\', and not be only dots.  So every path
// segment that holds a value holds a byte of it that is no dot: no value
// adds or removes a segment or climbs out of the template's own directory,
// whatever it holds.  Anything else is refused (IncludeUri::reason).  In the
// query (after the template's own '?') values are percent-encoded
// (Escaping::URL): they cannot add a parameter.
IncludeUri renderInclude(const Template& src, const RequestVariables& variables,
                         const PageAddress& page);

class Evaluator {
 public:
  // page and values must outlive the evaluator.
  Evaluator(const PageAddress& page, const RequestValues& values);
  Evaluator(PageAddress&&, const RequestValues&) = delete;
  Evaluator(const PageAddress&, RequestValues&&) = delete;
  Evaluator(PageAddress&&, RequestValues&&) = delete;
  Evaluator(const Evaluator&) = delete;
  Evaluator& operator=(const Evaluator&) = delete;

  // Appends what step emits for this request.  Steps come in stream order
  // and well nested, as the parser reports them.
  void step(const ProgramStep& step, std::vector<Instruction>& out);
  // The same for a step of a span of a plan (values, runs and choose
  // blocks, no include or try), whose output is one text: appends what it
  // yields to text, a run's bytes taken from `bytes`, the body's from
  // offset `base` on.  Saves a span the instructions it would be joined
  // from.
  void stepInto(const ProgramStep& step, std::string& text,
                std::string_view bytes, uint64_t base);
  // Appends what a span's runs and values, joined into one HTML-escaped
  // template, yield here.
  void renderInto(const Template& values, std::string& text);

 private:
  struct Frame {
    Block block;
    bool emitting;      // content directly inside goes out
    bool context;       // the construct itself is chosen
    bool decided = false;  // choose: a branch was chosen; try: except came
  };

  bool emitting() const { return frames_.empty() || frames_.back().emitting; }
  // Applies a block step (a try's markers go to out); true when step is
  // content that goes out here.
  bool emits(const ProgramStep& step, std::vector<Instruction>& out);
  const RequestVariables& variables();
  void include(const IncludeStep& step, std::vector<Instruction>& out);
  void open(const BlockOpen& step, std::vector<Instruction>& out);
  void close(std::vector<Instruction>& out);

  const PageAddress& page_;
  const RequestValues& values_;
  std::optional<RequestVariables> variables_;
  std::vector<Frame> frames_;
};

}  // namespace esi
