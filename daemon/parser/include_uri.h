// Where an <esi:include src> may be fetched from: a local path on the page's
// own authority, or nowhere.

#pragma once

#include <string>
#include <string_view>

namespace esi {

struct IncludeUri {
  bool ok = false;
  std::string path;    // decoded, dot-segments removed, starts with '/'
  std::string args;    // the query, undecoded, without '?'
  std::string reason;  // why it was refused, when !ok
};

// Resolves src (already entity-decoded) against the page's decoded path and
// its authority (the Host it was requested with).
IncludeUri resolveInclude(std::string_view src, std::string_view pageUri,
                          std::string_view pageAuthority);

}  // namespace esi
