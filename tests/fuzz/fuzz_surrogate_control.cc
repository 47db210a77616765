// The connector's Surrogate-Control parser (nginx-connector/esi_surrogate.c,
// as ngx_http_esi_surrogate.c calls it) on any header values and any
// esi_surrogate name: it reads only the value and the name (ASan: copies
// of exactly their size), and says what a reference reading of the W3C
// Edge Architecture's grammar says, written another way (string_view
// cuts, from_chars): content="ESI/1.0" in the list, no-store, max-age
// without and with ";name" (the last of each taken, an unparsable one
// skipped, one past a time_t skipped), directives for other surrogates
// ignored.
//
// Input: byte 0, the length of esi_surrogate's name (0: none); the name;
// then the header values, separated by "\n" (which no header value holds).

#include <sys/types.h>

#include <algorithm>
#include <charconv>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <string_view>

#include "esi_surrogate.h"
#include "fuzz_check.h"

namespace {

constexpr std::string_view kBlank(" \t");

char lower(char c) { return c >= 'A' && c <= 'Z' ? static_cast<char>(c | 0x20) : c; }

bool same(std::string_view a, std::string_view b) {
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(),
                                            [](char x, char y) { return lower(x) == lower(y); });
}

std::string_view trim(std::string_view s) {
  const size_t first = s.find_first_not_of(kBlank);
  if (first == std::string_view::npos) return {};
  return s.substr(first, s.find_last_not_of(kBlank) - first + 1);
}

struct Said {
  long long maxAge = -1;
  long long maxAgeTargeted = -1;
  bool esi = false;
  bool noStore = false;
};

void reference(std::string_view value, std::string_view name, Said* said) {
  while (!value.empty()) {
    // A directive ends at a comma outside quotes; its target starts at the
    // first semicolon outside quotes.
    bool quoted = false;
    size_t comma = value.size(), semicolon = std::string_view::npos;
    for (size_t i = 0; i < value.size(); i++) {
      if (value[i] == '"') {
        quoted = !quoted;
      } else if (!quoted && value[i] == ',') {
        comma = i;
        break;
      } else if (!quoted && value[i] == ';' && semicolon == std::string_view::npos) {
        semicolon = i;
      }
    }
    const std::string_view whole = value.substr(0, comma);
    value.remove_prefix(std::min(comma + 1, value.size()));

    const std::string_view directive = trim(whole.substr(0, semicolon));
    bool targeted = false;
    if (semicolon != std::string_view::npos) {
      const std::string_view target = trim(whole.substr(semicolon + 1));
      if (name.empty() || !same(target, name)) continue;
      targeted = true;
    }
    if (same(directive, "no-store")) {
      said->noStore = true;
      continue;
    }
    const size_t eq = directive.find('=');
    if (eq == std::string_view::npos) continue;
    const std::string_view key = directive.substr(0, eq);
    std::string_view arg = directive.substr(eq + 1);
    if (same(key, "max-age")) {
      arg = arg.substr(0, arg.find('+'));
      uint64_t n = 0;
      const auto [end, ec] = std::from_chars(arg.data(), arg.data() + arg.size(), n);
      if (arg.empty() || ec != std::errc() || end != arg.data() + arg.size() ||
          n > static_cast<uint64_t>(std::numeric_limits<time_t>::max())) {
        continue;
      }
      (targeted ? said->maxAgeTargeted : said->maxAge) = static_cast<long long>(n);
    } else if (same(key, "content")) {
      if (arg.starts_with('"')) arg.remove_prefix(1);
      if (arg.ends_with('"')) arg.remove_suffix(1);
      while (!arg.empty()) {
        const size_t space = arg.find(' ');
        if (same(arg.substr(0, space), "ESI/1.0")) said->esi = true;
        if (space == std::string_view::npos) break;
        arg.remove_prefix(space + 1);
      }
    }
  }
}

bool contains(std::string_view haystack, std::string_view needle) {
  return std::search(haystack.begin(), haystack.end(), needle.begin(), needle.end(),
                     [](char x, char y) { return lower(x) == lower(y); }) != haystack.end();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const size_t nameLen = std::min<size_t>(data[0], size - 1);
  const auto name = std::make_unique<unsigned char[]>(nameLen);
  if (nameLen) std::memcpy(name.get(), data + 1, nameLen);
  const std::string_view nameView(reinterpret_cast<char*>(name.get()), nameLen);
  const std::string_view input(reinterpret_cast<const char*>(data) + 1 + nameLen,
                               size - 1 - nameLen);

  esi_surrogate_t sc;
  esi_surrogate_init(&sc);
  Said said;
  for (size_t at = 0;;) {
    const size_t nl = input.find('\n', at);
    const std::string_view v =
        input.substr(at, nl == std::string_view::npos ? nl : nl - at);
    const auto copy = std::make_unique<unsigned char[]>(v.size());
    if (!v.empty()) std::memcpy(copy.get(), v.data(), v.size());
    esi_surrogate_parse(&sc, copy.get(), v.size(), name.get(), nameLen);
    reference(v, nameView, &said);

    FUZZ_CHECK(sc.max_age == said.maxAge);
    FUZZ_CHECK(sc.max_age_targeted == said.maxAgeTargeted);
    FUZZ_CHECK(static_cast<bool>(sc.esi) == said.esi);
    FUZZ_CHECK(static_cast<bool>(sc.no_store) == said.noStore);
    if (nl == std::string_view::npos) break;
    at = nl + 1;
  }

  // Nothing is said that the values do not spell out.
  FUZZ_CHECK(sc.max_age >= -1 && sc.max_age_targeted >= -1);
  if (sc.esi) FUZZ_CHECK(contains(input, "content=") && contains(input, "ESI/1.0"));
  if (sc.no_store) FUZZ_CHECK(contains(input, "no-store"));
  if (sc.max_age >= 0) FUZZ_CHECK(contains(input, "max-age="));
  if (sc.max_age_targeted >= 0) {
    FUZZ_CHECK(nameLen > 0 && contains(input, "max-age=") && contains(input, nameView));
  }
  return 0;
}
