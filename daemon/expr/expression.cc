// Compiling is recursive descent over the text, one token ahead, into a
// flat tree: nodes refer to operands and to other nodes by index, and the
// operands of & and | sit side by side (1|1|1... is one node, not a
// thousand nested ones), so the only depth is that of parentheses and '!'.

#include "expr/expression.h"

#include <algorithm>
#include <span>
#include <utility>

#include <re2/re2.h>

namespace esi {
namespace {

using expr::lower;

bool isLetter(char c) { return lower(c) >= 'a' && lower(c) <= 'z'; }

bool isWordChar(char c) {
  return isLetter(c) || expr::isDigit(c) || c == '_' || c == '.';
}

bool isTrue(std::string_view value) {
  if (value.empty() || value == "false") return false;
  return !expr::isNumber(value) || expr::compareNumbers(value, "0") != 0;
}

bool equal(std::string_view a, std::string_view b) {
  if (expr::isNumber(a) && expr::isNumber(b)) {
    return expr::compareNumbers(a, b) == 0;
  }
  return a == b;
}

int order(std::string_view a, std::string_view b) {
  if (expr::isNumber(a) && expr::isNumber(b)) {
    return expr::compareNumbers(a, b);
  }
  return a.compare(b);  // as unsigned bytes, like memcmp
}

// Knuth-Morris-Pratt, so a hostile value costs linear time whatever it holds.
bool containsText(std::string_view text, std::string_view part,
                  bool ignoreCase) {
  if (part.empty() || part.size() > text.size()) return false;
  auto same = [ignoreCase](char a, char b) {
    return ignoreCase ? lower(a) == lower(b) : a == b;
  };
  std::vector<size_t> border(part.size());  // of part[0, i]
  for (size_t i = 1, k = 0; i < part.size(); ++i) {
    while (k > 0 && !same(part[i], part[k])) k = border[k - 1];
    if (same(part[i], part[k])) ++k;
    border[i] = k;
  }
  for (size_t i = 0, k = 0; i < text.size(); ++i) {
    while (k > 0 && !same(text[i], part[k])) k = border[k - 1];
    if (same(text[i], part[k])) ++k;
    if (k == part.size()) return true;
  }
  return false;
}

}  // namespace

struct Expression::Pattern {
  explicit Pattern(std::string_view text, const RE2::Options& options)
      : regex(re2::StringPiece(text.data(), text.size()), options) {}
  RE2 regex;
};

// --------------------------------------------------------------------------
// Compiling

class Expression::Compiler {
 public:
  Compiler(std::string_view text, ExpressionLimits limits, Expression& out)
      : text_(text), limits_(limits), out_(out) {}

  void compile() {
    next();
    const Term term = parseOr(0);
    if (!failed() && token_.kind != Token::END) {
      fail(token_.at,
           "unexpected " + describe(token_) + " after the expression");
    }
    if (failed()) return;
    out_.root_ = condition(term);
  }

 private:
  struct Token {
    enum Kind {
      END,
      OPEN,
      CLOSE,
      NOT,
      AND,
      OR,
      COMPARISON,
      LITERAL,
      REFERENCE
    };
    Kind kind = END;
    size_t at = 0;
    size_t length = 0;
    Comparison comparison = Comparison::EQ;
    std::string literal;
    std::optional<expr::Reference> reference;
  };

  // An operand's index, or a condition's node index.
  struct Term {
    bool isOperand;
    uint32_t index;
  };

  bool failed() const { return !out_.error_.empty(); }

  void fail(size_t at, const std::string& why) {
    if (!failed()) out_.error_ = "at byte " + std::to_string(at) + ": " + why;
  }

  std::string describe(const Token& token) const {
    if (token.kind == Token::END) return "end";
    return "'" +
           std::string(
               text_.substr(token.at, std::min<size_t>(token.length, 32))) +
           "'";
  }

  // --- tokens

  void next() {
    while (at_ < text_.size() && expr::isSpace(text_[at_])) ++at_;
    token_ = Token();
    token_.at = at_;
    if (at_ < text_.size()) lex();
    at_ = token_.at + token_.length;
  }

