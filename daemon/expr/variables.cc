#include "expr/variables.h"

#include <algorithm>
#include <array>

#include "base/text.h"
#include "expr/syntax.h"

namespace esi {
namespace {

using expr::equalsIgnoringCase;
using expr::lower;

struct Spelling {
  Variable variable;
  std::string_view name;
  std::string_view header;
};

constexpr std::array<Spelling, 6> SPELLINGS = {{
    {Variable::HTTP_ACCEPT_LANGUAGE, "HTTP_ACCEPT_LANGUAGE", "Accept-Language"},
    {Variable::HTTP_COOKIE, "HTTP_COOKIE", "Cookie"},
    {Variable::HTTP_HOST, "HTTP_HOST", "Host"},
    {Variable::HTTP_REFERER, "HTTP_REFERER", "Referer"},
    {Variable::HTTP_USER_AGENT, "HTTP_USER_AGENT", "User-Agent"},
    {Variable::QUERY_STRING, "QUERY_STRING", ""},
}};

// A single value past the limit is dropped whole: a cut one would be wrong.
std::string_view whole(std::string_view input, size_t limit) {
  return input.size() <= limit ? input : std::string_view();
}

// The entries of a separator-delimited list that end within the limit.
std::string_view wholeEntries(std::string_view input, size_t limit,
                              char separator) {
  if (input.size() <= limit) return input;
  const size_t end = input.substr(0, limit + 1).rfind(separator);
  return end == std::string_view::npos ? std::string_view()
                                       : input.substr(0, end);
}

// Calls visit(entry) for each separator-delimited entry, trimmed.
template <typename Visit>
void forEachEntry(std::string_view list, char separator, Visit visit) {
  while (!list.empty()) {
    const size_t end = std::min(list.find(separator), list.size());
    if (const std::string_view entry = trim(list.substr(0, end));
        !entry.empty()) {
      visit(entry);
    }
    list.remove_prefix(std::min(end + 1, list.size()));
  }
}

int hexValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (lower(c) >= 'a' && lower(c) <= 'f') return lower(c) - 'a' + 10;
  return -1;
}

// application/x-www-form-urlencoded, as browsers write query strings: '+'
// is a space; an invalid escape stays as written.  Writes at most
// in.size() bytes at out; returns their end.
char* formDecode(char* out, std::string_view in) {
  for (size_t i = 0; i < in.size(); ++i) {
    if (in[i] == '+') {
      *out++ = ' ';
    } else if (in[i] == '%' && i + 2 < in.size() &&
               hexValue(in[i + 1]) >= 0 && hexValue(in[i + 2]) >= 0) {
      *out++ = static_cast<char>(hexValue(in[i + 1]) * 16 + hexValue(in[i + 2]));
      i += 2;
    } else {
      *out++ = in[i];
    }
  }
  return out;
}

// A language range with its parameters; q=0 means "not acceptable".
bool isAcceptable(std::string_view parameters) {
  bool acceptable = true;
  forEachEntry(parameters, ';', [&](std::string_view parameter) {
    const size_t equals = parameter.find('=');
    if (equals == std::string_view::npos) return;
    const std::string_view value = trim(parameter.substr(equals + 1));
    if (equalsIgnoringCase(trim(parameter.substr(0, equals)), "q") &&
        expr::isNumber(value) && expr::compareNumbers(value, "0") <= 0) {
      acceptable = false;
    }
  });
  return acceptable;
}

// RFC 4647 section 3.3.1: "*" matches every tag, and a range matches the
// tags it equals or that start with it followed by '-'.
bool rangeMatches(std::string_view range, std::string_view tag) {
  if (range == "*") return true;
  if (tag.size() > range.size() && tag[range.size()] == '-') {
    tag = tag.substr(0, range.size());
  }
  return equalsIgnoringCase(range, tag);
}

bool contains(std::string_view text, std::string_view word) {
  return text.find(word) != std::string_view::npos;
}

bool containsAny(std::string_view text,
                 std::initializer_list<std::string_view> words) {
  return std::any_of(words.begin(), words.end(),
                     [&](std::string_view w) { return contains(text, w); });
}

// The version that follows a product name: "5.5b1" of "MSIE 5.5b1;".
std::string_view versionAt(std::string_view userAgent, size_t at) {
  size_t end = at;
  while (end < userAgent.size() &&
         (expr::isDigit(userAgent[end]) ||
          (lower(userAgent[end]) >= 'a' && lower(userAgent[end]) <= 'z') ||
          userAgent[end] == '.' || userAgent[end] == '_' ||
          userAgent[end] == '-')) {
    ++end;
  }
  return userAgent.substr(at, end - at);
}

std::string_view versionAfter(std::string_view userAgent,
                              std::string_view product) {
  const size_t at = userAgent.find(product);
  return at == std::string_view::npos
             ? std::string_view()
             : versionAt(userAgent, at + product.size());
}

// By name, and within a name in the order sent: entries are views into one
// buffer filled in header order, so their addresses are that order.
template <typename Entry>
void sortByName(std::vector<Entry>& entries) {
  std::sort(entries.begin(), entries.end(), [](const Entry& a, const Entry& b) {
    return a.name != b.name ? a.name < b.name
                            : std::less<>()(a.name.data(), b.name.data());
  });
}

}  // namespace

