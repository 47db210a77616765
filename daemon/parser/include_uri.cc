#include "parser/include_uri.h"

#include <algorithm>
#include <cstring>

namespace esi {
namespace {

IncludeUri refuse(const char* reason) {
  IncludeUri uri;
  uri.reason = reason;
  return uri;
}

bool isControl(unsigned char c) { return c < 0x20 || c == 0x7f; }

char lower(char c) { return c >= 'A' && c <= 'Z' ? static_cast<char>(c - 'A' + 'a') : c; }

bool equalsIgnoringCase(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (lower(a[i]) != lower(b[i])) return false;
  }
  return true;
}

bool isAlpha(char c) { return lower(c) >= 'a' && lower(c) <= 'z'; }

int hexValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (lower(c) >= 'a' && lower(c) <= 'f') return lower(c) - 'a' + 10;
  return -1;
}

// RFC 3986 scheme, without its ':', or empty when ref has none.
std::string_view schemeOf(std::string_view ref) {
  if (ref.empty() || !isAlpha(ref[0])) return {};
  size_t n = 1;
  while (n < ref.size() &&
         (isAlpha(ref[n]) || (ref[n] >= '0' && ref[n] <= '9') ||
          ref[n] == '+' || ref[n] == '-' || ref[n] == '.')) {
    ++n;
  }
  if (n == ref.size() || ref[n] != ':') return {};
  return ref.substr(0, n);
}

// A default port says nothing, so "host:80" is "host" over http.
std::string_view withoutDefaultPort(std::string_view authority, bool http,
                                    bool https) {
  if (http && authority.ends_with(":80")) authority.remove_suffix(3);
  if (https && authority.ends_with(":443")) authority.remove_suffix(4);
  return authority;
}

// An invalid escape stays as written.
void appendPercentDecoded(std::string& out, std::string_view in) {
  for (size_t i = 0; i < in.size(); ++i) {
    if (in[i] == '%' && i + 2 < in.size() && hexValue(in[i + 1]) >= 0 &&
        hexValue(in[i + 2]) >= 0) {
      out += static_cast<char>(hexValue(in[i + 1]) * 16 + hexValue(in[i + 2]));
      i += 2;
    } else {
      out += in[i];
    }
  }
}

// RFC 3986 5.2.4 in place on a path that starts with '/'; false where the
// RFC would quietly stop a ".." at the root, since such a src is up to
// something.
bool removeDotSegments(std::string& path) {
  size_t out = 0;  // path[0, out) is the result so far
  size_t in = 0;   // path[in] is the '/' before the next segment
  while (in < path.size()) {
    size_t end = path.find('/', in + 1);
    if (end == std::string::npos) end = path.size();
    const std::string_view segment(path.data() + in + 1, end - in - 1);
    const bool last = end == path.size();
    if (segment == ".") {
      if (last) path[out++] = '/';
    } else if (segment == "..") {
      if (out == 0) return false;
      out = path.rfind('/', out - 1);
      if (last) path[out++] = '/';
    } else {
      std::memmove(path.data() + out, path.data() + in, end - in);
      out += end - in;
    }
    in = end;
  }
  path.resize(out);
  return true;
}

// Runs of '/' become one, as NGINX's merge_slashes does for client URIs:
// "//evil.example/x" must not reach an upstream as a path.
void mergeSlashes(std::string& path) {
  path.erase(std::unique(path.begin(), path.end(),
                         [](char a, char b) { return a == '/' && b == '/'; }),
             path.end());
}

}  // namespace

IncludeUri resolveInclude(std::string_view src, std::string_view pageUri,
                          std::string_view pageAuthority) {
  if (src.empty()) return refuse("empty src");

  src = src.substr(0, src.find('#'));
  if (src.empty()) return refuse("src is only a fragment");
  const size_t question = src.find('?');
  const std::string_view args =
      question == std::string_view::npos ? std::string_view()
                                         : src.substr(question + 1);
  std::string_view ref = src.substr(0, question);

  bool http = true;
  bool https = true;
  if (const std::string_view scheme = schemeOf(ref); !scheme.empty()) {
    http = equalsIgnoringCase(scheme, "http");
    https = equalsIgnoringCase(scheme, "https");
    if (!http && !https) return refuse("scheme other than http or https");
    ref.remove_prefix(scheme.size() + 1);
    if (!ref.starts_with("//")) return refuse("http(s) src without //host");
  }

  IncludeUri uri;
  if (ref.starts_with("//")) {
    ref.remove_prefix(2);
    const std::string_view authority = ref.substr(0, ref.find('/'));
    ref.remove_prefix(authority.size());
    if (authority.empty()) return refuse("empty authority");
    if (authority.find('\\') != std::string_view::npos) {
      return refuse("backslash in authority");
    }
    if (authority.find('@') != std::string_view::npos) {
      return refuse("userinfo in authority");
    }
    if (!equalsIgnoringCase(withoutDefaultPort(authority, http, https),
                            withoutDefaultPort(pageAuthority, http, https))) {
      return refuse("authority other than the page's");
    }
    if (ref.empty()) uri.path = '/';
  } else if (ref.empty()) {
    // RFC 3986 5.2.2: "?args" keeps the page's path.
    if (!pageUri.starts_with('/')) uri.path = '/';
    uri.path += pageUri;
  } else if (!ref.starts_with("/")) {
    // pageUri is decoded already: only src's part is decoded below.
    const size_t slash = pageUri.rfind('/');
    if (slash == std::string_view::npos || pageUri[0] != '/') uri.path = '/';
    if (slash != std::string_view::npos) {
      uri.path += pageUri.substr(0, slash + 1);
    }
  }
  appendPercentDecoded(uri.path, ref);

  // Browsers, curl and many upstreams read '\' as '/': "/\evil" names a
  // host to them and "..\" climbs, whether written or percent-encoded.
  for (const char c : uri.path) {
    if (isControl(c)) return refuse("control character in path");
    if (c == '\\') return refuse("backslash in path");
  }
  for (const char c : args) {
    if (isControl(c) || c == ' ') {
      return refuse("control character or space in args");
    }
  }
  if (!removeDotSegments(uri.path)) return refuse("path climbs above the root");
  mergeSlashes(uri.path);

  uri.args = args;
  uri.ok = true;
  return uri;
}

}  // namespace esi
