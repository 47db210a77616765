// esi_expr on any text and any request: a template rendered both ways and
// an expression compiled and evaluated never crash, and nothing a request
// sends adds markup or URL structure the text did not have
// (daemon/expr/template.h, expression.h; issue 9).
//
// Input: 8 header bytes, then the request's six inputs, then the text.
//   byte 0: bits 0-1 the cookie allow-list (none, "*", {a, id, x}, {a, *});
//           bit 2: ExpressionLimits::maxNesting of 4 instead of 64
//   bytes 1-6: lengths of Host, Cookie, Referer, User-Agent, Accept-Language
//           and the query string, which follow in that order
//   byte 7: RequestLimits::maxInputBytes (0: the default, 8192)
//   the rest: the text, read as a template and as an expression

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "expr/expression.h"
#include "expr/template.h"
#include "expr/variables.h"
#include "fuzz_check.h"

namespace {

using esi::Escaping;
using esi::RequestInputs;
using esi::RequestVariables;
using esi::Variable;
using esi::VariableRef;

bool isUnreserved(char c) {
  return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') ||
         (c >= '0' && c <= '9') || c == '-' || c == '.' || c == '_' ||
         c == '~';
}

bool isUpperHex(char c) {
  return (c >= '0' && c <= '9') || (c >= 'A' && c <= 'F');
}

std::array<size_t, 256> histogram(std::string_view text) {
  std::array<size_t, 256> counts{};
  for (const char c : text) ++counts[static_cast<unsigned char>(c)];
  return counts;
}

// Values come out escaped, so the bytes that make markup or URL structure
// are those of the text itself: as many with the request's values as with
// none at all.
void checkEscapedLikeTheText(const esi::Template& text,
                             const RequestVariables& variables) {
  const RequestVariables empty;
  const auto html = histogram(text.render(variables, Escaping::HTML));
  const auto htmlEmpty = histogram(text.render(empty, Escaping::HTML));
  for (const unsigned char c : {'<', '>', '"', '\''}) {
    FUZZ_CHECK(html[c] == htmlEmpty[c]);
  }
  const auto url = histogram(text.render(variables, Escaping::URL));
  const auto urlEmpty = histogram(text.render(empty, Escaping::URL));
  for (int c = 0; c < 256; ++c) {
    if (!isUnreserved(static_cast<char>(c)) && c != '%') {
      FUZZ_CHECK(url[c] == urlEmpty[c]);
    }
  }
}

void checkEscapedValue(std::string_view value) {
  std::string html;
  esi::appendEscaped(html, value, Escaping::HTML);
  FUZZ_CHECK(html.find_first_of("<>\"'") == std::string::npos);
  FUZZ_CHECK(html.size() >= value.size());

  std::string url;
  esi::appendEscaped(url, value, Escaping::URL);
  for (size_t i = 0; i < url.size(); ++i) {
    if (url[i] == '%') {
      FUZZ_CHECK(i + 2 < url.size() && isUpperHex(url[i + 1]) &&
                 isUpperHex(url[i + 2]));
      i += 2;
    } else {
      FUZZ_CHECK(isUnreserved(url[i]));
    }
  }
}

void checkValue(const RequestVariables& variables, const VariableRef& ref,
                size_t limit) {
  const std::string_view value = variables.value(ref);
  checkEscapedValue(value);
  if (!ref.hasKey && ref.variable != Variable::HTTP_COOKIE) {
    FUZZ_CHECK(value.size() <= limit);
  }
  if (!ref.hasKey) return;
  if (ref.variable == Variable::HTTP_ACCEPT_LANGUAGE) {
    FUZZ_CHECK(value == "true" || value == "false");
  } else if (ref.variable == Variable::HTTP_USER_AGENT &&
             ref.key == "browser") {
    FUZZ_CHECK(value == "MOZILLA" || value == "MSIE" || value == "OTHER");
  } else if (ref.variable == Variable::HTTP_USER_AGENT && ref.key == "os") {
    FUZZ_CHECK(value == "WIN" || value == "MAC" || value == "UNIX" ||
               value == "OTHER");
  } else if (ref.variable == Variable::HTTP_HOST ||
             ref.variable == Variable::HTTP_REFERER) {
    FUZZ_CHECK(value.empty());
  }
}

// HTTP_COOKIE shows "name=value; name=value" of allowed names only.
void checkOnlyAllowedCookies(const RequestVariables& variables,
                             const esi::CookieAllowList& cookies) {
  std::string_view all = variables.value({Variable::HTTP_COOKIE, false, ""});
  while (!all.empty()) {
    const size_t end = std::min(all.find("; "), all.size());
    const std::string_view cookie = all.substr(0, end);
    const size_t equals = cookie.find('=');
    FUZZ_CHECK(equals != std::string_view::npos && equals > 0);
    FUZZ_CHECK(cookies.allows(cookie.substr(0, equals)));
    all.remove_prefix(std::min(end + 2, all.size()));
  }
}

// The request as a connector would send it when told what the text uses:
// the inputs of other variables left out.
RequestInputs onlyUsed(const RequestInputs& all,
                       const std::vector<VariableRef>& uses) {
  auto used = [&](Variable variable) {
    return std::any_of(uses.begin(), uses.end(), [&](const VariableRef& r) {
      return r.variable == variable;
    });
  };
  RequestInputs some;
  if (used(Variable::HTTP_HOST)) some.host = all.host;
  if (used(Variable::HTTP_COOKIE)) some.cookie = all.cookie;
  if (used(Variable::HTTP_REFERER)) some.referer = all.referer;
  if (used(Variable::HTTP_USER_AGENT)) some.userAgent = all.userAgent;
  if (used(Variable::HTTP_ACCEPT_LANGUAGE)) {
    some.acceptLanguage = all.acceptLanguage;
  }
  if (used(Variable::QUERY_STRING)) some.queryString = all.queryString;
  return some;
}

const esi::CookieAllowList& allowList(uint8_t selector) {
  static const esi::CookieAllowList none;
  static const esi::CookieAllowList all({"*"});
  static const esi::CookieAllowList some({"a", "id", "x"});
  static const esi::CookieAllowList someAndAll({"a", "*"});
  switch (selector & 3) {
    case 0: return none;
    case 1: return all;
    case 2: return some;
    default: return someAndAll;
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  constexpr size_t HEADER = 8;
  if (size < HEADER) return 0;
  std::string_view rest(reinterpret_cast<const char*>(data) + HEADER,
                        size - HEADER);
  std::array<std::string_view, 6> fields;
  for (size_t i = 0; i < fields.size(); ++i) {
    const size_t length = std::min<size_t>(data[1 + i], rest.size());
    fields[i] = rest.substr(0, length);
    rest.remove_prefix(length);
  }
  const RequestInputs inputs{fields[0], fields[1], fields[2],
                             fields[3], fields[4], fields[5]};
  const esi::RequestLimits limits{data[7] == 0 ? size_t{8192} : data[7]};
  const esi::CookieAllowList& cookies = allowList(data[0]);
  const RequestVariables variables(inputs, cookies, limits);
  const std::string_view text = rest;

  // The text as a template.
  const esi::Template compiled = esi::Template::compile(text);
  const std::vector<VariableRef> templateUses = compiled.uses();
  for (const VariableRef& ref : templateUses) {
    FUZZ_CHECK(ref.variable != Variable::UNKNOWN);
    checkValue(variables, ref, limits.maxInputBytes);
  }
  FUZZ_CHECK(compiled.hasReferences() || templateUses.empty());
  checkEscapedLikeTheText(compiled, variables);
  {
    const RequestVariables some(onlyUsed(inputs, templateUses), cookies,
                                limits);
    for (const Escaping escaping : {Escaping::HTML, Escaping::URL}) {
      FUZZ_CHECK(compiled.render(some, escaping) ==
                 compiled.render(variables, escaping));
    }
  }
  checkOnlyAllowedCookies(variables, cookies);

  // The text as an expression.
  esi::ExpressionLimits expressionLimits;
  if (data[0] & 4) expressionLimits.maxNesting = 4;
  const esi::Expression expression =
      esi::Expression::compile(text, expressionLimits);
  if (!expression.ok()) {
    FUZZ_CHECK(expression.error().starts_with("at byte "));
    FUZZ_CHECK(!expression.evaluate(variables));
    FUZZ_CHECK(expression.uses().empty());
    return 0;
  }
  const bool result = expression.evaluate(variables);
  FUZZ_CHECK(expression.evaluate(variables) == result);
  const std::vector<VariableRef> uses = expression.uses();
  for (const VariableRef& ref : uses) {
    FUZZ_CHECK(ref.variable != Variable::UNKNOWN);
    checkValue(variables, ref, limits.maxInputBytes);
  }
  const RequestVariables some(onlyUsed(inputs, uses), cookies, limits);
  FUZZ_CHECK(expression.evaluate(some) == result);
  return 0;
}
