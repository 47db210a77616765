// The connector's readers of a purge request's tag headers
// (nginx-connector/esi_tags.c, as ngx_http_esi_purge.c calls them) on any
// header value: the splitter of Surrogate-Key, xkey, Cache-Tags... into
// tags, and the reader of X-Magento-Tags-Pattern's "((^|,)TAG(,|$))|..."
// shape.  Each reads only the value (ASan: a copy of exactly its size) and
// agrees with a reference written another way: splitting with
// find_first_of, and the pattern cut at the strings between its tags.
//
// Input: one header value, read both ways.

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
constexpr std::string_view kOpen = "((^|,)";
constexpr std::string_view kClose = "(,|$))";
// What a regular expression reads as more than itself, and NUL.
constexpr std::string_view kSpecial("().*+?[]{}|\\^$\0", 16);

std::vector<std::string_view> referenceSplit(std::string_view value) {
  std::vector<std::string_view> tags;
  size_t at = 0;
  while ((at = value.find_first_not_of(kSeparators, at)) != std::string_view::npos) {
    const size_t end = std::min(value.find_first_of(kSeparators, at), value.size());
    tags.push_back(value.substr(at, end - at));
    at = end;
  }
  return tags;
}

// Magento's shape: kOpen, the tags joined by kClose + "|" + kOpen, kClose;
// no tag empty or holding a special byte.  false if not that shape.
bool referenceMagento(std::string_view pattern, std::vector<std::string_view>* tags) {
  const std::string between = std::string(kClose) + "|" + std::string(kOpen);
  if (pattern.size() < kOpen.size() + kClose.size() || !pattern.starts_with(kOpen) ||
      !pattern.ends_with(kClose)) {
    return false;
  }
  std::string_view middle =
      pattern.substr(kOpen.size(), pattern.size() - kOpen.size() - kClose.size());
  for (;;) {
    const size_t cut = middle.find(between);
    const std::string_view tag = middle.substr(0, cut);
    if (tag.empty() || tag.find_first_of(kSpecial) != std::string_view::npos) return false;
    tags->push_back(tag);
    if (cut == std::string_view::npos) return true;
    middle.remove_prefix(cut + between.size());
  }
}

// A walk over the value, tag by tag.
struct Walk {
  Walk(unsigned char* s, size_t size) : start(s), end(s + size), pos(s) {}
  std::string_view value() const {
    return {reinterpret_cast<char*>(start), static_cast<size_t>(end - start)};
  }
  std::string_view tag() const { return {reinterpret_cast<char*>(at), len}; }

  unsigned char* const start;
  unsigned char* const end;
  unsigned char* pos;
  unsigned char* at = nullptr;  // the tag found
  size_t len = 0;
  std::vector<std::string_view> tags;
};

void checkSplit(unsigned char* start, size_t size) {
  Walk w(start, size);
  unsigned char* const end = w.end;
  unsigned char*& pos = w.pos;
  std::vector<std::string_view>& tags = w.tags;
  for (;;) {
    unsigned char* const before = pos;
    const int rc = esi_tags_next(&pos, end, &w.at, &w.len);
    FUZZ_CHECK(rc == 0 || rc == 1);
    FUZZ_CHECK(pos >= before && pos <= end);
    if (rc == 0) {
      // Only separators were left.
      for (unsigned char* p = before; p < end; p++) FUZZ_CHECK(esi_tags_separator(*p));
      FUZZ_CHECK(pos == end);
      break;
    }
    FUZZ_CHECK(w.at >= before && w.len > 0 && w.at + w.len == pos);
    for (unsigned char* p = before; p < w.at; p++) FUZZ_CHECK(esi_tags_separator(*p));
    const std::string_view t = w.tag();
    FUZZ_CHECK(t.find_first_of(kSeparators) == std::string_view::npos);
    FUZZ_CHECK(pos == end || esi_tags_separator(*pos));
    tags.push_back(t);
  }
  FUZZ_CHECK(tags == referenceSplit(w.value()));

  // What a purge names is what an upstream's header of the same value
  // indexes: the joiner gives the same tags, space separated.
  const size_t room = size + 1;
  const auto joined = std::make_unique<unsigned char[]>(room);
  const size_t n = esi_tags_join(joined.get(), 0, start, size);
  FUZZ_CHECK(n <= room);
  std::string expected;
  for (const std::string_view t : tags) expected.append(t).push_back(' ');
  FUZZ_CHECK(std::string_view(reinterpret_cast<char*>(joined.get()), n) == expected);
}

void checkMagento(unsigned char* start, size_t size) {
  Walk w(start, size);
  const std::string_view pattern = w.value();
  std::vector<std::string_view>& tags = w.tags;
  int rc;
  while ((rc = esi_tags_magento_next(start, w.end, &w.pos, &w.at, &w.len)) == 1) {
    FUZZ_CHECK(w.at > start && w.len > 0 && w.at + w.len <= w.end && w.pos <= w.end);
    const std::string_view t = w.tag();
    FUZZ_CHECK(t.find_first_of(kSpecial) == std::string_view::npos);
    tags.push_back(t);
  }
  FUZZ_CHECK(rc == 0 || rc == -1);
  // Each tag took its own 13 bytes at least, and a "|" between.
  FUZZ_CHECK(14 * tags.size() <= size + 1);

  std::vector<std::string_view> expected;
  const bool magento = referenceMagento(pattern, &expected);
  FUZZ_CHECK((rc == 0) == magento);
  if (rc != 0) return;
  FUZZ_CHECK(tags == expected);

  // And the tags give the pattern back, as Magento builds it.
  std::string rebuilt;
  for (const std::string_view t : tags) {
    if (!rebuilt.empty()) rebuilt += '|';
    rebuilt.append(kOpen).append(t).append(kClose);
  }
  FUZZ_CHECK(rebuilt == pattern);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto copy = std::make_unique<unsigned char[]>(size);
  if (size != 0) std::memcpy(copy.get(), data, size);
  checkSplit(copy.get(), size);
  checkMagento(copy.get(), size);
  return 0;
}
