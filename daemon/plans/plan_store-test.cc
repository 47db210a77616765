#include <gtest/gtest.h>

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "plans/plan_store.h"

namespace esi {
namespace {

// Steps written the short way, for comparing plans: V(offset,length),
// I(path), L(literal), C(offset,"bytes"), T+ T! T. (try start, except, end).
std::string describe(const PlanStep& step) {
  if (const auto* run = std::get_if<VerbatimRun>(&step)) {
    return "V(" + std::to_string(run->offset) + "," + std::to_string(run->length) + ")";
  }
  if (const auto* include = std::get_if<IncludeCall>(&step)) return "I(" + include->path + ")";
  if (const auto* literal = std::get_if<LiteralText>(&step)) return "L(" + literal->bytes + ")";
  if (const auto* mark = std::get_if<TryMark>(&step)) {
    return *mark == TryMark::START ? "T+" : *mark == TryMark::EXCEPT ? "T!" : "T.";
  }
  const auto& check = std::get<PlanCheck>(step);
  return "C(" + std::to_string(check.offset) + "," + check.bytes + ")";
}

const PageAddress kPage{"/dir/page.html", "example.com"};

std::vector<std::string> describe(const Plan& plan, const RequestValues& values = {}) {
  std::vector<std::string> out;
  for (const PlanStep& step : plan.evaluate(kPage, values)) out.push_back(describe(step));
  return out;
}

VerbatimRun V(uint64_t offset, uint32_t length) { return VerbatimRun{offset, length}; }
IncludeStep I(std::string path) {
  IncludeStep step;
  step.src = Template::compile(path);
  step.resolved = IncludeCall{std::move(path), "", "", "", false};
  return step;
}

ObjectId idOf(uint8_t first, uint64_t date = 1700000000) {
  ObjectId id;
  id.key[0] = first;
  id.date = date;
  id.length = 4096;
  id.headerSize = 512;
  return id;
}

// A plan of about `bytes` bytes of memory (one check of that many bytes).
Plan planOf(size_t bytes) {
  Plan plan;
  plan.checks.push_back(PlanCheck{0, std::string(bytes, 'x')});
  plan.checkBefore.push_back(0);
  plan.length = bytes;
  return plan;
}

size_t entryBytes(const Plan& plan) {
  Plan copy = plan;
  copy.program.shrink_to_fit();
  return copy.bytes() + sizeof(ObjectId);
}

// Checks the counters of a zone named in `expected`; the others may be anything.
void expectZone(const PlanStore& store, const std::string& zone,
                const nlohmann::json& expected) {
  const nlohmann::json actual = store.zones()[zone];
  for (const auto& [name, value] : expected.items()) EXPECT_EQ(actual[name], value) << name;
}

// --- buildPlan --------------------------------------------------------------

TEST(BuildPlan, CheckGoesAfterTheVerbatimRunBeforeTheIncludesOfItsGap) {
  std::string body(60, '.');
  body.replace(10, 40, std::string(20, 'a') + std::string(20, 'b'));
  const auto plan = buildPlan({V(0, 10), I("/one"), I("/two"), V(50, 5)}, body);
  ASSERT_TRUE(plan);
  EXPECT_EQ(describe(*plan),
            (std::vector<std::string>{"V(0,10)", "C(10," + body.substr(10, 40) + ")", "I(/one)",
                                      "I(/two)", "V(50,5)", "C(55,.....)"}));
  EXPECT_EQ(plan->length, 60u);
}

TEST(BuildPlan, BodyStartingAndEndingWithAConstructHasChecksAtBothEnds) {
  const std::string body = "<esi:include src=\"/a\"/>middle<esi:include src=\"/b\"/>";
  const auto plan = buildPlan({I("/a"), V(23, 6), I("/b")}, body);
  ASSERT_TRUE(plan);
  EXPECT_EQ(describe(*plan),
            (std::vector<std::string>{"C(0,<esi:include src=\"/a\"/>)", "I(/a)", "V(23,6)",
                                      "C(29,<esi:include src=\"/b\"/>)", "I(/b)"}));
}

TEST(BuildPlan, ConsecutiveIncludesShareOneCheck) {
  const std::string body = "ab<esi:include src=\"/1\"/><esi:include src=\"/2\"/>cd";
  const auto plan = buildPlan({V(0, 2), I("/1"), I("/2"), V(48, 2)}, body);
  ASSERT_TRUE(plan);
  EXPECT_EQ(describe(*plan),
            (std::vector<std::string>{"V(0,2)", "C(2," + body.substr(2, 46) + ")", "I(/1)",
                                      "I(/2)", "V(48,2)"}));
}

TEST(BuildPlan, CheckOfALongConstructHoldsOnlyItsFirstBytes) {
  const std::string construct = "<esi:include src=\"/" + std::string(300, 'p') + "\"/>";
  const std::string body = "head" + construct + "tail";
  const auto plan = buildPlan({V(0, 4), I("/p"), V(4 + construct.size(), 4)}, body);
  ASSERT_TRUE(plan);
  const std::vector<PlanStep> steps = plan->evaluate(kPage, {});
  ASSERT_EQ(steps.size(), 4u);
  const auto& check = std::get<PlanCheck>(steps[1]);
  EXPECT_EQ(check.offset, 4u);
  EXPECT_EQ(check.bytes.size(), PlanCheck::kMaxBytes);
  EXPECT_EQ(check.bytes, construct.substr(0, PlanCheck::kMaxBytes));
}

TEST(BuildPlan, GapWithoutIncludeStillGetsACheck) {
  const std::string body = "a<esi:remove>x</esi:remove>b";
  const auto plan = buildPlan({V(0, 1), V(27, 1)}, body);
  ASSERT_TRUE(plan);
  EXPECT_EQ(describe(*plan), (std::vector<std::string>{"V(0,1)", "C(1,<esi:remove>x</esi:remove>)",
                                                       "V(27,1)"}));
}

TEST(BuildPlan, AdjacentVerbatimRunsGetNoCheckAndGoOutAsOne) {
  const auto plan = buildPlan({V(0, 3), V(3, 3)}, "abcdef");
  ASSERT_TRUE(plan);
  EXPECT_EQ(describe(*plan), (std::vector<std::string>{"V(0,6)"}));
}

TEST(BuildPlan, BodyWithoutConstructsIsOneVerbatimStep) {
  const auto plan = buildPlan({V(0, 5)}, "plain");
  ASSERT_TRUE(plan);
  EXPECT_EQ(describe(*plan), (std::vector<std::string>{"V(0,5)"}));
  EXPECT_EQ(plan->length, 5u);
}

TEST(BuildPlan, EmptyBodyHasNoSteps) {
  const auto plan = buildPlan({}, "");
  ASSERT_TRUE(plan);
  EXPECT_TRUE(plan->program.empty());
  EXPECT_EQ(plan->length, 0u);
}

TEST(BuildPlan, InstructionsThatDoNotFitTheBodyGiveNoPlan) {
  EXPECT_FALSE(buildPlan({V(0, 7)}, "short"));                       // past the end
  EXPECT_FALSE(buildPlan({V(9, 1)}, "short"));                       // starts past it
  EXPECT_FALSE(buildPlan({V(2, 2), V(0, 2)}, "short"));              // backwards
  EXPECT_FALSE(buildPlan({V(0, 3), I("/x"), V(2, 3)}, "short"));     // overlapping
  EXPECT_FALSE(buildPlan({V(1, UINT32_MAX)}, "short"));              // length overflows
  EXPECT_FALSE(buildPlan({V(UINT64_MAX, 2)}, "short"));              // offset overflows
}

TEST(BuildPlan, IncludeInAnEmptyBodyHasNoCheck) {
  // Nothing to compare the construct with; the plan still says what to do.
  std::optional<Plan> plan = buildPlan({I("/x")}, "");
  ASSERT_TRUE(plan);
  EXPECT_EQ(describe(*plan), (std::vector<std::string>{"I(/x)"}));
}

// --- ObjectId -----------------------------------------------------------------

TEST(PlanObjectId, WireBytesAreKeyThenLittleEndianNumbers) {
  std::string wire(40, '\0');
  for (int i = 0; i < 16; ++i) wire[i] = static_cast<char>(0xa0 + i);
  wire[16] = 0x01;
  wire[17] = 0x02;  // date 0x0201
  wire[24 + 7] = static_cast<char>(0x80);  // length 2^63
  wire[32] = static_cast<char>(0xff);  // header size 255
  const auto id = ObjectId::fromWire(wire);
  ASSERT_TRUE(id);
  EXPECT_EQ(id->key[0], 0xa0);
  EXPECT_EQ(id->key[15], 0xaf);
  EXPECT_EQ(id->date, 0x0201u);
  EXPECT_EQ(id->length, uint64_t{1} << 63);
  EXPECT_EQ(id->headerSize, 255u);
}

TEST(PlanObjectId, WireBytesOfAnyOtherSizeAreRefused) {
  EXPECT_FALSE(ObjectId::fromWire(""));
  EXPECT_FALSE(ObjectId::fromWire(std::string(39, '\0')));
  EXPECT_FALSE(ObjectId::fromWire(std::string(41, '\0')));
  EXPECT_FALSE(ObjectId::fromWire(std::string(16, '\0')));
}

TEST(PlanObjectId, IdsDifferingOnlyInDateAreDifferentObjects) {
  EXPECT_NE(idOf(1, 100), idOf(1, 101));
  EXPECT_EQ(idOf(1, 100), idOf(1, 100));
  EXPECT_EQ(ObjectIdHash{}(idOf(1, 100)), ObjectIdHash{}(idOf(1, 100)));
}

// --- PlanStore ----------------------------------------------------------------

TEST(PlanStore, FindCountsMissesThenHits) {
  PlanStore store;
  store.configureZone("pages", 1 << 20);
  EXPECT_EQ(store.find("pages", idOf(1)), nullptr);
  ASSERT_TRUE(store.record("pages", idOf(1), planOf(10)));
  const auto plan = store.find("pages", idOf(1));
  ASSERT_NE(plan, nullptr);
  EXPECT_EQ(plan->length, 10u);
  store.find("pages", idOf(1));

  expectZone(store, "pages",
             {{"hits", 2}, {"misses", 1}, {"recorded", 1}, {"entries", 1},
              {"bytes", entryBytes(planOf(10))}, {"max_bytes", 1 << 20}});
  const nlohmann::json entries = store.entries("pages", 10);
  ASSERT_EQ(entries.size(), 1u);
  EXPECT_EQ(entries[0]["key"], "01000000000000000000000000000000");
  EXPECT_EQ(entries[0]["date"], 1700000000);
  EXPECT_EQ(entries[0]["length"], 4096);
  EXPECT_EQ(entries[0]["header_size"], 512);
  EXPECT_EQ(entries[0]["steps"], 1);
  EXPECT_EQ(entries[0]["hits"], 2);
}

TEST(PlanStore, LeastRecentlyUsedPlansMakeRoom) {
  PlanStore store;
  const size_t one = entryBytes(planOf(100));
  store.configureZone("pages", 3 * one);
  ASSERT_TRUE(store.record("pages", idOf(1), planOf(100)));
  ASSERT_TRUE(store.record("pages", idOf(2), planOf(100)));
  ASSERT_TRUE(store.record("pages", idOf(3), planOf(100)));
  ASSERT_NE(store.find("pages", idOf(1)), nullptr);  // 2 is now the oldest
  ASSERT_TRUE(store.record("pages", idOf(4), planOf(100)));

  EXPECT_EQ(store.find("pages", idOf(2)), nullptr);
  EXPECT_NE(store.find("pages", idOf(1)), nullptr);
  EXPECT_NE(store.find("pages", idOf(3)), nullptr);
  EXPECT_NE(store.find("pages", idOf(4)), nullptr);
  expectZone(store, "pages", {{"evictions", 1}, {"entries", 3}, {"bytes", 3 * one}});

  // Most recently used first.
  const nlohmann::json entries = store.entries("pages", 2);
  ASSERT_EQ(entries.size(), 2u);
  EXPECT_EQ(entries[0]["key"], "04000000000000000000000000000000");
  EXPECT_EQ(entries[1]["key"], "03000000000000000000000000000000");
}

TEST(PlanStore, PlanLargerThanTheBudgetIsNotRecorded) {
  PlanStore store;
  store.configureZone("pages", entryBytes(planOf(100)));
  ASSERT_TRUE(store.record("pages", idOf(1), planOf(100)));
  EXPECT_FALSE(store.record("pages", idOf(2), planOf(101)));
  EXPECT_FALSE(store.record("pages", idOf(1), planOf(1000)));  // nor replaces one

  const auto kept = store.find("pages", idOf(1));
  ASSERT_NE(kept, nullptr);
  EXPECT_EQ(kept->length, 100u);
  expectZone(store, "pages",
             {{"too_large", 2}, {"recorded", 1}, {"evictions", 0}, {"entries", 1}});
}

TEST(PlanStore, DroppedPlanIsForgotten) {
  PlanStore store;
  store.configureZone("pages", 1 << 20);
  ASSERT_TRUE(store.record("pages", idOf(1), planOf(10)));
  store.drop("pages", idOf(1));
  store.drop("pages", idOf(1));  // nothing left: not counted again
  store.drop("nowhere", idOf(1));

  EXPECT_EQ(store.find("pages", idOf(1)), nullptr);
  expectZone(store, "pages", {{"drops", 1}, {"entries", 0}, {"bytes", 0}});
}

TEST(PlanStore, RecordingAnIdAgainReplacesItsPlan) {
  PlanStore store;
  store.configureZone("pages", 1 << 20);
  ASSERT_TRUE(store.record("pages", idOf(1), planOf(10)));
  const auto old = store.find("pages", idOf(1));
  ASSERT_TRUE(store.record("pages", idOf(1), planOf(500)));

  const auto now = store.find("pages", idOf(1));
  ASSERT_NE(now, nullptr);
  EXPECT_EQ(now->length, 500u);
  EXPECT_EQ(old->length, 10u);  // a worker replaying the old one still may
  expectZone(store, "pages",
             {{"entries", 1}, {"bytes", entryBytes(planOf(500))}, {"recorded", 2}});
  EXPECT_EQ(store.entries("pages", 10)[0]["hits"], 1);
}

TEST(PlanStore, ShrinkingTheBudgetEvictsTheOldestPlans) {
  PlanStore store;
  const size_t one = entryBytes(planOf(100));
  store.configureZone("pages", 1 << 20);
  for (uint8_t i = 1; i <= 4; ++i) ASSERT_TRUE(store.record("pages", idOf(i), planOf(100)));
  store.configureZone("pages", 2 * one);

  EXPECT_EQ(store.find("pages", idOf(1)), nullptr);
  EXPECT_EQ(store.find("pages", idOf(2)), nullptr);
  EXPECT_NE(store.find("pages", idOf(3)), nullptr);
  EXPECT_NE(store.find("pages", idOf(4)), nullptr);
  expectZone(store, "pages", {{"evictions", 2}, {"max_bytes", 2 * one}, {"bytes", 2 * one}});
}

TEST(PlanStore, UnknownZoneRecordsNothingAndFindsNothing) {
  PlanStore store;
  EXPECT_FALSE(store.record("nowhere", idOf(1), planOf(10)));
  EXPECT_EQ(store.find("nowhere", idOf(1)), nullptr);
  EXPECT_TRUE(store.entries("nowhere", 10).is_null());
  EXPECT_TRUE(store.zones().empty());
  EXPECT_TRUE(store.zones().is_object());
}

TEST(PlanStore, SameIdInTwoZonesIsTwoEntries) {
  PlanStore store;
  store.configureZone("a", 1 << 20);
  store.configureZone("b", 1 << 20);
  ASSERT_TRUE(store.record("a", idOf(1), planOf(10)));
  ASSERT_TRUE(store.record("b", idOf(1), planOf(20)));
  store.drop("a", idOf(1));

  EXPECT_EQ(store.find("a", idOf(1)), nullptr);
  const auto b = store.find("b", idOf(1));
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(b->length, 20u);
}

TEST(PlanStore, PlanBytesGrowWithItsStrings) {
  Plan small = *buildPlan({V(0, 2), I("/a"), V(25, 2)}, "ab<esi:include src=\"/a\"/>cd");
  Plan large = small;
  std::get<IncludeStep>(large.program[1]).resolved->path = "/" + std::string(1000, 'p');
  EXPECT_GE(large.bytes(), small.bytes() + 1000);
  EXPECT_GE(small.bytes(), sizeof(ProgramStep) * small.program.size());
}

}  // namespace
}  // namespace esi
