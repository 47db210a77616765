// A pattern purge's regular expression, as Magento's VCL bans with it:
// `obj.http.X-Magento-Tags ~ pattern`, an unanchored search of an object's
// tags joined with commas.  RE2 runs in time linear in the text whatever
// the pattern, so no pattern can stall the thread that evaluates it; RE2
// refuses what it cannot run that way (backreferences, lookaround) and
// what would take more than its memory budget to compile.

#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace re2 {
class RE2;
}

namespace esi {

class TagPattern {
 public:
  // Longer patterns are refused before RE2 sees them, like every purge
  // value esid takes.
  static constexpr size_t kMaxBytes = size_t{64} * 1024;

  // nullptr with *why when the pattern is empty, too long or not one RE2
  // takes.  Bytes are matched as Latin-1, as PCRE does without UTF mode:
  // a tag is bytes, whatever encoding its header used.
  static std::unique_ptr<TagPattern> compile(std::string_view pattern, std::string* why);

  ~TagPattern();
  TagPattern(const TagPattern&) = delete;
  TagPattern& operator=(const TagPattern&) = delete;

  // Whether the pattern finds a match anywhere in tags joined with ",".
  // scratch holds the joined text between calls (one per thread).
  bool matches(const std::vector<std::string>& tags, std::string& scratch) const;

 private:
  explicit TagPattern(std::unique_ptr<re2::RE2> re);

  std::unique_ptr<re2::RE2> re_;
};

}  // namespace esi
