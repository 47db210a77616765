#include "engine/program.h"

#include <spdlog/spdlog.h>

namespace esi {
namespace {

// The connector sends only the cookies esi_cookies names: esid reads them all.
const CookieAllowList& everyCookie() {
  static const CookieAllowList all({"*"});
  return all;
}

// For what reads no variable: built without a request.
const RequestVariables& noRequest() {
  static const RequestVariables none;
  return none;
}

void appendEncodedWhole(std::string& out, std::string_view value) {
  static constexpr char HEX[] = "0123456789ABCDEF";
  for (const char c : value) {
    const auto byte = static_cast<unsigned char>(c);
    out += '%';
    out += HEX[byte >> 4];
    out += HEX[byte & 0xf];
  }
}

// Why a value may not stand in a path, or null.
const char* pathValueProblem(std::string_view value) {
  if (value.empty()) return "a variable in the path is empty";
  if (value.find_first_of("/\\") != std::string_view::npos) {
    return "a variable in the path holds a '/' or '\\'";
  }
  if (value.find_first_not_of('.') == std::string_view::npos) {
    return "a variable in the path is a dot segment";
  }
  return nullptr;
}

}  // namespace

IncludeUri renderInclude(const Template& src, const RequestVariables& variables,
                         const PageAddress& page) {
  std::string rendered;
  bool inPath = true;
  const char* problem = nullptr;
  src.pieces(
      variables,
      [&](std::string_view text) {
        rendered += text;
        inPath = inPath && text.find_first_of("?#") == std::string_view::npos;
      },
      [&](std::string_view value) {
        if (!inPath) {
          appendEscaped(rendered, value, Escaping::URL);
          return;
        }
        if (problem == nullptr) problem = pathValueProblem(value);
        appendEncodedWhole(rendered, value);
      });
  if (problem != nullptr) {
    IncludeUri refused;
    refused.reason = problem;
    return refused;
  }
  return resolveInclude(rendered, page.uri, page.authority);
}

Evaluator::Evaluator(const PageAddress& page, const RequestValues& values)
    : page_(page), values_(values) {}

const RequestVariables& Evaluator::variables() {
  if (!variables_) {
    RequestInputs inputs;
    inputs.host = values_.host;
    inputs.cookie = values_.cookies;
    inputs.referer = values_.referer;
    inputs.userAgent = values_.userAgent;
    inputs.acceptLanguage = values_.acceptLanguage;
    inputs.queryString = values_.queryString;
    variables_.emplace(inputs, everyCookie());
  }
  return *variables_;
}

bool Evaluator::emits(const ProgramStep& step, std::vector<Instruction>& out) {
  if (const auto* open = std::get_if<BlockOpen>(&step)) {
    this->open(*open, out);
    return false;
  }
  if (std::holds_alternative<BlockClose>(step)) {
    close(out);
    return false;
  }
  return emitting();
}

void Evaluator::step(const ProgramStep& step, std::vector<Instruction>& out) {
  if (!emits(step, out)) return;
  if (const auto* run = std::get_if<VerbatimRun>(&step)) {
    appendVerbatim(out, run->offset, run->length);
  } else if (const auto* literal = std::get_if<LiteralStep>(&step)) {
    std::string text = literal->value.render(variables(), Escaping::HTML);
    if (!text.empty()) out.emplace_back(LiteralText{std::move(text)});
  } else {
    include(std::get<IncludeStep>(step), out);
  }
}

void Evaluator::stepInto(const ProgramStep& step, std::string& text,
                         std::string_view bytes, uint64_t base) {
  std::vector<Instruction> none;  // choose, when and otherwise emit nothing
  if (!emits(step, none)) return;
  if (const auto* run = std::get_if<VerbatimRun>(&step)) {
    text.append(bytes.substr(run->offset - base, run->length));
  } else if (const auto* literal = std::get_if<LiteralStep>(&step)) {
    literal->value.renderTo(text, variables(), Escaping::HTML);
  }
}

void Evaluator::renderInto(const Template& values, std::string& text) {
  if (!emitting()) return;
  values.renderTo(text, values.hasReferences() ? variables() : noRequest(), Escaping::HTML);
}

void Evaluator::include(const IncludeStep& step, std::vector<Instruction>& out) {
  if (step.resolved) {
    out.emplace_back(*step.resolved);
    return;
  }
  IncludeCall call;
  call.continueOnError = step.continueOnError;
  IncludeUri src = renderInclude(step.src, variables(), page_);
  if (src.ok) {
    call.path = std::move(src.path);
    call.args = std::move(src.args);
  } else {
    // The request decides, so the request may fill the log: debug only.
    spdlog::debug("{:?}: include refused for this request: {}", page_.uri, src.reason);
  }
  if (step.alt) {
    IncludeUri alt = renderInclude(*step.alt, variables(), page_);
    if (alt.ok) {
      call.altPath = std::move(alt.path);
      call.altArgs = std::move(alt.args);
    } else {
      spdlog::debug("{:?}: include alt refused for this request: {}", page_.uri,
                    alt.reason);
    }
  }
  out.emplace_back(std::move(call));
}

void Evaluator::open(const BlockOpen& step, std::vector<Instruction>& out) {
  const bool here = emitting();
  Frame* parent = frames_.empty() ? nullptr : &frames_.back();
  switch (step.block) {
    case Block::CHOOSE:
      frames_.push_back({step.block, false, here});
      return;
    case Block::TRY:
      if (here) out.emplace_back(TryMark::START);
      frames_.push_back({step.block, false, here});
      return;
    case Block::WHEN:
    case Block::OTHERWISE: {
      // The parser puts branches directly inside their choose.
      const bool chosen =
          parent != nullptr && parent->context && !parent->decided &&
          (step.block == Block::OTHERWISE ||
           step.test.evaluate(step.testReadsRequest ? variables() : noRequest()));
      if (chosen) parent->decided = true;
      frames_.push_back({step.block, chosen, chosen});
      return;
    }
    case Block::ATTEMPT:
    case Block::EXCEPT: {
      const bool context = parent != nullptr && parent->context;
      if (step.block == Block::EXCEPT && context) {
        out.emplace_back(TryMark::EXCEPT);
        parent->decided = true;
      }
      frames_.push_back({step.block, context, context});
      return;
    }
  }
}

void Evaluator::close(std::vector<Instruction>& out) {
  if (frames_.empty()) return;
  const Frame frame = frames_.back();
  frames_.pop_back();
  if (frame.block == Block::TRY && frame.context) {
    if (!frame.decided) out.emplace_back(TryMark::EXCEPT);
    out.emplace_back(TryMark::END);
  }
}

}  // namespace esi
