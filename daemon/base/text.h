// Small text helpers every subsystem's reader shares.

#pragma once

#include <string_view>

namespace esi {

// `s` without the spaces, tabs, CRs and LFs around it.
inline std::string_view trim(std::string_view s) {
  constexpr std::string_view kBlank = " \t\r\n";
  const size_t first = s.find_first_not_of(kBlank);
  if (first == std::string_view::npos) return {};
  return s.substr(first, s.find_last_not_of(kBlank) - first + 1);
}

}  // namespace esi
