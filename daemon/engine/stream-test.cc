#include "engine/stream.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace esi {
namespace {

// What the connector would make of a stream's instructions: the page's own
// bytes, literals as they are, includes and try markers as [..].
std::string assemble(std::string_view page, const std::vector<Instruction>& instructions) {
  std::string out;
  for (const Instruction& instruction : instructions) {
    if (const auto* run = std::get_if<VerbatimRun>(&instruction)) {
      out += page.substr(run->offset, run->length);
    } else if (const auto* literal = std::get_if<LiteralText>(&instruction)) {
      out += literal->bytes;
    } else if (const auto* call = std::get_if<IncludeCall>(&instruction)) {
      out += "[I " + call->path + (call->args.empty() ? "" : "?" + call->args) +
             (call->altPath.empty() ? "" : " alt " + call->altPath) + "]";
    } else {
      const TryMark mark = std::get<TryMark>(instruction);
      out += mark == TryMark::START ? "[try" : mark == TryMark::EXCEPT ? "|except|" : "]";
    }
  }
  return out;
}

// The page parsed by a stream for a request with these values, cut into
// chunks at the given offsets.
std::string parse(std::string_view page, const RequestValues& values,
                  const std::vector<size_t>& cuts = {}) {
  Stats stats;
  Stream stream("/dir/page.html", "example.com", stats);
  stream.setRequestValues(values);
  std::vector<Instruction> instructions;
  size_t at = 0;
  for (const size_t cut : cuts) {
    stream.feed(page.substr(at, cut - at));
    for (Instruction& i : stream.takeInstructions()) instructions.push_back(std::move(i));
    at = cut;
  }
  stream.feed(page.substr(at));
  stream.finish();
  for (Instruction& i : stream.takeInstructions()) instructions.push_back(std::move(i));
  return assemble(page, instructions);
}

RequestValues cookies(std::string cookie) {
  RequestValues values;
  values.cookies = std::move(cookie);
  return values;
}

// --- ESI 1.0's own examples ------------------------------------------------

TEST(Stream, VarsSubstitutesTheSpecExample) {
  RequestValues values = cookies("type=Basic; visits=3");
  values.host = "www.example.com";
  values.queryString = "first=Robin&last=Roberts";
  EXPECT_EQ(parse("<esi:vars>Hello $(HTTP_COOKIE{visits}) at $(HTTP_HOST), "
                  "$(QUERY_STRING{first}) $(HTTP_COOKIE{type})</esi:vars>",
                  values),
            "Hello 3 at www.example.com, Robin Basic");
}

TEST(Stream, VarsValuesAreHtmlEscapedAndDefaultsApply) {
  EXPECT_EQ(parse("<esi:vars><b>$(HTTP_COOKIE{n})</b>$(HTTP_COOKIE{x}|'new user')"
                  "</esi:vars>",
                  cookies("n=<script>\"x\"</esi:vars>$(HTTP_HOST)")),
            "<b>&lt;script&gt;&quot;x&quot;&lt;/esi:vars&gt;$(HTTP_HOST)</b>new user");
}

TEST(Stream, ChooseTakesTheFirstTrueWhenAsTheSpecSays) {
  const std::string page =
      "<esi:choose>\n"
      "  <esi:when test=\"$(HTTP_COOKIE{group})=='Advanced'\">"
      "<esi:include src=\"http://www.example.com/advanced.html\"/></esi:when>\n"
      "  <esi:when test=\"$(HTTP_COOKIE{group})=='Basic User'\">"
      "<esi:include src=\"http://www.example.com/basic.html\"/></esi:when>\n"
      "  <esi:otherwise><esi:include src=\"http://www.example.com/new_user.html\"/>"
      "</esi:otherwise>\n"
      "</esi:choose>";
  // The page is on example.com, so these www.example.com includes are refused
  // (an empty path); the page authority www.example.com takes them.
  Stats stats;
  auto run = [&](const std::string& cookie) {
    Stream stream("/", "www.example.com", stats);
    stream.setRequestValues(cookies(cookie));
    stream.feed(page);
    stream.finish();
    return assemble(page, stream.takeInstructions());
  };
  EXPECT_EQ(run("group=Advanced"), "[I /advanced.html]");
  EXPECT_EQ(run("group=Basic User"), "[I /basic.html]");
  EXPECT_EQ(run(""), "[I /new_user.html]");
}

TEST(Stream, TextInsideChooseOutsideItsBranchesIsDropped) {
  EXPECT_EQ(parse("a<esi:choose>x<esi:when test='1==2'>b</esi:when>y"
                  "<esi:otherwise>c</esi:otherwise>z</esi:choose>d",
                  {}),
            "acd");
}

TEST(Stream, OnlyTheFirstTrueBranchGoesOut) {
  EXPECT_EQ(parse("<esi:choose><esi:when test='1'>a</esi:when><esi:when test='1'>b"
                  "</esi:when><esi:otherwise>c</esi:otherwise></esi:choose>",
                  {}),
            "a");
}

TEST(Stream, NestedChooseIsEvaluatedOnlyInsideTheChosenBranch) {
  const std::string page =
      "<esi:choose><esi:when test=\"$(HTTP_COOKIE{a})=='1'\">A"
      "<esi:choose><esi:when test=\"$(HTTP_COOKIE{b})=='1'\">B</esi:when>"
      "<esi:otherwise>b<esi:include src=\"/nb\"/></esi:otherwise></esi:choose>"
      "</esi:when><esi:otherwise>o<esi:choose><esi:otherwise>O</esi:otherwise>"
      "</esi:choose></esi:otherwise></esi:choose>";
  EXPECT_EQ(parse(page, cookies("a=1; b=1")), "AB");
  EXPECT_EQ(parse(page, cookies("a=1")), "Ab[I /nb]");
  EXPECT_EQ(parse(page, cookies("b=1")), "oO");
}

TEST(Stream, MalformedTestIsFalse) {
  EXPECT_EQ(parse("<esi:choose><esi:when test=\"$(HTTP_HOST) = 'x'\">a</esi:when>"
                  "<esi:otherwise>b</esi:otherwise></esi:choose>",
                  {}),
            "b");
}

TEST(Stream, MalformedTestIsCountedWhenParsedAndStaysFalseInAPlan) {
  Stats stats;
  Stream stream("/", "example.com", stats);
  stream.record(1024);
  stream.feed("<esi:choose><esi:when test=\"a == 'b'\">a</esi:when></esi:choose>");
  stream.finish();
  EXPECT_EQ(stats.warnings, 1u);
  // A plan keeps the compiled test (and logs nothing when it evaluates it).
  const PageAddress page{"/", "example.com"};
  const RequestValues values;
  Evaluator evaluator(page, values);
  std::vector<Instruction> out;
  for (const ProgramStep& step : stream.recordedProgram()) evaluator.step(step, out);
  EXPECT_TRUE(out.empty());
}

TEST(Stream, TryMarksItsAttemptAndExcept) {
  EXPECT_EQ(parse("<esi:try>x<esi:attempt>a<esi:include src=\"/a\"/></esi:attempt>y"
                  "<esi:except>e<esi:include src=\"/e\"/></esi:except>z</esi:try>",
                  {}),
            "[trya[I /a]|except|e[I /e]]");
}

TEST(Stream, TryWithoutExceptStillSaysWhereTheAttemptEnds) {
  EXPECT_EQ(parse("<esi:try><esi:attempt>a</esi:attempt></esi:try>", {}), "[trya|except|]");
}

TEST(Stream, TryNestsInsideAttemptsAndBranches) {
  const std::string page =
      "<esi:try><esi:attempt><esi:try><esi:attempt><esi:include src=\"/in\"/>"
      "</esi:attempt><esi:except>1</esi:except></esi:try></esi:attempt>"
      "<esi:except><esi:choose><esi:when test=\"$(HTTP_COOKIE{x})\">"
      "<esi:try><esi:attempt>2</esi:attempt></esi:try></esi:when></esi:choose>"
      "</esi:except></esi:try>";
  EXPECT_EQ(parse(page, {}), "[try[try[I /in]|except|1]|except|]");
  EXPECT_EQ(parse(page, cookies("x=yes")), "[try[try[I /in]|except|1]|except|[try2|except|]]");
}

TEST(Stream, TryInsideABranchNotChosenEmitsNothing) {
  EXPECT_EQ(parse("<esi:choose><esi:when test='0'><esi:try><esi:attempt>a"
                  "</esi:attempt></esi:try></esi:when></esi:choose>b",
                  {}),
            "b");
}

// --- Includes with variables ---------------------------------------------------

TEST(Stream, IncludeSrcAndAltTakeVariables) {
  RequestValues values = cookies("id=42");
  values.queryString = "lang=en%20GB&x=1";
  EXPECT_EQ(parse("<esi:include src=\"/u/$(HTTP_COOKIE{id})/p?l=$(QUERY_STRING{lang})\" "
                  "alt=\"$(HTTP_COOKIE{id}).html\"/>",
                  values),
            "[I /u/42/p?l=en%20GB alt /dir/42.html]");
}

// --- Streaming ---------------------------------------------------------------

const char ALL_CONSTRUCTS[] =
    "<html><esi:vars><p>Hi $(HTTP_COOKIE{name}|'you'), $(QUERY_STRING{q})</p></esi:vars>\n"
    "<esi:choose><esi:when test=\"$(HTTP_COOKIE{group})=='a' | "
    "$(HTTP_ACCEPT_LANGUAGE{da})\">A<esi:include src=\"/a/$(HTTP_COOKIE{name})\"/>"
    "</esi:when><esi:when test=\"$(HTTP_USER_AGENT{os})=='WIN'\">W</esi:when>"
    "<esi:otherwise><esi:try><esi:attempt>T<esi:include src=\"t?q=$(QUERY_STRING{q})\" "
    "alt=\"/alt\"/></esi:attempt><esi:except>E</esi:except></esi:try></esi:otherwise>"
    "</esi:choose><!--esi <esi:vars>$(HTTP_HOST)</esi:vars> --><esi:remove>r</esi:remove>"
    "</html>";

TEST(Stream, PageWithEveryConstructGivesTheSameOutputForEveryChunkSplit) {
  RequestValues first = cookies("name=Ann; group=a");
  first.host = "example.com";
  RequestValues second;
  second.queryString = "q=x%20y";
  second.acceptLanguage = "en";
  const std::string page = ALL_CONSTRUCTS;
  const std::string expectFirst =
      "<html><p>Hi Ann, </p>\nA[I /a/Ann] example.com </html>";
  const std::string expectSecond =
      "<html><p>Hi you, x y</p>\n[tryT[I /dir/t?q=x%20y alt /alt]|except|E]  </html>";
  ASSERT_EQ(parse(page, first), expectFirst);
  ASSERT_EQ(parse(page, second), expectSecond);
  for (size_t cut = 1; cut < page.size(); ++cut) {
    SCOPED_TRACE("cut at " + std::to_string(cut));
    EXPECT_EQ(parse(page, first, {cut}), expectFirst);
    EXPECT_EQ(parse(page, second, {cut}), expectSecond);
  }
  std::vector<size_t> everyByte;
  for (size_t cut = 1; cut < page.size(); ++cut) everyByte.push_back(cut);
  EXPECT_EQ(parse(page, first, everyByte), expectFirst);
  EXPECT_EQ(parse(page, second, everyByte), expectSecond);
}

TEST(Stream, ChosenBranchGoesOutAsItArrives) {
  // The when's content goes out as it arrives: nothing waits for the end of
  // the choose.
  Stats stats;
  Stream stream("/", "example.com", stats);
  stream.feed("<esi:choose><esi:when test='1'>abc");
  const auto instructions = stream.takeInstructions();
  ASSERT_EQ(instructions.size(), 1u);
  EXPECT_EQ(std::get<VerbatimRun>(instructions[0]).offset, 31u);
  EXPECT_EQ(stream.released(), 34u);
}

}  // namespace
}  // namespace esi
