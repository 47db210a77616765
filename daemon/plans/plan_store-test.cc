#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/stream.h"
#include "plans/plan_store.h"

namespace esi {
namespace {

// A step of an evaluation, owned (proto/esi.capnp PlanStep).
using PlanStep = std::variant<VerbatimRun, IncludeCall, LiteralText, TryMark, PlanCheck>;

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

std::vector<PlanStep> evaluate(const Plan& plan, const RequestValues& values) {
  PlanEvaluation evaluation;
  plan.evaluate(kPage, values, evaluation);
  std::vector<PlanStep> steps;
  evaluation.forEach([&](const auto& step) { steps.emplace_back(step); });
  return steps;
}

std::vector<std::string> describe(const Plan& plan, const RequestValues& values = {}) {
  std::vector<std::string> out;
  for (const PlanStep& step : evaluate(plan, values)) out.push_back(describe(step));
  return out;
}

VerbatimRun V(uint64_t offset, uint32_t length) { return VerbatimRun{offset, length}; }
IncludeStep I(std::string path) {
  IncludeStep step;
  step.src = Template::compile(path);
  step.resolved = IncludeCall{std::move(path), "", "", "", false};
  return step;
}

// One store of cache file `first`: another store of it gets another
// modification time.
ObjectId idOf(uint8_t first, uint64_t modified = 1700000000'000000001) {
  ObjectId id;
  id.key[0] = first;
  id.length = 4096;
  id.headerSize = 512;
  id.inode = 77;
  id.modified = modified;
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

size_t entryBytes(Plan plan) {
  plan.program.shrink_to_fit();
  return plan.bytes() + sizeof(ObjectId);
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
  const std::vector<PlanStep> steps = evaluate(*plan, {});
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

// --- Plans of pages with variables and constructs -----------------------------

// Why the worker would refuse these steps (ngx_http_esi_plan's rules: runs
// ascend within the body, and every byte skipped, every include and every
// outermost try follows a check at the current position), or "".
std::string workerRefuses(const std::vector<PlanStep>& steps, uint64_t length) {
  uint64_t pos = 0;
  bool checked = false;  // a check at pos since the last run
  int tries = 0;
  for (const PlanStep& step : steps) {
    if (const auto* run = std::get_if<VerbatimRun>(&step)) {
      if (run->offset < pos || (run->offset > pos && !checked) || run->offset > length ||
          run->length > length - run->offset) {
        return "run " + describe(step) + " at " + std::to_string(pos);
      }
      pos = run->offset + run->length;
      checked = false;
    } else if (const auto* check = std::get_if<PlanCheck>(&step)) {
      if (check->offset != pos || check->bytes.empty() ||
          check->bytes.size() > PlanCheck::kMaxSpanBytes || check->bytes.size() > length - pos) {
        return "check " + describe(step) + " at " + std::to_string(pos);
      }
      checked = true;
    } else if (std::holds_alternative<IncludeCall>(step) && !checked) {
      return describe(step) + " without a check at " + std::to_string(pos);
    } else if (const auto* mark = std::get_if<TryMark>(&step)) {
      if (*mark == TryMark::START && tries++ == 0 && !checked) {
        return "try without a check at " + std::to_string(pos);
      }
      if (*mark == TryMark::END) --tries;
    }
  }
  if (pos < length && !checked) return "end skipped without a check at " + std::to_string(pos);
  return "";
}

struct Parsed {
  std::vector<Instruction> instructions;
  std::optional<Plan> plan;
};

// The body parsed by a stream, as for a first hit with these values.
Parsed parse(std::string_view body, const RequestValues& values) {
  Stats stats;
  Stream stream(kPage.uri, kPage.authority, stats);
  stream.setRequestValues(values);
  stream.record(1 << 20);
  stream.feed(body);
  stream.finish();
  Parsed parsed;
  parsed.instructions = stream.takeInstructions();
  parsed.plan = buildPlan(stream.recordedProgram(), stream.recordedBody());
  return parsed;
}

// The plan's steps less its checks, as splice instructions.
std::vector<std::string> withoutChecks(const std::vector<PlanStep>& steps) {
  std::vector<std::string> out;
  for (const PlanStep& step : steps) {
    if (!std::holds_alternative<PlanCheck>(step)) out.push_back(describe(step));
  }
  return out;
}

// What the client gets: the body's bytes and the literals, in order, with
// includes and try markers written in as [I(path)], [T+] and so on.  Unlike
// the steps, it does not tell a run from a literal of the same bytes.
template <typename Step>
std::string rendered(std::string_view body, const std::vector<Step>& steps) {
  std::string out;
  for (const Step& step : steps) {
    std::visit(
        [&](const auto& s) {
          using T = std::decay_t<decltype(s)>;
          if constexpr (std::is_same_v<T, VerbatimRun>) {
            out += body.substr(s.offset, s.length);
          } else if constexpr (std::is_same_v<T, LiteralText>) {
            out += s.bytes;
          } else if constexpr (!std::is_same_v<T, PlanCheck>) {
            out += "[" + describe(PlanStep(s)) + "]";
          }
        },
        step);
  }
  return out;
}

// The bytes the plan's checks compare, and the first that differs from the
// body's there (the offset of its check), or nullopt.
std::optional<uint64_t> failingCheck(const std::vector<PlanStep>& steps, std::string_view body) {
  for (const PlanStep& step : steps) {
    const auto* check = std::get_if<PlanCheck>(&step);
    if (check != nullptr && body.substr(check->offset, check->bytes.size()) != check->bytes) {
      return check->offset;
    }
  }
  return std::nullopt;
}

RequestValues withCookie(std::string cookie) {
  RequestValues values;
  values.cookies = std::move(cookie);
  return values;
}

TEST(PlanEvaluation, OnePlanServesTwoRequestsEachItsOwnOutput) {
  const std::string body =
      "a<esi:choose><esi:when test=\"$(HTTP_COOKIE{g})=='x'\">X</esi:when>"
      "<esi:otherwise>O<esi:include src=\"/o/$(HTTP_COOKIE{id}|anon)\"/></esi:otherwise>"
      "</esi:choose><esi:vars>$(HTTP_COOKIE{id})</esi:vars>z";
  const Parsed first = parse(body, withCookie("g=x; id=1"));
  ASSERT_TRUE(first.plan);

  EXPECT_EQ(describe(*first.plan, withCookie("g=x; id=1")),
            (std::vector<std::string>{"V(0,1)", "C(1,<esi:choose><esi:when test=\"$(HTTP_COOKIE{g})"
                                      "=='x'\">)", "V(53,1)", "C(54,</esi:when><esi:otherwise>)",
                                      "L(1)", "V(196,1)"}));
  EXPECT_EQ(describe(*first.plan, withCookie("id=2")),
            (std::vector<std::string>{"V(0,1)", "C(1,<esi:choose><esi:when test=\"$(HTTP_COOKIE{g})"
                                      "=='x'\">)", "V(80,1)",
                                      "C(81,<esi:include src=\"/o/$(HTTP_COOKIE{id}|anon)\"/>"
                                      "</esi:otherwise></esi:choose><esi:vars>$(HTTP_COOKIE{id})"
                                      "</esi:vars>)", "I(/o/2)", "L(2)", "V(196,1)"}));
  EXPECT_EQ(describe(*first.plan), (std::vector<std::string>{
                                       "V(0,1)", "C(1,<esi:choose><esi:when test=\"$(HTTP_COOKIE{g})"
                                       "=='x'\">)", "V(80,1)",
                                       "C(81,<esi:include src=\"/o/$(HTTP_COOKIE{id}|anon)\"/>"
                                       "</esi:otherwise></esi:choose><esi:vars>$(HTTP_COOKIE{id})"
                                       "</esi:vars>)", "I(/o/anon)", "V(196,1)"}));
}

TEST(PlanEvaluation, APlanReadsTheRequestWhereAValueAnIncludeOrATestNamesAVariable) {
  const std::vector<std::pair<std::string, bool>> pages = {
      {"a<esi:include src=\"/x\"/>b<esi:remove>r</esi:remove><!--esi c -->", false},
      {"<esi:try><esi:attempt><esi:include src=\"x\" alt=\"/y\"/></esi:attempt>"
       "<esi:except>e</esi:except></esi:try>", false},
      {"<esi:vars>plain</esi:vars>", false},
      {"<esi:choose><esi:when test=\"'a'=='a'\">a</esi:when></esi:choose>", false},
      {"<esi:vars>$(HTTP_HOST)</esi:vars>", true},
      {"<esi:include src=\"/x?q=$(QUERY_STRING{q})\"/>", true},
      {"<esi:include src=\"/x\" alt=\"/$(HTTP_HOST)\"/>", true},
      {"<esi:choose><esi:when test=\"$(HTTP_HOST)=='a'\">a</esi:when></esi:choose>", true},
  };
  for (const auto& [body, reads] : pages) {
    const Parsed parsed = parse(body, {});
    ASSERT_TRUE(parsed.plan) << body;
    EXPECT_EQ(parsed.plan->readsRequest, reads) << body;
  }
}

TEST(PlanEvaluation, TryInPlanKeepsItsMarkers) {
  const std::string body =
      "<esi:try><esi:attempt><esi:include src=\"/a\"/></esi:attempt>"
      "<esi:except>e</esi:except></esi:try>.";
  const Parsed parsed = parse(body, {});
  ASSERT_TRUE(parsed.plan);
  EXPECT_EQ(withoutChecks(evaluate(*parsed.plan, {})),
            (std::vector<std::string>{"T+", "I(/a)", "T!", "V(71,1)", "T.", "V(95,1)"}));
  EXPECT_EQ(workerRefuses(evaluate(*parsed.plan, {}), body.size()), "");
}

// Random pages of every construct, each planned once and evaluated for
// several requests: the worker accepts every evaluation, and it says what
// parsing the page for that request says.  Text of 150 bytes makes runs
// long enough to end spans, inside constructs too (a branch not chosen
// that holds a span of values).
TEST(PlanEvaluation, EveryEvaluationIsAcceptedByTheWorkerAndMatchesAParse) {
  const std::vector<std::string> pieces = {
      "text", std::string(150, 'l'), "<esi:choose>", "</esi:choose>", "<esi:when test=\"$(HTTP_COOKIE{a})=='1'\">",
      "<esi:when test=\"$(HTTP_COOKIE{b})\">", "<esi:when test=\"bad\">", "</esi:when>",
      "<esi:otherwise>", "</esi:otherwise>", "<esi:try>", "</esi:try>", "<esi:attempt>",
      "</esi:attempt>", "<esi:except>", "</esi:except>", "<esi:vars>", "</esi:vars>",
      "$(HTTP_COOKIE{a})", "$(HTTP_COOKIE{b}|'d')", "<esi:include src=\"/i/$(HTTP_COOKIE{a})\"/>",
      "<esi:include src=\"/fixed\"/>", "<esi:remove>x</esi:remove>", "<!--esi e-->", "<",
      "$", "\n",
  };
  const std::vector<RequestValues> requests = {
      {}, withCookie("a=1"), withCookie("b=yes"), withCookie("a=1; b=0"), withCookie("a=../x")};
  std::mt19937 random(9);
  for (int iteration = 0; iteration < 1500; ++iteration) {
    std::string body;
    const int count = std::uniform_int_distribution<>(1, 30)(random);
    for (int i = 0; i < count; ++i) {
      body += pieces[std::uniform_int_distribution<size_t>(0, pieces.size() - 1)(random)];
    }
    SCOPED_TRACE(body);
    const Parsed recorded = parse(body, requests[iteration % requests.size()]);
    ASSERT_TRUE(recorded.plan);
    for (const RequestValues& request : requests) {
      SCOPED_TRACE(request.cookies);
      const std::vector<PlanStep> steps = evaluate(*recorded.plan, request);
      ASSERT_EQ(workerRefuses(steps, body.size()), "");
      ASSERT_EQ(rendered(body, steps), rendered(body, parse(body, request).instructions));
    }
  }
}

// --- Spans: constructs that go out as one literal -----------------------------

const std::string kVarsBlock =
    "<esi:vars><ul><li>$(HTTP_COOKIE{user})</li><li>$(QUERY_STRING{q}|none)</li>"
    "<li>$(HTTP_HOST)</li><li>$(HTTP_COOKIE{theme}|'light')</li></ul></esi:vars>";

RequestValues request(std::string cookie, std::string query, std::string host) {
  RequestValues values;
  values.cookies = std::move(cookie);
  values.queryString = std::move(query);
  values.host = std::move(host);
  return values;
}

TEST(PlanSpans, ShortVarsBlockGoesOutAsOneLiteralTheSameAsAParse) {
  const std::string head(200, 'h'), tail(200, 't');
  const std::string body = head + kVarsBlock + tail;
  const Parsed recorded = parse(body, {});
  ASSERT_TRUE(recorded.plan);
  const std::vector<RequestValues> requests = {
      {}, request("user=alice; theme=dark", "q=shoes", "shop.example"),
      request("user=bob", "", "b.example")};
  for (const RequestValues& values : requests) {
    const std::vector<PlanStep> steps = evaluate(*recorded.plan, values);
    ASSERT_EQ(steps.size(), 4u);
    EXPECT_EQ(describe(steps[0]), "V(0,200)");
    EXPECT_EQ(describe(steps[1]), "C(200," + kVarsBlock + ")");
    ASSERT_TRUE(std::holds_alternative<LiteralText>(steps[2]));
    EXPECT_EQ(describe(steps[3]), "V(" + std::to_string(200 + kVarsBlock.size()) + ",200)");
    EXPECT_EQ(workerRefuses(steps, body.size()), "");
    EXPECT_EQ(rendered(body, steps), rendered(body, parse(body, values).instructions));
  }
  EXPECT_EQ(std::get<LiteralText>(evaluate(*recorded.plan, requests[1])[2]).bytes,
            "<ul><li>alice</li><li>shoes</li><li>shop.example</li><li>dark</li></ul>");
}

TEST(PlanSpans, HostileValuesAreEscapedAsAParseEscapesThem) {
  const std::string body = "<p>" + kVarsBlock + "</p>";
  const Parsed recorded = parse(body, {});
  ASSERT_TRUE(recorded.plan);
  const std::vector<RequestValues> requests = {
      request("user=</esi:vars><esi:include src=\"/x\"/>; theme='\"&amp;", "q=$(HTTP_HOST)",
              "h\r\n<b>"),
      request("user=a\r\nSet-Cookie: x=1; theme=<script>", "q=%3C%2Fesi%3Avars%3E&q=2",
              "\"quoted\""),
      request("user=$(QUERY_STRING{q})", "q=</li></ul>", "x")};
  for (const RequestValues& values : requests) {
    SCOPED_TRACE(values.cookies);
    const std::vector<PlanStep> steps = evaluate(*recorded.plan, values);
    ASSERT_EQ(steps.size(), 4u);
    ASSERT_TRUE(std::holds_alternative<LiteralText>(steps[2]));
    const std::string& literal = std::get<LiteralText>(steps[2]).bytes;
    EXPECT_EQ("<p>" + literal + "</p>", rendered(body, parse(body, values).instructions));
  }
}

TEST(PlanSpans, BlockLongerThanACheckGoesOutInPiecesEachCheckedWhole) {
  std::string block = "<esi:vars><ul>";
  for (int i = 0; i < 60; ++i) block += "<li>" + std::to_string(i) + " $(HTTP_HOST)</li>";
  block += "</ul></esi:vars>";
  ASSERT_GT(block.size(), PlanCheck::kMaxSpanBytes);
  const std::string body = "a" + block + "z";
  const Parsed recorded = parse(body, {});
  ASSERT_TRUE(recorded.plan);
  const RequestValues values = request("", "", "example.com");
  const std::vector<PlanStep> steps = evaluate(*recorded.plan, values);
  EXPECT_EQ(workerRefuses(steps, body.size()), "");
  EXPECT_EQ(rendered(body, steps), rendered(body, parse(body, values).instructions));
  // Every literal stands for bytes its check holds: from the check to the
  // next run.
  size_t literals = 0;
  for (size_t i = 0; i < steps.size(); ++i) {
    if (!std::holds_alternative<LiteralText>(steps[i])) continue;
    ++literals;
    ASSERT_GE(i, 1u);
    ASSERT_LT(i + 1, steps.size());
    const auto& check = std::get<PlanCheck>(steps[i - 1]);
    const auto& next = std::get<VerbatimRun>(steps[i + 1]);
    EXPECT_EQ(check.offset + check.bytes.size(), next.offset);
  }
  EXPECT_GE(literals, 2u);
  EXPECT_LT(steps.size(), 20u) << ::testing::PrintToString(describe(*recorded.plan, values));
}

TEST(PlanSpans, ABlockThatDiffersInsideIsCaughtAtItsStartAndParsedFromThere) {
  const std::string head(200, 'h');
  const std::string body = head + kVarsBlock + head;
  std::string changed = body;
  const size_t inner = body.find("<li>", 200) + 2;  // text between values
  changed[inner] = 'o';
  const Parsed recorded = parse(body, {});
  ASSERT_TRUE(recorded.plan);
  const RequestValues values = request("user=alice", "q=x", "example.com");
  const std::vector<PlanStep> steps = evaluate(*recorded.plan, values);
  // The worker stops at the block's check: what it replayed before, and
  // the parse from there, are the changed page.
  ASSERT_EQ(failingCheck(steps, changed), std::optional<uint64_t>(200));
  const auto resumption = recorded.plan->resumeAt(200);
  ASSERT_TRUE(resumption);
  Stats stats;
  Stream stream(kPage.uri, kPage.authority, stats, 200);
  stream.setRequestValues(values);
  ASSERT_TRUE(stream.resumeInside(resumption->before, resumption->context));
  stream.feed(std::string_view(changed).substr(200));
  stream.finish();
  EXPECT_EQ(head + rendered(changed, stream.takeInstructions()),
            rendered(changed, parse(changed, values).instructions));
  EXPECT_NE(rendered(changed, parse(changed, values).instructions),
            rendered(body, parse(body, values).instructions));
}

TEST(PlanSpans, ShortChooseGoesOutAsItsChosenBranch) {
  const std::string choose =
      "<esi:choose><esi:when test=\"$(HTTP_COOKIE{theme}) == 'dark'\"><p>dark</p></esi:when>"
      "<esi:otherwise><p>light</p></esi:otherwise></esi:choose>";
  const std::string body = std::string(150, '.') + choose + std::string(150, '.');
  const Parsed recorded = parse(body, {});
  ASSERT_TRUE(recorded.plan);
  EXPECT_EQ(describe(*recorded.plan, withCookie("theme=dark")),
            (std::vector<std::string>{"V(0,150)", "C(150," + choose + ")", "L(<p>dark</p>)",
                                      "V(" + std::to_string(150 + choose.size()) + ",150)"}));
  EXPECT_EQ(describe(*recorded.plan)[2], "L(<p>light</p>)");
}

TEST(PlanSpans, ConstructsWithIncludesOrTriesOrLongRunsAreNoSpans) {
  const std::string run(SegmentArena::kMinRunBytes, 'r');
  for (const std::string& construct : std::vector<std::string>{
           "<esi:vars>$(HTTP_HOST)<esi:include src=\"/a\"/>$(HTTP_HOST)</esi:vars>",
        "<esi:try><esi:attempt>a</esi:attempt><esi:except>b</esi:except></esi:try>",
        "<esi:vars>$(HTTP_HOST)" + run + "$(HTTP_HOST)</esi:vars>"}) {
    SCOPED_TRACE(construct);
    const std::string body = "." + construct + ".";
    const Parsed recorded = parse(body, {});
    ASSERT_TRUE(recorded.plan);
    EXPECT_TRUE(recorded.plan->spans.empty());
    EXPECT_EQ(rendered(body, evaluate(*recorded.plan, {})),
              rendered(body, parse(body, {}).instructions));
  }
}

TEST(PlanSpans, OneValueAloneKeepsItsCheckAndLiteral) {
  const std::string body = "a<esi:vars>$(HTTP_HOST)</esi:vars>b";
  const Parsed recorded = parse(body, {});
  ASSERT_TRUE(recorded.plan);
  EXPECT_TRUE(recorded.plan->spans.empty());
  EXPECT_EQ(describe(*recorded.plan, request("", "", "h")),
            (std::vector<std::string>{"V(0,1)", "C(1,<esi:vars>$(HTTP_HOST)</esi:vars>)", "L(h)",
                                      "V(34,1)"}));
}

// --- ObjectId -----------------------------------------------------------------

TEST(PlanObjectId, WireBytesAreKeyThenLittleEndianNumbers) {
  std::string wire(48, '\0');
  for (int i = 0; i < 16; ++i) wire[i] = static_cast<char>(0xa0 + i);
  wire[16 + 7] = static_cast<char>(0x80);  // length 2^63
  wire[24] = static_cast<char>(0xff);  // header size 255
  wire[32] = 0x01;
  wire[33] = 0x02;  // inode 0x0201
  wire[40] = 0x03;  // modified 3
  const auto id = ObjectId::fromWire(wire);
  ASSERT_TRUE(id);
  EXPECT_EQ(id->key[0], 0xa0);
  EXPECT_EQ(id->key[15], 0xaf);
  EXPECT_EQ(id->length, uint64_t{1} << 63);
  EXPECT_EQ(id->headerSize, 255u);
  EXPECT_EQ(id->inode, 0x0201u);
  EXPECT_EQ(id->modified, 3u);
}

TEST(PlanObjectId, WireBytesOfAnyOtherSizeAreRefused) {
  EXPECT_FALSE(ObjectId::fromWire(""));
  EXPECT_FALSE(ObjectId::fromWire(std::string(40, '\0')));  // protocol 5's
  EXPECT_FALSE(ObjectId::fromWire(std::string(47, '\0')));
  EXPECT_FALSE(ObjectId::fromWire(std::string(49, '\0')));
  EXPECT_FALSE(ObjectId::fromWire(std::string(16, '\0')));
}

TEST(PlanObjectId, StoresOfOneFileInOneSecondAreDifferentObjects) {
  EXPECT_NE(idOf(1, 1700000000'000000001), idOf(1, 1700000000'004000001));
  ObjectId reused = idOf(1);
  ++reused.inode;
  EXPECT_NE(idOf(1), reused);
  EXPECT_EQ(idOf(1, 100), idOf(1, 100));
  EXPECT_EQ(ObjectIdHash{}(idOf(1, 100)), ObjectIdHash{}(idOf(1, 100)));
}

// --- PlanStore ----------------------------------------------------------------

TEST(PlanStore, AZoneWithoutASizeHasTheDefaultZonesBudget) {
  PlanStore store(256 << 10);
  store.configureZone(PlanStore::kDefaultZone, 0);
  store.configureZone("sized", 1 << 20);
  expectZone(store, "default", {{"max_bytes", 256 << 10}});
  store.setDefaultZoneBytes(128 << 10);
  expectZone(store, "default", {{"max_bytes", 128 << 10}});
  expectZone(store, "sized", {{"max_bytes", 1 << 20}});
  EXPECT_EQ(PlanStore().zones().size(), 0u);  // made by the first open
}

TEST(PlanStore, TheDefaultZoneShrinksWithItsSettingEvictingWhatNoLongerFits) {
  const size_t one = entryBytes(planOf(100));
  PlanStore store(2 * one);
  store.configureZone(PlanStore::kDefaultZone, 0);
  ASSERT_TRUE(store.record("default", idOf(1), planOf(100)));
  ASSERT_TRUE(store.record("default", idOf(2), planOf(100)));
  store.setDefaultZoneBytes(one);
  expectZone(store, "default", {{"entries", 1}, {"evictions", 1}});
  EXPECT_NE(store.find("default", idOf(2)), nullptr);
}

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
  EXPECT_EQ(entries[0]["length"], 4096);
  EXPECT_EQ(entries[0]["header_size"], 512);
  EXPECT_EQ(entries[0]["inode"], 77);
  EXPECT_EQ(entries[0]["modified"], 1700000000'000000001);
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

TEST(PlanStore, AReplayCountsAHitAndFreshensOnlyAPlanThatIsThere) {
  PlanStore store;
  const size_t one = entryBytes(planOf(100));
  store.configureZone("pages", 2 * one);
  ASSERT_TRUE(store.record("pages", idOf(1), planOf(100)));
  ASSERT_TRUE(store.record("pages", idOf(2), planOf(100)));
  EXPECT_TRUE(store.replayed("pages", idOf(1)));  // 2 is now the oldest
  EXPECT_FALSE(store.replayed("pages", idOf(3)));
  EXPECT_FALSE(store.replayed("other", idOf(1)));
  expectZone(store, "pages", {{"hits", 1}, {"misses", 0}});

  ASSERT_TRUE(store.record("pages", idOf(3), planOf(100)));
  EXPECT_FALSE(store.replayed("pages", idOf(2)));
  EXPECT_TRUE(store.replayed("pages", idOf(1)));
  const nlohmann::json entries = store.entries("pages", 10);  // most recent first
  EXPECT_EQ(entries[0]["key"], "01000000000000000000000000000000");
  EXPECT_EQ(entries[0]["hits"], 2);
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

TEST(PlanStore, APurgeForgetsEveryStoreOfItsFilesInEveryZone) {
  PlanStore store;
  store.configureZone("pages", 1 << 20);
  store.configureZone("other", 1 << 20);
  ASSERT_TRUE(store.record("pages", idOf(1, 100), planOf(10)));
  ASSERT_TRUE(store.record("pages", idOf(1, 200), planOf(10)));  // a refresh
  ASSERT_TRUE(store.record("pages", idOf(2), planOf(10)));
  ASSERT_TRUE(store.record("other", idOf(1, 100), planOf(10)));

  EXPECT_EQ(store.purged({idOf(1).key, idOf(3).key}), 3u);

  EXPECT_EQ(store.find("pages", idOf(1, 100)), nullptr);
  EXPECT_EQ(store.find("pages", idOf(1, 200)), nullptr);
  EXPECT_EQ(store.find("other", idOf(1, 100)), nullptr);
  EXPECT_NE(store.find("pages", idOf(2)), nullptr);
  expectZone(store, "pages",
             {{"purged", 2}, {"entries", 1}, {"bytes", entryBytes(planOf(10))}});
  expectZone(store, "other", {{"purged", 1}, {"entries", 0}, {"bytes", 0}});
  EXPECT_EQ(store.purged({idOf(1).key}), 0u);  // nothing left to forget
}

TEST(PlanStore, APurgeAfterEvictionsAndDropsFindsOnlyWhatIsLeft) {
  const size_t one = entryBytes(planOf(100));
  PlanStore store;
  store.configureZone("pages", 2 * one);
  ASSERT_TRUE(store.record("pages", idOf(1), planOf(100)));
  ASSERT_TRUE(store.record("pages", idOf(2), planOf(100)));
  ASSERT_TRUE(store.record("pages", idOf(3), planOf(100)));  // evicts 1
  store.drop("pages", idOf(2));

  EXPECT_EQ(store.purged({idOf(1).key, idOf(2).key, idOf(3).key}), 1u);
  expectZone(store, "pages", {{"purged", 1}, {"entries", 0}, {"bytes", 0}});
  ASSERT_TRUE(store.record("pages", idOf(1), planOf(100)));
  EXPECT_EQ(store.purged({idOf(1).key}), 1u);
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
  const std::string body = "ab<esi:include src=\"/a\"/>cd";
  const Plan small = *buildPlan({V(0, 2), I("/a"), V(25, 2)}, body);
  Plan large = *buildPlan({V(0, 2), I("/a"), V(25, 2)}, body);
  std::get<IncludeStep>(large.program[1]).resolved->path = "/" + std::string(1000, 'p');
  EXPECT_GE(large.bytes(), small.bytes() + 1000);
  EXPECT_GE(small.bytes(), sizeof(ProgramStep) * small.program.size());
}

// --- Segments (esi_stitch) -------------------------------------------------

std::string prose(size_t bytes) {
  std::string out;
  while (out.size() < bytes) out += "A paragraph of the page's own text. ";
  out.resize(bytes);
  return out;
}

TEST(PlanSegments, OnlyRunsOfAtLeast128BytesAreDeflated) {
  SegmentArena arena(SegmentArena::kMinBytes);
  const std::string include = "<esi:include src=\"/f\"/>";
  const std::string body = prose(200) + include + prose(127) + include + prose(128);
  std::optional<Plan> plan = parse(body, {}).plan;
  ASSERT_TRUE(plan);
  const size_t before = plan->bytes();
  plan->deflateRuns(body, 6, arena);

  ASSERT_EQ(plan->segments.size(), 2u);
  EXPECT_EQ(plan->segments[0].runOffset, 0u);
  EXPECT_EQ(plan->segments[0].runLength, 200u);
  EXPECT_EQ(plan->segments[1].runOffset, 200 + 2 * include.size() + 127);
  EXPECT_EQ(plan->segments[1].runLength, 128u);
  EXPECT_EQ(plan->segments[1].offset,
            plan->segments[0].offset + plan->segments[0].length);  // back to back
  ASSERT_TRUE(plan->lease);
  EXPECT_GE(plan->bytes(), before + plan->lease.bytes());
}

TEST(PlanSegments, SegmentBytesCountInTheZoneAndGoBackWithThePlan) {
  SegmentArena arena(SegmentArena::kMinBytes);
  const std::string body = prose(4000) + "<esi:include src=\"/f\"/>" + prose(300);
  std::optional<Plan> plan = parse(body, {}).plan;
  ASSERT_TRUE(plan);
  plan->deflateRuns(body, 9, arena);
  const uint64_t extent = plan->lease.bytes();
  ASSERT_GT(extent, 0u);
  plan->program.shrink_to_fit();
  const size_t bytes = plan->bytes() + sizeof(ObjectId);

  PlanStore store;
  store.configureZone("pages", 1 << 20);
  ASSERT_TRUE(store.record("pages", idOf(1), std::move(*plan)));
  expectZone(store, "pages", {{"bytes", bytes}, {"segment_bytes", extent}});
  const nlohmann::json entries = store.entries("pages", 10);
  EXPECT_EQ(entries[0]["segments"], 2);
  EXPECT_EQ(entries[0]["segment_bytes"], extent);
  EXPECT_EQ(arena.stats()["segment_extents"], 1);

  store.drop("pages", idOf(1));
  expectZone(store, "pages", {{"bytes", 0}, {"segment_bytes", 0}});
  EXPECT_EQ(arena.stats()["segment_quarantined_extents"], 1);
}

TEST(PlanSegments, APlanTheArenaHasNoRoomForIsRecordedWithoutSegments) {
  SegmentArena arena(SegmentArena::kMinBytes);
  std::mt19937 random(1);
  std::string noise(SegmentArena::kMinBytes - 8192, '\0');
  for (char& c : noise) c = static_cast<char>(random());
  const auto filler = arena.deflate(noise, {RunRange{0, static_cast<uint32_t>(noise.size())}}, 1);
  ASSERT_TRUE(filler);

  // Random letters deflate to well over the 8 KiB left.
  std::string body(100000, 'a');
  for (char& c : body) c = static_cast<char>('a' + random() % 26);
  body += "<esi:include src=\"/f\"/>";
  std::optional<Plan> plan = parse(body, {}).plan;
  ASSERT_TRUE(plan);
  plan->deflateRuns(body, 6, arena);
  EXPECT_TRUE(plan->segments.empty());
  EXPECT_FALSE(plan->lease);
  EXPECT_EQ(arena.stats()["segment_arena_full"], 1);

  PlanStore store;
  store.configureZone("pages", 1 << 20);
  EXPECT_TRUE(store.record("pages", idOf(1), std::move(*plan)));
  expectZone(store, "pages", {{"entries", 1}, {"segment_bytes", 0}});
}

TEST(PlanSegments, ResumesAtTheStartOrTheEndOfARun) {
  const std::string body = "0123456789<esi:include src=\"/x\"/>abcde";
  const Plan plan = *buildPlan({V(0, 10), I("/x"), V(33, 5)}, body);
  EXPECT_EQ(plan.resumeAt(0)->before.size(), 0u);
  EXPECT_EQ(plan.resumeAt(10)->before.size(), 1u);  // a run's end: it went out
  EXPECT_EQ(plan.resumeAt(33)->before.size(), 2u);  // a run's start: what came before it
  EXPECT_EQ(plan.resumeAt(38)->before.size(), 3u);
  EXPECT_FALSE(plan.resumeAt(20));
  EXPECT_FALSE(plan.resumeAt(35));
}

// A worker stops replaying at a construct inside <esi:vars> or <!--esi
// (a long block: checked in pieces): the parse from there reads the rest
// of the block as the block's, as a parse of the whole page does.
TEST(PlanResume, InsideVarsOrAnEsiCommentTheParseResumesInIt) {
  const std::string text(1500, 't');
  const std::string construct = "<esi:include src=\"/a\"/>";
  for (const auto& [open, close] :
       {std::pair<std::string, std::string>{"<esi:vars>", "</esi:vars>"},
        std::pair<std::string, std::string>{"<!--esi ", " -->"}}) {
    const std::string body = open + "<p>" + text + "</p>" + construct +
                             "<p>$(HTTP_HOST)</p>" + close + "<p>$(HTTP_HOST) --></p>";
    std::string changed = body;
    const size_t at = body.find(construct);
    changed[at + construct.find('a')] = 'b';
    const Parsed recorded = parse(body, {});
    ASSERT_TRUE(recorded.plan);
    const RequestValues values = request("", "", "example.com");
    const std::vector<PlanStep> steps = evaluate(*recorded.plan, values);
    ASSERT_EQ(failingCheck(steps, changed), std::optional<uint64_t>(at)) << open;
    const auto resumption = recorded.plan->resumeAt(at);
    ASSERT_TRUE(resumption);
    EXPECT_EQ(resumption->context.varsDepth, open == "<esi:vars>" ? 1 : 0);
    EXPECT_EQ(resumption->context.esiComment, open != "<esi:vars>");
    Stats stats;
    Stream stream(kPage.uri, kPage.authority, stats, at);
    stream.setRequestValues(values);
    ASSERT_TRUE(stream.resumeInside(resumption->before, resumption->context));
    stream.feed(std::string_view(changed).substr(at));
    stream.finish();
    const std::string whole = rendered(changed, parse(changed, values).instructions);
    EXPECT_EQ(rendered(changed, stream.takeInstructions()),
              whole.substr(whole.find("[I(/b)]")))
        << open;
  }
}

}  // namespace
}  // namespace esi
