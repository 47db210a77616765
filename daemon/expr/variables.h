// ESI 1.0 request variables (W3C Note "ESI Language Specification 1.0",
// section 4): what $(HTTP_COOKIE{id}) and its kind evaluate to for one request.
//
// The esi_expr library is the evaluation side of the ESI language, in three
// headers:
//   expr/variables.h   RequestVariables: the request's values, looked up by
//                      VariableRef (this file)
//   expr/template.h    Template: text with $(...) references, compiled once,
//                      rendered per request, HTML- or percent-escaped
//   expr/expression.h  Expression: an <esi:when test>, compiled once,
//                      evaluated per request
// Page structure is parsed once and memoised, so compiling does the work
// (syntax, regular expressions) and evaluation only looks values up.  Both
// compiled forms list the variables they use, so a connector can send esid
// only those request values.  Nothing here throws on any input.
//
// Every input is read within RequestLimits::maxInputBytes (8 KiB, NGINX's
// largest default header line): Host, Referer and User-Agent longer than that
// are taken as absent; of Cookie, Accept-Language and the query string only the
// entries that end within the first 8 KiB count, so no value is ever cut short.
// Each input is read once, the first time a variable needs it (the cookies
// at once): O(n log n) in its size; a lookup is O(log n) (Accept-Language:
// linear in its ranges).

#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace esi {

// The spec's variables; UNKNOWN is any other name, and is always empty.
enum class Variable : uint8_t {
  UNKNOWN,
  HTTP_ACCEPT_LANGUAGE,  // list: {lang} is "true" or "false"
  HTTP_COOKIE,           // dictionary: {name} is the cookie's value
  HTTP_HOST,
  HTTP_REFERER,
  HTTP_USER_AGENT,  // dictionary of three: {browser}, {os}, {version}
  QUERY_STRING,     // dictionary: {param} is the decoded value
};

// Names are case-sensitive, as the spec spells them: "http_host" is UNKNOWN.
Variable variableNamed(std::string_view name);
std::string_view nameOf(Variable variable);
// The request header a variable reads ("Cookie"); empty for QUERY_STRING,
// which is the request line's, and for UNKNOWN.
std::string_view headerOf(Variable variable);

// One use of a variable: $(NAME) or $(NAME{key}).
struct VariableRef {
  Variable variable = Variable::UNKNOWN;
  bool hasKey = false;
  std::string key;  // as written between the braces

  bool operator==(const VariableRef&) const = default;
};

// The request values the variables read: header values as received (views,
// read only during construction).  queryString is the part after '?',
// undecoded.
struct RequestInputs {
  std::string_view host = {};
  std::string_view cookie = {};
  std::string_view referer = {};
  std::string_view userAgent = {};
  std::string_view acceptLanguage = {};
  std::string_view queryString = {};
};

struct RequestLimits {
  size_t maxInputBytes = 8192;
};

// Which cookies ESI may read, set once from configuration.  Cookies often
// carry sessions that a page must never show, so none is readable unless
// named (Traffic Server's ESI plugin behaves the same by default).  The single
// name "*" allows every cookie.  Names are case-sensitive, as cookie names are.
class CookieAllowList {
 public:
  CookieAllowList() = default;
  explicit CookieAllowList(std::vector<std::string> names);

  bool allows(std::string_view name) const;

 private:
  std::vector<std::string> names_;  // sorted
  bool all_ = false;
};

// The variables of one request.  Lookups return views into this object.
class RequestVariables {
 public:
  RequestVariables() = default;  // an empty request: every variable is empty
  RequestVariables(const RequestInputs& inputs, const CookieAllowList& cookies,
                   RequestLimits limits = {});
  // Its lookups point into itself.
  RequestVariables(const RequestVariables&) = delete;
  RequestVariables& operator=(const RequestVariables&) = delete;

  // The value of $(NAME) or $(NAME{key}); empty for an unknown variable,
  // key or cookie that is not allowed.
  //  - HTTP_ACCEPT_LANGUAGE{lang}: "true" when a language range in the header
  //    with a q above 0 matches lang by RFC 4647 basic filtering ("en" and
  //    "*" match "en-GB"; case does not matter), else "false".
  //  - HTTP_COOKIE: the allowed cookies, "a=1; b=2", in header order;
  //    HTTP_COOKIE{name}: the first cookie of that name, value as sent.
  //  - HTTP_USER_AGENT{browser}: "MSIE" for Internet Explorer ("MSIE " or
  //    "Trident/" in the header), else "MOZILLA" for every User-Agent that
  //    starts "Mozilla/" (Firefox, Chrome, Safari, Edge, Opera and most bots
  //    today), else "OTHER".  {version}: the version of that product token:
  //    "5.5" for "MSIE 5.5", the rv: for IE 11, "5.0" for any "Mozilla/5.0",
  //    else the first product's ("8.1" for "curl/8.1").  {os}: "WIN"
  //    (Windows, Windows Phone), "MAC" (macOS, iOS: "Macintosh", "Mac OS",
  //    "iPhone", "iPad", "Darwin"), "UNIX" (X11, Linux, Android, BSD, SunOS,
  //    ChromeOS) or "OTHER", tried in that order.
  //  - QUERY_STRING: as received, undecoded; QUERY_STRING{param}: the first
  //    parameter of that (decoded) name, percent- and '+'-decoded.
  std::string_view value(const VariableRef& ref) const;

 private:
  struct Entry {
    std::string_view name;
    std::string_view value;
  };
  std::string_view acceptsLanguage(std::string_view tag) const;
  std::string_view userAgentKey(std::string_view key) const;
  void readLanguages() const;
  void readQuery() const;
  void readUserAgent() const;
  static std::string_view first(const std::vector<Entry>& sorted,
                                std::string_view name);

  // Bytes of a size fixed when it is made, kept whole: views of what it
  // keeps stay valid for its life.
  class Buffer {
   public:
    void reset(size_t capacity);
    std::string_view keep(std::string_view value);
    std::string_view keepFormDecoded(std::string_view value);
    const char* end() const { return bytes_.get() + size_; }

   private:
    std::unique_ptr<char[]> bytes_;
    size_t capacity_ = 0;
    size_t size_ = 0;
  };

  // Every view below is into it; the lists read on first use are kept
  // in it then.
  mutable Buffer bytes_;
  std::string_view host_;
  std::string_view referer_;
  std::string_view userAgent_;
  std::string_view acceptLanguage_;
  mutable bool languagesRead_ = false;
  mutable std::vector<std::string_view> languageRanges_;  // q > 0
  std::string_view allowedCookies_;  // what HTTP_COOKIE shows
  std::vector<Entry> cookies_;       // sorted by name, stable
  std::string_view queryString_;
  mutable bool queryRead_ = false;
  mutable std::vector<Entry> parameters_;  // sorted by name, decoded; stable
  mutable bool userAgentRead_ = false;
  mutable std::string_view browser_ = "OTHER";
  mutable std::string_view os_ = "OTHER";
  mutable std::string_view browserVersion_;  // into userAgent_
};

}  // namespace esi
