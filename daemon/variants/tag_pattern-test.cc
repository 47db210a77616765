#include <gtest/gtest.h>
#include <uv.h>

#include <cstdlib>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "variants/purger.h"
#include "variants/tag_pattern.h"
#include "variants/zone_index.h"
#include "variants/zone_scan.h"

namespace esi {
namespace {

std::unique_ptr<TagPattern> compiled(const std::string& pattern) {
  std::string why;
  auto out = TagPattern::compile(pattern, &why);
  EXPECT_NE(out, nullptr) << pattern << ": " << why;
  return out;
}

bool matches(const std::string& pattern, const std::vector<std::string>& tags) {
  std::string scratch;
  return compiled(pattern)->matches(tags, scratch);
}

std::string refusal(const std::string& pattern) {
  std::string why;
  EXPECT_EQ(TagPattern::compile(pattern, &why), nullptr) << pattern;
  return why;
}

TEST(TagPattern, MagentosShapeFindsAWholeTagAnywhereInTheList) {
  const std::string magento = "((^|,)cat_p_42(,|$))|((^|,)cat_c_7(,|$))";
  EXPECT_TRUE(matches(magento, {"store", "cat_p_42"}));
  EXPECT_TRUE(matches(magento, {"cat_c_7", "store"}));
  EXPECT_FALSE(matches(magento, {"store", "cat_p_421", "xcat_c_7"}));
}

TEST(TagPattern, TheSearchIsUnanchoredAndCaretIsTheListsStart) {
  EXPECT_TRUE(matches("cat_p_4[0-9]", {"store", "cat_p_41"}));
  EXPECT_TRUE(matches("^cat_p_4[0-9]", {"cat_p_41", "store"}));
  EXPECT_FALSE(matches("^cat_p_4[0-9]", {"store", "cat_p_41"}));
  EXPECT_TRUE(matches("(^|,)cat_(p|c)_42(,|$)", {"a", "cat_c_42", "b"}));
  EXPECT_FALSE(matches("(^|,)cat_(p|c)_42(,|$)", {"a", "cat_x_42", "cat_c_420"}));
}

TEST(TagPattern, APatternMaySpanTagsAsInTheJoinedHeader) {
  EXPECT_TRUE(matches("store,cms", {"store", "cms_p_1"}));
  EXPECT_FALSE(matches("store,cms", {"cms_p_1", "store"}));
}

TEST(TagPattern, AnObjectWithoutTagsMatchesOnlyWhatMatchesNothing) {
  EXPECT_FALSE(matches("cat", {}));
  EXPECT_TRUE(matches("^$", {}));
  EXPECT_TRUE(matches(".*", {}));
}

TEST(TagPattern, BytesAreMatchedOneByOne) {
  EXPECT_TRUE(matches("^caf.$", {"caf\xe9"}));
  EXPECT_TRUE(matches("\xe9", {"caf\xe9"}));
}

TEST(TagPattern, CatastrophicBacktrackingPatternsRunLinearly) {
  // (a+)+$ against a long run of a's that ends in a mismatch takes a
  // backtracking engine 2^n steps; RE2 answers at once.
  const std::string as(100000, 'a');
  EXPECT_FALSE(matches("^(a+)+b$", {as}));
  EXPECT_TRUE(matches("(a+)+$", {as}));
  EXPECT_FALSE(matches("(x+x+)+y", {std::string(50000, 'x')}));
}

TEST(TagPattern, MalformedAndUnsupportedPatternsAreRefusedWithAReason) {
  EXPECT_NE(refusal("((a").find("missing )"), std::string::npos) << refusal("((a");
  EXPECT_NE(refusal("a**").find("bad pattern"), std::string::npos);
  EXPECT_NE(refusal("(a)\\1").find("bad pattern"), std::string::npos);  // backreference
  EXPECT_NE(refusal("(?=a)").find("bad pattern"), std::string::npos);   // lookahead
  EXPECT_EQ(refusal(""), "empty pattern");
}

TEST(TagPattern, APatternOver64KiBIsRefusedAndOneAtTheLimitIsTaken) {
  EXPECT_EQ(refusal(std::string(TagPattern::kMaxBytes + 1, 'a')), "pattern over 64 KiB");
  std::string scratch;
  auto atLimit = compiled("cms|" + std::string(TagPattern::kMaxBytes - 4, 'z'));
  ASSERT_NE(atLimit, nullptr);
  EXPECT_TRUE(atLimit->matches({"store", "cms_p_1"}, scratch));
  EXPECT_FALSE(atLimit->matches({"store", "zz"}, scratch));
}

TEST(TagPattern, ARefusalMessageIsBounded) {
  EXPECT_LE(refusal(std::string(60000, '(')).size(), 220U);
}

StoredFile file(const std::string& key, std::vector<std::string> tags, uint8_t variant = 0) {
  StoredFile f;
  f.key = key;
  f.main = md5Of(key);
  f.file = f.main;
  f.file[0] ^= variant;
  f.tags = std::move(tags);
  return f;
}

TEST(ZoneIndexPattern, KeysWhereSeesEachKeysTagsInStoredOrder) {
  ZoneIndex index(1 << 20);
  index.beginScan();
  index.finishScan({file("/a", {"store", "cat_p_41"}), file("/b", {"cat_p_41", "store"}),
                    file("/c", {})},
                   true);
  ASSERT_TRUE(index.sure());
  std::string scratch;
  auto pattern = compiled("^cat_p_4");
  auto keys = index.keysWhere(
      [&](const std::vector<std::string>& tags) { return pattern->matches(tags, scratch); });
  ASSERT_TRUE(keys);
  EXPECT_EQ(*keys, std::vector<Md5>{md5Of("/b")});
}

TEST(ZoneIndexPattern, KeysWhereIsUnsureWhileTheIndexIs) {
  ZoneIndex index(1 << 20);
  EXPECT_FALSE(index.keysWhere([](const std::vector<std::string>&) { return true; }));
  index.beginScan();
  index.finishScan({file("/a", {"t"})}, true);
  index.doubtAll();
  EXPECT_FALSE(index.sure());
  EXPECT_FALSE(index.keysWhere([](const std::vector<std::string>&) { return true; }));
}

TEST(ZoneIndexPattern, TenThousandTagsOnOneObjectAreKeptAndSearched) {
  ZoneIndex index(64 << 20);
  std::vector<std::string> tags;
  for (int i = 0; i < 10000; ++i) tags.push_back("t" + std::to_string(i));
  index.beginScan();
  index.finishScan({file("/many", tags), file("/few", {"t1"})}, true);
  std::string scratch;
  auto pattern = compiled("(^|,)t999[0-9](,|$)");
  auto keys = index.keysWhere(
      [&](const std::vector<std::string>& t) { return pattern->matches(t, scratch); });
  ASSERT_TRUE(keys);
  EXPECT_EQ(*keys, std::vector<Md5>{md5Of("/many")});
  EXPECT_EQ(index.keysWithTag("t9999"), std::vector<Md5>{md5Of("/many")});
}

// A zone whose scan found nothing: its index is complete and holds what
// the test reports.
class PatternPurge : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_EQ(uv_loop_init(&loop_), 0);
    char tmpl[] = "/tmp/esi-pattern-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    purger_.emplace(&loop_);
    purger_->announce("z", dir_, 1 << 20, false);
    uv_run(&loop_, UV_RUN_DEFAULT);
  }
  void TearDown() override {
    purger_.reset();
    uv_run(&loop_, UV_RUN_DEFAULT);
    uv_loop_close(&loop_);
    std::filesystem::remove_all(dir_);
  }
  // Asks; the answer must not come before the loop runs the pool's result.
  void ask(const std::string& pattern) {
    answer_.reset();
    purger_->purge(PurgeQuery{PurgeQuery::Kind::kTagPattern, "z", pattern},
                   [this](PurgeOutcome outcome) { answer_ = std::move(outcome); });
    EXPECT_FALSE(answer_) << "answered on the loop";
  }

