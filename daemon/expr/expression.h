// ESI 1.0 expressions (section 5), the test attribute of <esi:when>:
// compiled once when the page's structure is parsed, evaluated for each
// request against its RequestVariables.
//
// Operands are single-quoted strings ('Basic User', with \' and \\),
// numbers (-1, 01, 2.50), and references ($(HTTP_COOKIE{group}), with a
// default as in templates).  Operators, tightest first, as the spec lists
// them:
//   == != < > <= >=   comparison (and the extensions below)
//   !                 negation: !$(A)==1 is !($(A)==1)
//   &                 and
//   |                 or
// with parentheses to group.  Comparisons do not chain (1<2<3 is malformed),
// and compare values, not conditions: (1==1)==(2==2) is malformed.
//
// Values are strings; how they compare depends only on what they hold, not
// on quotes.  If both are numbers (expr/syntax.h: optional sign, digits,
// optionally '.' and digits), they compare as numbers, exactly: '1.0'==1,
// '01'==1, -2<-1.5.  Otherwise both compare as strings, byte by byte: 'a'<'b',
// 'B'<'a', '10'<'9a'.  The spec says that an expression with an empty or
// undefined operand is false; we keep that for < > <= >= and has, but
// == and != compare the empty string like any other, so that != is always
// the negation of == ($(HTTP_COOKIE{x})=='' tests that the cookie is absent
// or empty, and $(HTTP_COOKIE{x})!='a' is true when it is absent), as
// Traffic Server's ESI does.
//
// A bare operand is a condition: true unless it is empty, a number equal to
// zero, or "false" (what $(HTTP_ACCEPT_LANGUAGE{da}) is when da is not
// accepted, so that test="$(HTTP_ACCEPT_LANGUAGE{da})" works).  The spec's
// own text says (1 & 4) "will not evaluate"; we evaluate it, as Traffic
// Server and Akamai do, because its list variables need it.
//
// Extensions (not in ESI 1.0; from Akamai's and Traffic Server's ESI),
// comparison operators written as words with whitespace around them, as the
// spec already requires for "has":
//   a has 'x'         a contains x (bytes; x empty: false)
//   a has_i 'x'       the same, ASCII letters compared without case
//   a matches 'x'     regular expression x (RE2 syntax, unanchored: use ^ and
//   a matches_i 'x'   $) matches a; _i: without case.  x must be a literal,
//                     at most ExpressionLimits::maxPatternBytes, compiled
//                     once; RE2 runs in time linear in a.
// and Akamai's raw literal '''...''' (no escapes), for patterns full of
// backslashes and quotes.
//
// Anything else is malformed: a bare word (example.com must be quoted),
// double quotes ("abc" is no literal, as the spec says), "=", "&&",
// unbalanced parentheses, more than maxNesting levels of parentheses and
// '!'.  A malformed expression evaluates to false; compile() says why, so
// the caller can log it once per page.  Nothing throws, whatever the text or
// the values; evaluation recurses at most maxNesting deep.

#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "expr/syntax.h"
#include "expr/variables.h"

namespace esi {

struct ExpressionLimits {
  size_t maxNesting = 64;
  size_t maxPatternBytes = 1024;
};

class Expression {
 public:
  // A malformed one ("empty expression"): false for every request.
  Expression();

  static Expression compile(std::string_view text,
                            ExpressionLimits limits = {});

  bool ok() const { return error_.empty(); }
  // Why it is malformed, with the byte offset; empty when ok().
  const std::string& error() const { return error_; }

  // False when malformed.
  bool evaluate(const RequestVariables& variables) const;

  // Heap memory it holds, roughly (a compiled pattern counts as
  // kPatternBytes): for the budget of whoever keeps it.
  static constexpr size_t kPatternBytes = 8192;
  size_t bytes() const;

  // The variables it reads, each once, in order of first use; unknown
  // variables (always empty) are left out.
  std::vector<VariableRef> uses() const;

 private:
  class Compiler;
  struct Pattern;

  enum class Kind : uint8_t { TRUTH, COMPARE, NOT, ALL, ANY };
  enum class Comparison : uint8_t {
    EQ, NE, LT, GT, LE, GE, HAS, HAS_I, MATCHES, MATCHES_I
  };
  struct Node {
    Kind kind;
    Comparison comparison;
    // TRUTH: operand a.  COMPARE: operands a and b, pattern c (MATCHES*).
    // NOT: node a.  ALL, ANY: nodes children_[a, a + b).
    uint32_t a, b, c;
  };
  struct Operand {
    std::optional<expr::Reference> reference;  // or else the literal
    std::string literal;
  };

  bool evaluate(uint32_t node, const RequestVariables& variables) const;
  bool compare(const Node& node, std::string_view left,
               std::string_view right) const;
  std::string_view valueOf(uint32_t operand,
                           const RequestVariables& variables) const;

  std::vector<Node> nodes_;
  std::vector<uint32_t> children_;
  std::vector<Operand> operands_;
  std::vector<std::shared_ptr<const Pattern>> patterns_;  // shared by copies
  uint32_t root_ = 0;
  std::string error_;
};

}  // namespace esi
