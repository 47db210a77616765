// resolveInclude on any src, page path and authority: what it accepts is a
// local path an NGINX subrequest can take as it is, never a way to another
// host or a header (include_uri.h; issue 8, item 5).
//
// Input: byte 0 is the page path's length, byte 1 the authority's, then the
// page path, the authority and src, which is the rest.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "fuzz_check.h"
#include "parser/include_uri.h"

namespace {

bool isControl(char c) {
  return static_cast<unsigned char>(c) < 0x20 || c == 0x7f;
}

bool hasControl(std::string_view s) {
  for (const char c : s) {
    if (isControl(c)) return true;
  }
  return false;
}

// A dot segment left in the path: "/./", "/../", or one at the end.
bool hasDotSegment(std::string_view path) {
  return path.find("/./") != std::string_view::npos ||
         path.find("/../") != std::string_view::npos ||
         path.ends_with("/.") || path.ends_with("/..");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  std::string_view rest(reinterpret_cast<const char*>(data) + 2, size - 2);
  const size_t pageLength = std::min<size_t>(data[0], rest.size());
  const std::string_view pageUri = rest.substr(0, pageLength);
  rest.remove_prefix(pageLength);
  const size_t authorityLength = std::min<size_t>(data[1], rest.size());
  const std::string_view authority = rest.substr(0, authorityLength);
  const std::string_view src = rest.substr(authorityLength);

  const esi::IncludeUri uri = esi::resolveInclude(src, pageUri, authority);

  if (!uri.ok) {
    FUZZ_CHECK(!uri.reason.empty());
    FUZZ_CHECK(uri.path.empty() && uri.args.empty());
    return 0;
  }
  FUZZ_CHECK(uri.reason.empty());
  FUZZ_CHECK(uri.path.starts_with('/'));
  // No CR, LF, NUL or other control byte that could end or forge a header
  // line of the subrequest, nor a space that would end the request line.
  FUZZ_CHECK(!hasControl(uri.path));
  FUZZ_CHECK(!hasControl(uri.args));
  FUZZ_CHECK(uri.args.find(' ') == std::string::npos);
  FUZZ_CHECK(uri.args.find('#') == std::string::npos);
  // Dot segments are removed, and nothing climbs above the root.
  FUZZ_CHECK(!hasDotSegment(uri.path));
  // Browsers and curl read '\' as '/': "/\evil" names a host.
  FUZZ_CHECK(uri.path.find('\\') == std::string::npos);
  // Nor does "//evil" reach an upstream as a path.
  FUZZ_CHECK(uri.path.find("//") == std::string::npos);
  return 0;
}