  uv_loop_t loop_;
  std::string dir_;
  std::optional<Purger> purger_;
  std::optional<PurgeOutcome> answer_;
};

TEST_F(PatternPurge, ReportsDuringTheMatchWaitAndLandAfterThePurge) {
  purger_->stored("z", file("/a", {"cat_p_41"}));
  purger_->stored("z", file("/b", {"store"}));
  ask("^cat_p_4");
  EXPECT_TRUE(purger_->zones()["z"]["matching"].get<bool>());  // esictl zones says so
  // a new variant of /a, stored while the pool reads the index
  const StoredFile later = file("/a", {"cat_p_41"}, 1);
  purger_->stored("z", later);
  uv_run(&loop_, UV_RUN_DEFAULT);
  ASSERT_TRUE(answer_);
  EXPECT_FALSE(purger_->zones()["z"]["matching"].get<bool>());
  EXPECT_EQ(answer_->files, std::vector<Md5>{md5Of("/a")});
  EXPECT_FALSE(answer_->scanned);
  EXPECT_TRUE(answer_->error.empty());
  // the purge forgot /a's files, then the held report added the new one
  const nlohmann::json a = purger_->variants("z", "/a");
  EXPECT_TRUE(a["known"].get<bool>());
  EXPECT_EQ(a["files"], nlohmann::json::array({md5ToHex(later.file)}));
  EXPECT_EQ(purger_->variants("z", "/b")["files"].size(), 1U);
}

TEST_F(PatternPurge, AMalformedPatternIsInvalidAndForgetsNothing) {
  purger_->stored("z", file("/a", {"cat_p_41"}));
  ask("((a");
  uv_run(&loop_, UV_RUN_DEFAULT);
  ASSERT_TRUE(answer_);
  EXPECT_TRUE(answer_->invalid);
  EXPECT_NE(answer_->error.find("missing )"), std::string::npos) << answer_->error;
  EXPECT_TRUE(answer_->files.empty());
  EXPECT_EQ(purger_->variants("z", "/a")["files"].size(), 1U);
}

TEST_F(PatternPurge, ASoftPurgeKeepsItsMatchesInTheIndex) {
  purger_->stored("z", file("/a", {"cat_p_41"}));
  answer_.reset();
  purger_->purge(PurgeQuery{PurgeQuery::Kind::kTagPattern, "z", "cat", true},
                 [this](PurgeOutcome outcome) { answer_ = std::move(outcome); });
  uv_run(&loop_, UV_RUN_DEFAULT);
  ASSERT_TRUE(answer_);
  EXPECT_EQ(answer_->files.size(), 1U);
  EXPECT_EQ(purger_->variants("z", "/a")["files"].size(), 1U);
}

TEST_F(PatternPurge, OtherPurgesOfTheZoneWaitForTheMatch) {
  purger_->stored("z", file("/a", {"cat_p_41"}));
  purger_->stored("z", file("/b", {"store"}));
  ask("^cat");
  std::optional<PurgeOutcome> tag;
  purger_->purge(PurgeQuery{PurgeQuery::Kind::kTag, "z", "store"},
                 [&](PurgeOutcome outcome) { tag = std::move(outcome); });
  EXPECT_FALSE(tag);
  uv_run(&loop_, UV_RUN_DEFAULT);
  ASSERT_TRUE(answer_);
  ASSERT_TRUE(tag);
  EXPECT_EQ(tag->files, std::vector<Md5>{md5Of("/b")});
}

}  // namespace
}  // namespace esi