  void symbol(Token::Kind kind, size_t length,
              Comparison comparison = Comparison::EQ) {
    token_.kind = kind;
    token_.length = length;
    token_.comparison = comparison;
  }

  void lex() {
    const std::string_view rest = text_.substr(at_);
    const char second = rest.size() > 1 ? rest[1] : '\0';
    switch (rest[0]) {
      case '(': return symbol(Token::OPEN, 1);
      case ')': return symbol(Token::CLOSE, 1);
      case '&': return symbol(Token::AND, 1);
      case '|': return symbol(Token::OR, 1);
      case '!':
        return second == '=' ? symbol(Token::COMPARISON, 2, Comparison::NE)
                             : symbol(Token::NOT, 1);
      case '<':
        return second == '=' ? symbol(Token::COMPARISON, 2, Comparison::LE)
                             : symbol(Token::COMPARISON, 1, Comparison::LT);
      case '>':
        return second == '=' ? symbol(Token::COMPARISON, 2, Comparison::GE)
                             : symbol(Token::COMPARISON, 1, Comparison::GT);
      case '=':
        if (second == '=') return symbol(Token::COMPARISON, 2, Comparison::EQ);
        return fail(at_, "'=' is no operator: write '=='");
      case '\'': return lexQuoted(rest);
      case '"':
        return fail(at_, "double quotes delimit no literal: use single quotes");
      case '$': return lexReference(rest);
      default: return lexWord(rest);
    }
  }

  void lexQuoted(std::string_view rest) {
    if (rest.starts_with("'''")) {  // Akamai's raw literal
      const size_t close = rest.find("'''", 3);
      if (close == std::string_view::npos) {
        return fail(at_, "unclosed '''literal");
      }
      token_.literal = rest.substr(3, close - 3);
      return symbol(Token::LITERAL, close + 3);
    }
    size_t length;
    auto literal = expr::parseQuoted(rest, length);
    if (!literal) return fail(at_, "unclosed quote");
    token_.literal = std::move(*literal);
    symbol(Token::LITERAL, length);
  }

  void lexReference(std::string_view rest) {
    size_t length;
    if (rest.starts_with("$(")) {
      if (auto reference = expr::parseReference(rest, length)) {
        token_.reference = std::move(reference);
        return symbol(Token::REFERENCE, length);
      }
    }
    fail(at_, "malformed variable reference");
  }

  // A number, or one of the word operators.
  void lexWord(std::string_view rest) {
    size_t length = 0;
    if (rest[0] == '-' || rest[0] == '+') ++length;
    while (length < rest.size() && isWordChar(rest[length])) ++length;
    const std::string_view word = rest.substr(0, length);
    if (expr::isNumber(word)) {
      token_.literal = word;
      return symbol(Token::LITERAL, length);
    }
    static constexpr std::pair<std::string_view, Comparison> WORDS[] = {
        {"has", Comparison::HAS},
        {"has_i", Comparison::HAS_I},
        {"matches", Comparison::MATCHES},
        {"matches_i", Comparison::MATCHES_I},
    };
    for (const auto& [name, comparison] : WORDS) {
      if (word != name) continue;
      const bool spaced = at_ > 0 && expr::isSpace(text_[at_ - 1]) &&
                          length < rest.size() && expr::isSpace(rest[length]);
      if (!spaced) {
        return fail(at_, "'" + std::string(name) +
                             "' needs whitespace on both sides");
      }
      return symbol(Token::COMPARISON, length, comparison);
    }
    if (length == 0 || (length == 1 && !isWordChar(rest[0]))) {
      return fail(at_, "unexpected '" + std::string(rest.substr(0, 1)) + "'");
    }
    fail(at_, "'" + std::string(word.substr(0, 32)) +
                  "' is no operand: quote literals, as in 'text'");
  }

  // --- grammar

  Term parseOr(size_t depth) { return parseList(depth, Token::OR, Kind::ANY); }

  Term parseAnd(size_t depth) {
    return parseList(depth, Token::AND, Kind::ALL);
  }

