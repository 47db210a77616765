#include "expr/syntax.h"

#include <algorithm>
#include <tuple>

namespace esi::expr {
namespace {

bool isUpper(char c) { return c >= 'A' && c <= 'Z'; }

bool isNameChar(char c) { return isUpper(c) || isDigit(c) || c == '_'; }

// A default written without quotes is one word: the spec wants quotes for
// whitespace, and the other bytes would make $(A|$(B)) look nested.
bool isBareFallbackChar(char c) {
  return static_cast<unsigned char>(c) > ' ' && c != 0x7f && c != '(' &&
         c != ')' && c != '$' && c != '\'' && c != '{' && c != '}' &&
         c != '|';
}

struct Decimal {
  bool negative;
  std::string_view integer;   // without leading zeros
  std::string_view fraction;  // without trailing zeros
};

Decimal decimalOf(std::string_view text) {
  Decimal d{false, text, {}};
  if (!d.integer.empty() && (d.integer[0] == '-' || d.integer[0] == '+')) {
    d.negative = d.integer[0] == '-';
    d.integer.remove_prefix(1);
  }
  if (const size_t dot = d.integer.find('.'); dot != std::string_view::npos) {
    d.fraction = d.integer.substr(dot + 1);
    d.integer = d.integer.substr(0, dot);
  }
  while (!d.integer.empty() && d.integer.front() == '0') {
    d.integer.remove_prefix(1);
  }
  while (!d.fraction.empty() && d.fraction.back() == '0') {
    d.fraction.remove_suffix(1);
  }
  if (d.integer.empty() && d.fraction.empty()) d.negative = false;  // -0
  return d;
}

int compareMagnitudes(const Decimal& a, const Decimal& b) {
  if (a.integer.size() != b.integer.size()) {
    return a.integer.size() < b.integer.size() ? -1 : 1;
  }
  if (const int c = a.integer.compare(b.integer); c != 0) return c;
  return a.fraction.compare(b.fraction);
}

}  // namespace

bool equalsIgnoringCase(std::string_view a, std::string_view b) {
  return a.size() == b.size() &&
         std::equal(a.begin(), a.end(), b.begin(),
                    [](char x, char y) { return lower(x) == lower(y); });
}

std::string_view Reference::valueIn(const RequestVariables& variables) const {
  const std::string_view value = variables.value(variable);
  return value.empty() && hasFallback ? std::string_view(fallback) : value;
}

std::optional<Reference> parseReference(std::string_view text,
                                        size_t& length) {
  text = text.substr(0, MAX_REFERENCE_BYTES);
  size_t at = 2;  // past "$("
  size_t nameEnd = at;
  while (nameEnd < text.size() && isNameChar(text[nameEnd])) ++nameEnd;
  if (nameEnd == at || !isUpper(text[at])) return std::nullopt;

  Reference reference;
  reference.variable.variable = variableNamed(text.substr(at, nameEnd - at));
  at = nameEnd;
  if (at < text.size() && text[at] == '{') {
    const size_t close = text.find('}', at + 1);
    if (close == std::string_view::npos) return std::nullopt;
    reference.variable.hasKey = true;
    reference.variable.key = text.substr(at + 1, close - at - 1);
    at = close + 1;
  }
  if (at < text.size() && text[at] == '|') {
    ++at;
    reference.hasFallback = true;
    if (at < text.size() && text[at] == '\'') {
      size_t quoted = 0;
      auto fallback = parseQuoted(text.substr(at), quoted);
      if (!fallback) return std::nullopt;
      reference.fallback = std::move(*fallback);
      at += quoted;
    } else {
      const size_t start = at;
      while (at < text.size() && isBareFallbackChar(text[at])) ++at;
      reference.fallback = text.substr(start, at - start);
    }
  }
  if (at >= text.size() || text[at] != ')') return std::nullopt;
  length = at + 1;
  return reference;
}

std::optional<std::string> parseQuoted(std::string_view text, size_t& length) {
  std::string literal;
  for (size_t at = 1; at < text.size(); ++at) {
    if (text[at] == '\'') {
      length = at + 1;
      return literal;
    }
    if (text[at] == '\\' && at + 1 < text.size() &&
        (text[at + 1] == '\'' || text[at + 1] == '\\')) {
      ++at;
    }
    literal += text[at];
  }
  return std::nullopt;
}

std::vector<VariableRef> distinctUses(std::vector<VariableRef> refs) {
  auto key = [&](size_t i) {
    return std::tie(refs[i].variable, refs[i].hasKey, refs[i].key);
  };
  std::vector<size_t> order(refs.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return key(a) < key(b); });
  std::vector<bool> repeat(refs.size());
  for (size_t i = 1; i < order.size(); ++i) {
    repeat[order[i]] = key(order[i]) == key(order[i - 1]);
  }
  std::vector<VariableRef> uses;
  for (size_t i = 0; i < refs.size(); ++i) {
    if (!repeat[i] && refs[i].variable != Variable::UNKNOWN) {
      uses.push_back(std::move(refs[i]));
    }
  }
  return uses;
}

bool isNumber(std::string_view text) {
  if (!text.empty() && (text[0] == '-' || text[0] == '+')) {
    text.remove_prefix(1);
  }
  const size_t dot = text.find('.');
  const std::string_view integer = text.substr(0, dot);
  const std::string_view fraction =
      dot == std::string_view::npos ? "0" : text.substr(dot + 1);
  auto digits = [](std::string_view s) {
    return !s.empty() && std::all_of(s.begin(), s.end(), isDigit);
  };
  return digits(integer) && digits(fraction);
}

int compareNumbers(std::string_view a, std::string_view b) {
  const Decimal x = decimalOf(a);
  const Decimal y = decimalOf(b);
  if (x.negative != y.negative) return x.negative ? -1 : 1;
  const int magnitude = compareMagnitudes(x, y);
  return x.negative ? -magnitude : magnitude;
}

}  // namespace esi::expr