Variable variableNamed(std::string_view name) {
  for (const Spelling& s : SPELLINGS) {
    if (name == s.name) return s.variable;
  }
  return Variable::UNKNOWN;
}

std::string_view nameOf(Variable variable) {
  for (const Spelling& s : SPELLINGS) {
    if (variable == s.variable) return s.name;
  }
  return "UNKNOWN";
}

std::string_view headerOf(Variable variable) {
  for (const Spelling& s : SPELLINGS) {
    if (variable == s.variable) return s.header;
  }
  return {};
}

CookieAllowList::CookieAllowList(std::vector<std::string> names)
    : names_(std::move(names)) {
  all_ = std::find(names_.begin(), names_.end(), "*") != names_.end();
  std::sort(names_.begin(), names_.end());
}

bool CookieAllowList::allows(std::string_view name) const {
  return all_ || std::binary_search(names_.begin(), names_.end(), name);
}

RequestVariables::RequestVariables(const RequestInputs& inputs,
                                   const CookieAllowList& cookies,
                                   RequestLimits limits) {
  const size_t limit = limits.maxInputBytes;
  const std::string_view host = whole(inputs.host, limit);
  const std::string_view referer = whole(inputs.referer, limit);
  const std::string_view userAgent = whole(inputs.userAgent, limit);
  const std::string_view acceptLanguage =
      wholeEntries(inputs.acceptLanguage, limit, ',');
  const std::string_view queryString =
      wholeEntries(inputs.queryString, limit, '&');
  const std::string_view cookie = wholeEntries(inputs.cookie, limit, ';');

  // One allocation holds every value: the inputs, the allowed cookies joined
  // (no longer than the header with a space added per ';') and the decoded
  // query (no longer than the query).  It never grows, so views into it hold.
  const size_t cookieSeparators =
      static_cast<size_t>(std::count(cookie.begin(), cookie.end(), ';'));
  bytes_.reset(host.size() + referer.size() + userAgent.size() +
               acceptLanguage.size() + 2 * queryString.size() + cookie.size() +
               cookieSeparators);
  host_ = bytes_.keep(host);
  referer_ = bytes_.keep(referer);
  userAgent_ = bytes_.keep(userAgent);
  acceptLanguage_ = bytes_.keep(acceptLanguage);
  queryString_ = bytes_.keep(queryString);

  const char* const cookiesStart = bytes_.end();
  cookies_.reserve(cookieSeparators + 1);
  forEachEntry(cookie, ';', [&](std::string_view entry) {
    const size_t equals = entry.find('=');
    if (equals == std::string_view::npos) return;
    const std::string_view name = trim(entry.substr(0, equals));
    const std::string_view value = trim(entry.substr(equals + 1));
    if (name.empty() || !cookies.allows(name)) return;
    if (!cookies_.empty()) bytes_.keep("; ");
    const std::string_view kept = bytes_.keep(name);
    bytes_.keep("=");
    cookies_.push_back({kept, bytes_.keep(value)});
  });
  allowedCookies_ = std::string_view(
      cookiesStart, static_cast<size_t>(bytes_.end() - cookiesStart));
  sortByName(cookies_);
}

// Cookies are read at once (the allow list need not outlive this object);
// the other lists and the User-Agent when a variable first asks for them,
// so that a request pays only for the variables its page reads.

void RequestVariables::readLanguages() const {
  if (languagesRead_) return;
  languagesRead_ = true;
  languageRanges_.reserve(static_cast<size_t>(
      std::count(acceptLanguage_.begin(), acceptLanguage_.end(), ',')) + 1);
  forEachEntry(acceptLanguage_, ',', [&](std::string_view entry) {
    const size_t semicolon = std::min(entry.find(';'), entry.size());
    const std::string_view range = trim(entry.substr(0, semicolon));
    if (!range.empty() && isAcceptable(entry.substr(semicolon))) {
      languageRanges_.push_back(range);
    }
  });
}