  // or := and ('|' and)*; and := unary ('&' unary)*
  Term parseList(size_t depth, Token::Kind separator, Kind kind) {
    std::vector<Term> terms;
    do {
      if (!terms.empty()) next();
      terms.push_back(separator == Token::OR ? parseAnd(depth)
                                             : parseUnary(depth));
      if (failed()) return {};
    } while (token_.kind == separator);
    if (terms.size() == 1) return terms[0];

    std::vector<uint32_t> conditions;
    conditions.reserve(terms.size());
    for (const Term& term : terms) conditions.push_back(condition(term));
    const auto first = static_cast<uint32_t>(out_.children_.size());
    out_.children_.insert(out_.children_.end(), conditions.begin(),
                          conditions.end());
    return {false, addNode({kind, Comparison::EQ, first,
                            static_cast<uint32_t>(conditions.size()), 0})};
  }

  // unary := '!' unary | relation
  Term parseUnary(size_t depth) {
    if (token_.kind != Token::NOT) return parseRelation(depth);
    if (!deeper(depth)) return {};
    next();
    const Term term = parseUnary(depth + 1);
    if (failed()) return {};
    return {false, addNode({Kind::NOT, Comparison::EQ, condition(term), 0, 0})};
  }

  // relation := primary (comparison primary)?
  Term parseRelation(size_t depth) {
    const Term left = parsePrimary(depth);
    if (failed() || token_.kind != Token::COMPARISON) return left;
    const Token op = std::move(token_);
    next();
    const Term right = parsePrimary(depth);
    if (failed()) return {};
    if (!left.isOperand || !right.isOperand) {
      fail(op.at, "a comparison compares values, not conditions");
      return {};
    }
    if (token_.kind == Token::COMPARISON) {
      fail(token_.at, "comparisons do not chain: group them with & or |");
      return {};
    }
    Node node{Kind::COMPARE, op.comparison, left.index, right.index, 0};
    if (op.comparison == Comparison::MATCHES ||
        op.comparison == Comparison::MATCHES_I) {
      node.c = addPattern(op, right.index);
      if (failed()) return {};
    }
    return {false, addNode(node)};
  }

  // primary := operand | '(' or ')'
  Term parsePrimary(size_t depth) {
    if (token_.kind == Token::LITERAL || token_.kind == Token::REFERENCE) {
      Operand operand{std::move(token_.reference), std::move(token_.literal)};
      out_.operands_.push_back(std::move(operand));
      next();
      return {true, static_cast<uint32_t>(out_.operands_.size() - 1)};
    }
    if (token_.kind != Token::OPEN) {
      fail(token_.at, "expected an operand, found " + describe(token_));
      return {};
    }
    if (!deeper(depth)) return {};
    const size_t open = token_.at;
    next();
    const Term term = parseOr(depth + 1);
    if (failed()) return {};
    if (token_.kind != Token::CLOSE) {
      fail(open, "unclosed parenthesis");
      return {};
    }
    next();
    return term;
  }

  bool deeper(size_t depth) {
    if (depth < limits_.maxNesting) return true;
    fail(token_.at, "nested more than " + std::to_string(limits_.maxNesting) +
                        " deep");
    return false;
  }

  uint32_t addNode(const Node& node) {
    out_.nodes_.push_back(node);
    return static_cast<uint32_t>(out_.nodes_.size() - 1);
  }

  uint32_t condition(const Term& term) {
    return term.isOperand
               ? addNode({Kind::TRUTH, Comparison::EQ, term.index, 0, 0})
               : term.index;
  }

