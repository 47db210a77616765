#include "variants/tag_pattern.h"

#include <re2/re2.h>

namespace esi {

std::unique_ptr<TagPattern> TagPattern::compile(std::string_view pattern, std::string* why) {
  if (pattern.empty()) {
    *why = "empty pattern";
    return nullptr;
  }
  if (pattern.size() > kMaxBytes) {
    *why = "pattern over 64 KiB";
    return nullptr;
  }
  RE2::Options options;
  options.set_encoding(RE2::Options::EncodingLatin1);
  options.set_log_errors(false);
  auto re = std::make_unique<re2::RE2>(re2::StringPiece(pattern.data(), pattern.size()), options);
  if (!re->ok()) {
    *why = "bad pattern: " + re->error().substr(0, 200);
    return nullptr;
  }
  return std::unique_ptr<TagPattern>(new TagPattern(std::move(re)));
}

TagPattern::TagPattern(std::unique_ptr<re2::RE2> re) : re_(std::move(re)) {}

TagPattern::~TagPattern() = default;

bool TagPattern::matches(const std::vector<std::string>& tags, std::string& scratch) const {
  scratch.clear();
  for (size_t i = 0; i < tags.size(); ++i) {
    if (i > 0) scratch += ',';
    scratch += tags[i];
  }
  return RE2::PartialMatch(scratch, *re_);
}

}  // namespace esi