void RequestVariables::readQuery() const {
  if (queryRead_) return;
  queryRead_ = true;
  parameters_.reserve(static_cast<size_t>(std::count(
                          queryString_.begin(), queryString_.end(), '&')) + 1);
  forEachEntry(queryString_, '&', [&](std::string_view parameter) {
    const size_t equals = std::min(parameter.find('='), parameter.size());
    const std::string_view name =
        bytes_.keepFormDecoded(parameter.substr(0, equals));
    const std::string_view value =
        equals < parameter.size()
            ? bytes_.keepFormDecoded(parameter.substr(equals + 1))
            : std::string_view();
    parameters_.push_back({name, value});
  });
  sortByName(parameters_);
}

void RequestVariables::readUserAgent() const {
  if (userAgentRead_) return;
  userAgentRead_ = true;
  const std::string_view ua = userAgent_;
  if (contains(ua, "MSIE ")) {
    browser_ = "MSIE";
    browserVersion_ = versionAfter(ua, "MSIE ");
  } else if (contains(ua, "Trident/")) {  // Internet Explorer 11
    browser_ = "MSIE";
    browserVersion_ = versionAfter(ua, "rv:");
  } else if (ua.starts_with("Mozilla/")) {
    browser_ = "MOZILLA";
    browserVersion_ = versionAfter(ua, "Mozilla/");
  } else if (const size_t slash = ua.find('/');
             slash != std::string_view::npos &&
             ua.substr(0, slash).find(' ') == std::string_view::npos) {
    browserVersion_ = versionAt(ua, slash + 1);
  }
  // "Darwin" holds "win", but not "Win": case matters here.
  if (contains(ua, "Win")) {
    os_ = "WIN";
  } else if (containsAny(ua, {"Macintosh", "Mac OS", "Mac_", "iPhone", "iPad",
                              "iPod", "Darwin"})) {
    os_ = "MAC";
  } else if (containsAny(ua, {"X11", "Linux", "Android", "BSD", "SunOS",
                              "CrOS", "Unix", "UNIX", "HP-UX", "AIX"})) {
    os_ = "UNIX";
  }
}

std::string_view RequestVariables::first(const std::vector<Entry>& sorted,
                                         std::string_view name) {
  const auto it = std::lower_bound(
      sorted.begin(), sorted.end(), name,
      [](const Entry& entry, std::string_view n) { return entry.name < n; });
  return it != sorted.end() && it->name == name ? it->value
                                                : std::string_view();
}

std::string_view RequestVariables::acceptsLanguage(std::string_view tag) const {
  if (tag.empty()) return "false";
  readLanguages();
  return std::any_of(
             languageRanges_.begin(), languageRanges_.end(),
             [&](std::string_view range) { return rangeMatches(range, tag); })
             ? "true"
             : "false";
}

std::string_view RequestVariables::userAgentKey(std::string_view key) const {
  readUserAgent();
  if (key == "browser") return browser_;
  if (key == "os") return os_;
  if (key == "version") return browserVersion_;
  return {};
}

std::string_view RequestVariables::value(const VariableRef& ref) const {
  switch (ref.variable) {
    case Variable::HTTP_ACCEPT_LANGUAGE:
      return ref.hasKey ? acceptsLanguage(ref.key) : acceptLanguage_;
    case Variable::HTTP_COOKIE:
      return ref.hasKey ? first(cookies_, ref.key) : allowedCookies_;
    case Variable::HTTP_HOST:
      return ref.hasKey ? std::string_view() : host_;
    case Variable::HTTP_REFERER:
      return ref.hasKey ? std::string_view() : referer_;
    case Variable::HTTP_USER_AGENT:
      return ref.hasKey ? userAgentKey(ref.key) : userAgent_;
    case Variable::QUERY_STRING:
      if (!ref.hasKey) return queryString_;
      readQuery();
      return first(parameters_, ref.key);
    case Variable::UNKNOWN:
      break;
  }
  return {};
}

void RequestVariables::Buffer::reset(size_t capacity) {
  bytes_ = std::make_unique_for_overwrite<char[]>(capacity);
  capacity_ = capacity;
  size_ = 0;
}

std::string_view RequestVariables::Buffer::keep(std::string_view value) {
  // The constructor sized it for everything; more would be a bug, and is
  // left out rather than written past the end.
  if (value.size() > capacity_ - size_) return {};
  char* at = bytes_.get() + size_;
  std::copy(value.begin(), value.end(), at);
  size_ += value.size();
  return {at, value.size()};
}

std::string_view RequestVariables::Buffer::keepFormDecoded(
    std::string_view value) {
  if (value.size() > capacity_ - size_) return {};
  char* at = bytes_.get() + size_;
  const char* end = formDecode(at, value);
  size_ += static_cast<size_t>(end - at);
  return {at, static_cast<size_t>(end - at)};
}

}  // namespace esi
