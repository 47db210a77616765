// The connector's joiner of an upstream's tag headers
// (nginx-connector/esi_tags.c, as ngx_http_esi_purge_index.c calls it):
// every tag header's value appended to one space-separated list, in a
// buffer the first pass sized at each value's length plus one, then cut to
// the whole tags that fit esid's limit.  The joiner never writes past that
// buffer (ASan: exactly its size) nor reads past a value (each a copy of
// exactly its size); the list is the values' tags, as a reference split
// finds them, joined by single spaces; the cut keeps the longest run of
// whole tags that fits.
//
// Input: byte 0, the limit of the cut (0 to 255 bytes, instead of 64 KiB);
// then the header values, separated by "\n" (which no header value holds).

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "esi_tags.h"
#include "fuzz_check.h"

namespace {

constexpr std::string_view kSeparators(" \t,");

void referenceSplit(std::string_view value, std::vector<std::string_view>* tags) {
  size_t at = 0;
  while ((at = value.find_first_not_of(kSeparators, at)) != std::string_view::npos) {
    const size_t end = std::min(value.find_first_of(kSeparators, at), value.size());
    tags->push_back(value.substr(at, end - at));
    at = end;
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const size_t max = data[0];
  const std::string_view input(reinterpret_cast<const char*>(data) + 1, size - 1);

  std::vector<std::string_view> values;
  for (size_t at = 0;;) {
    const size_t nl = input.find('\n', at);
    values.push_back(input.substr(at, nl == std::string_view::npos ? nl : nl - at));
    if (nl == std::string_view::npos) break;
    at = nl + 1;
  }

  // The first pass: each value's length and one.
  size_t room = 0;
  for (const std::string_view v : values) room += v.size() + 1;
  const auto tags = std::make_unique<unsigned char[]>(room);

  size_t len = 0;
  std::vector<std::string_view> expected;
  for (const std::string_view v : values) {
    const auto copy = std::make_unique<unsigned char[]>(v.size());
    if (!v.empty()) std::memcpy(copy.get(), v.data(), v.size());
    const size_t before = len;
    len = esi_tags_join(tags.get(), len, copy.get(), v.size());
    FUZZ_CHECK(len >= before && len <= before + v.size() + 1);
    // Each value's tags end with a space: the next value's start apart.
    FUZZ_CHECK(len == 0 || tags[len - 1] == ' ');
    referenceSplit(v, &expected);
  }
  if (len) len--;  // the last space, as the module drops it

  std::string reference;
  for (const std::string_view t : expected) {
    if (!reference.empty()) reference += ' ';
    reference.append(t);
  }
  const std::string_view joined(reinterpret_cast<char*>(tags.get()), len);
  FUZZ_CHECK(joined == reference);

  // The cut: whole tags only, as many as fit.
  const size_t fit = esi_tags_fit(tags.get(), len, max);
  size_t longest = 0;
  size_t sum = 0;
  for (const std::string_view t : expected) {
    sum += (sum ? 1 : 0) + t.size();
    if (sum > max) break;
    longest = sum;
  }
  FUZZ_CHECK(fit == longest);
  FUZZ_CHECK(fit <= max || fit == len);
  FUZZ_CHECK(fit == len || (fit < len && (fit == 0 || joined[fit] == ' ')));
  return 0;
}
