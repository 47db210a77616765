// What templates and expressions share, inside esi_expr: the $(...)
// reference, the quoted literal, numbers, and ASCII helpers.  The API headers
// include it for their members only; it is not part of the API.

#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "expr/variables.h"

namespace esi::expr {

inline char lower(char c) {
  return c >= 'A' && c <= 'Z' ? static_cast<char>(c - 'A' + 'a') : c;
}

inline bool isDigit(char c) { return c >= '0' && c <= '9'; }

inline bool isSpace(char c) {
  return c == ' ' || c == '\t' || c == '\r' || c == '\n';
}

bool equalsIgnoringCase(std::string_view a, std::string_view b);

// $(NAME), $(NAME{key}), $(NAME|default), $(NAME{key}|default).
struct Reference {
  VariableRef variable;
  bool hasFallback = false;
  std::string fallback;  // unquoted

  // The variable's value, or the fallback where that is empty.
  std::string_view valueIn(const RequestVariables& variables) const;
};

// Reads the reference at the start of text, which starts with "$(".  On
// success length is how many bytes it took; nullopt when it is malformed: a
// name that is not uppercase letters, digits and '_' starting with a letter
// (so jQuery's $(document) is no reference), an unclosed brace or
// parenthesis, a default that is neither quoted nor one bare word, or more
// than MAX_REFERENCE_BYTES in all (so that a text full of "$(A{" is still
// read in linear time).
constexpr size_t MAX_REFERENCE_BYTES = 1024;
std::optional<Reference> parseReference(std::string_view text, size_t& length);

// Reads the single-quoted literal at the start of text: 'it\'s' is "it's",
// '\\' is one backslash, any other backslash stays.  nullopt when unclosed.
std::optional<std::string> parseQuoted(std::string_view text, size_t& length);

// refs without repeats and without UNKNOWN (always empty, so no request value
// is needed for it), in order of first appearance; O(n log n).
std::vector<VariableRef> distinctUses(std::vector<VariableRef> refs);

// A decimal number: optional sign, digits, optionally '.' and digits
// ("-1", "01", "1.50"; not ".5", "1.", "1e3", " 1", "3.01.23" or "1.05a").
bool isNumber(std::string_view text);

// <0, 0 or >0 as a is below, equal to or above b, both isNumber(), exactly
// (no floating point: "1.0" equals "1", "-0" equals "0", and a hundred
// digits compare as they should).
int compareNumbers(std::string_view a, std::string_view b);

}  // namespace esi::expr