  uint32_t addPattern(const Token& op, uint32_t operand) {
    const Operand& right = out_.operands_[operand];
    if (right.reference) {
      fail(op.at, "the pattern of matches must be a literal");
      return 0;
    }
    if (right.literal.size() > limits_.maxPatternBytes) {
      fail(op.at, "pattern longer than " +
                      std::to_string(limits_.maxPatternBytes) + " bytes");
      return 0;
    }
    RE2::Options options;
    options.set_log_errors(false);
    options.set_never_capture(true);
    options.set_max_mem(1 << 20);
    options.set_case_sensitive(op.comparison == Comparison::MATCHES);
    auto pattern = std::make_shared<const Pattern>(right.literal, options);
    if (!pattern->regex.ok()) {
      fail(op.at, "bad pattern: " + pattern->regex.error());
      return 0;
    }
    out_.patterns_.push_back(std::move(pattern));
    return static_cast<uint32_t>(out_.patterns_.size() - 1);
  }

  const std::string_view text_;
  const ExpressionLimits limits_;
  Expression& out_;
  size_t at_ = 0;  // where the token after token_ starts
  Token token_;
};

// --------------------------------------------------------------------------
// Evaluating

Expression::Expression() : error_("empty expression") {}

Expression Expression::compile(std::string_view text,
                               ExpressionLimits limits) {
  Expression expression;
  expression.error_.clear();  // well-formed until the compiler says otherwise
  Compiler(text, limits, expression).compile();
  if (!expression.ok()) {
    // Keep only the reason: a malformed expression is never evaluated.
    Expression malformed;
    malformed.error_ = std::move(expression.error_);
    return malformed;
  }
  return expression;
}

bool Expression::evaluate(const RequestVariables& variables) const {
  return ok() && evaluate(root_, variables);
}

std::string_view Expression::valueOf(uint32_t operand,
                                     const RequestVariables& variables) const {
  const Operand& o = operands_[operand];
  return o.reference ? o.reference->valueIn(variables)
                     : std::string_view(o.literal);
}

bool Expression::evaluate(uint32_t index,
                          const RequestVariables& variables) const {
  const Node& node = nodes_[index];
  const auto children = [&] {
    return std::span(children_).subspan(node.a, node.b);
  };
  switch (node.kind) {
    case Kind::TRUTH:
      return isTrue(valueOf(node.a, variables));
    case Kind::COMPARE:
      return compare(node, valueOf(node.a, variables),
                     valueOf(node.b, variables));
    case Kind::NOT:
      return !evaluate(node.a, variables);
    case Kind::ALL:
      for (const uint32_t child : children()) {
        if (!evaluate(child, variables)) return false;
      }
      return true;
    case Kind::ANY:
      for (const uint32_t child : children()) {
        if (evaluate(child, variables)) return true;
      }
      return false;
  }
  return false;
}

bool Expression::compare(const Node& node, std::string_view left,
                         std::string_view right) const {
  const bool ordered = !left.empty() && !right.empty();
  switch (node.comparison) {
    case Comparison::EQ: return equal(left, right);
    case Comparison::NE: return !equal(left, right);
    case Comparison::LT: return ordered && order(left, right) < 0;
    case Comparison::GT: return ordered && order(left, right) > 0;
    case Comparison::LE: return ordered && order(left, right) <= 0;
    case Comparison::GE: return ordered && order(left, right) >= 0;
    case Comparison::HAS: return containsText(left, right, false);
    case Comparison::HAS_I: return containsText(left, right, true);
    case Comparison::MATCHES:
    case Comparison::MATCHES_I:
      return RE2::PartialMatch(re2::StringPiece(left.data(), left.size()),
                               patterns_[node.c]->regex);
  }
  return false;
}

size_t Expression::bytes() const {
  size_t total = nodes_.capacity() * sizeof(Node) +
                 children_.capacity() * sizeof(uint32_t) +
                 operands_.capacity() * sizeof(Operand) + error_.capacity() +
                 patterns_.size() * kPatternBytes;
  for (const Operand& operand : operands_) {
    total += operand.literal.capacity();
    if (operand.reference) {
      total += operand.reference->variable.key.capacity() +
               operand.reference->fallback.capacity();
    }
  }
  return total;
}

std::vector<VariableRef> Expression::uses() const {
  std::vector<VariableRef> refs;
  for (const Operand& operand : operands_) {
    if (operand.reference) refs.push_back(operand.reference->variable);
  }
  return expr::distinctUses(std::move(refs));
}

}  // namespace esi
