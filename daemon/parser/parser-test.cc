#include "parser/parser.h"

#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

namespace esi {
namespace {

struct Parse {
  std::string assembled;              // the page as a client would see it
  std::vector<std::string> warnings;  // "offset: what"
  std::string contexts;  // per verbatim byte: '.', 'v'ars, 'c'omment, 'b'oth
};

// Feeds a page to a parser, applies what it reports to the page, and checks
// the streaming promises as they are made.
class Assembler final : public ParserSink {
 public:
  explicit Assembler(std::string_view page, ParserLimits limits = {})
      : page_(page), parser_(*this, limits) {}

  void feedTo(size_t end) {
    const size_t start = fed_;
    fed_ = end;
    parser_.feed(page_.substr(start, end - start));
    const uint64_t released = parser_.released();
    EXPECT_GE(released, released_);
    EXPECT_LE(released, fed_);
    released_ = released;
  }

  void replay(Block block, bool opens) { parser_.replay(block, opens); }
  void resume(TextContext context) { parser_.resume(context); }

  Parse finish() {
    parser_.finish();
    EXPECT_EQ(parser_.released(), fed_);
    return std::move(result_);
  }

  void verbatim(uint64_t offset, uint64_t length) override {
    EXPECT_GT(length, 0u);
    EXPECT_GE(offset, verbatimEnd_);
    EXPECT_GE(offset, released_);
    EXPECT_GE(offset, parser_.released());
    EXPECT_LE(offset + length, fed_);
    verbatimEnd_ = offset + length;
    result_.assembled += page_.substr(offset, length);
    const TextContext context = parser_.runContext();
    result_.contexts.append(length, context.esiComment
                                        ? (context.varsDepth ? 'b' : 'c')
                                        : (context.varsDepth ? 'v' : '.'));
  }

  void include(std::string_view src, std::string_view alt,
               bool continueOnError) override {
    EXPECT_FALSE(src.empty());
    result_.assembled += "[include " + std::string(src) + "|" +
                         std::string(alt) + "|" +
                         (continueOnError ? "continue" : "") + "]";
  }

  void reference(std::string_view text) override {
    EXPECT_TRUE(text.starts_with("$(") && text.ends_with(")"));
    result_.assembled += "[ref " + std::string(text) + "]";
  }

  void open(Block block, std::string_view test) override {
    if (block != Block::WHEN) {
      EXPECT_TRUE(test.empty());
    }
    result_.assembled += "[" + std::string(nameOf(block)) +
                         (test.empty() ? "" : " ") + std::string(test) + "]";
  }

  void close(Block block) override {
    result_.assembled += "[/" + std::string(nameOf(block)) + "]";
  }

  void warning(uint64_t offset, std::string_view what) override {
    EXPECT_LE(offset, fed_);
    result_.warnings.push_back(std::to_string(offset) + ": " +
                               std::string(what));
  }

 private:
  const std::string_view page_;
  size_t fed_ = 0;
  uint64_t released_ = 0;
  uint64_t verbatimEnd_ = 0;
  Parse result_;
  Parser parser_;
};

// The page cut into chunks at the given ascending offsets.
Parse parseChunks(std::string_view page, const std::vector<size_t>& cuts,
                  ParserLimits limits = {}) {
  Assembler assembler(page, limits);
  for (const size_t cut : cuts) assembler.feedTo(cut);
  assembler.feedTo(page.size());
  return assembler.finish();
}

Parse parseWhole(std::string_view page, ParserLimits limits = {}) {
  return parseChunks(page, {}, limits);
}

Parse parseBytewise(std::string_view page, ParserLimits limits = {}) {
  std::vector<size_t> cuts;
  for (size_t cut = 1; cut < page.size(); ++cut) cuts.push_back(cut);
  return parseChunks(page, cuts, limits);
}

void expectSameParse(const Parse& actual, const Parse& expected) {
  EXPECT_EQ(actual.assembled, expected.assembled);
  EXPECT_EQ(actual.warnings, expected.warnings);
  EXPECT_EQ(actual.contexts, expected.contexts);
}

// The page assembles to expected with that many warnings, whether it comes
// whole, in two chunks cut anywhere, or one byte at a time.
void expectAssembled(std::string_view page, std::string_view expected,
                     size_t warnings, ParserLimits limits = {}) {
  const Parse whole = parseWhole(page, limits);
  EXPECT_EQ(whole.assembled, expected);
  EXPECT_EQ(whole.warnings.size(), warnings)
      << ::testing::PrintToString(whole.warnings);
  for (size_t cut = 0; cut <= page.size(); ++cut) {
    SCOPED_TRACE("cut at " + std::to_string(cut));
    expectSameParse(parseChunks(page, {cut}, limits), whole);
  }
  SCOPED_TRACE("byte by byte");
  expectSameParse(parseBytewise(page, limits), whole);
}

// --------------------------------------------------------------------------
// Text

TEST(Parser, TextWithoutEsiIsVerbatim) {
  expectAssembled("hello <b>world</b> a < b > c <e <es <esi <!- <![CDA",
                  "hello <b>world</b> a < b > c <e <es <esi <!- <![CDA", 0);
}

TEST(Parser, EmptyPageIsEmpty) { expectAssembled("", "", 0); }

// What a plan records of each run, so that a parse resumed at its start
// (a dropped plan) reads on as this one did.
TEST(Parser, EachRunIsReportedInTheTextContextItIsIn) {
  const std::string page =
      "a<!--esi b<esi:vars>c$(X)d</esi:vars>e-->f<esi:vars>g</esi:vars>";
  expectAssembled(page, "a bc[ref $(X)]defg", 0);
  EXPECT_EQ(parseWhole(page).contexts, ".ccbbc.v");

  const std::string rest = "c$(X)d</esi:vars>e-->f";
  Assembler resumed(rest);
  resumed.resume(TextContext{1, true});
  resumed.feedTo(rest.size());
  const Parse parse = resumed.finish();
  EXPECT_EQ(parse.assembled, "c[ref $(X)]def");
  EXPECT_EQ(parse.contexts, "bbc.");
  EXPECT_TRUE(parse.warnings.empty());
}

TEST(Parser, TagNamesAreCaseSensitive) {
  expectAssembled(R"(<ESI:include src="/x"/><Esi:remove>a</Esi:remove>)",
                  R"(<ESI:include src="/x"/><Esi:remove>a</Esi:remove>)", 0);
}

TEST(Parser, EsiInsideHtmlAttributesIsProcessed) {
  expectAssembled(R"(<a href="<esi:include src='/x'/>">)",
                  R"(<a href="[include /x||]">)", 0);
}

// --------------------------------------------------------------------------
// <esi:include>

TEST(Parser, SelfClosingIncludeIsReplaced) {
  expectAssembled(R"(a<esi:include src="/x"/>b)", "a[include /x||]b", 0);
}

TEST(Parser, IncludeWithEndTagIsReplaced) {
  expectAssembled(R"(a<esi:include src="/x"></esi:include>b)",
                  "a[include /x||]b", 0);
}

TEST(Parser, IncludeCarriesAltAndOnerrorContinue) {
  expectAssembled(R"(<esi:include src="/x" alt="/y" onerror="continue"/>)",
                  "[include /x|/y|continue]", 0);
}

TEST(Parser, IncludeAttributesTakeEitherQuoteAndAnyWhitespace) {
  expectAssembled(
      "<esi:include\tsrc='/x'\r\n alt = \"/y\"\n\tonerror='continue'\n/>",
      "[include /x|/y|continue]", 0);
}

TEST(Parser, IncludeAttributesAreEntityDecoded) {
  expectAssembled(
      "<esi:include src=\"/x?a=1&amp;b=&lt;&gt;&quot;&apos;&#65;&#x42;"
      "&#x10FFFF;&#233;\" alt=\"&bogus;&amp&#xZZ;&#0;&#55296;&#X41;&;\"/>",
      "[include /x?a=1&b=<>\"'AB\xf4\x8f\xbf\xbf\xc3\xa9|"
      "&bogus;&amp&#xZZ;&#0;&#55296;&#X41;&;|]",
      0);
}

TEST(Parser, IncludeOnerrorOtherThanContinueIsIgnoredWithWarning) {
  expectAssembled(R"(<esi:include src="/x" onerror="abort"/>)",
                  "[include /x||]", 1);
}

TEST(Parser, IncludeWithoutSrcIsDroppedWithWarning) {
  expectAssembled(R"(a<esi:include alt="/y"/>b)", "ab", 1);
  expectAssembled(R"(a<esi:include src=""/>b)", "ab", 1);
  expectAssembled(R"(a<esi:include/>b)", "ab", 1);
}

TEST(Parser, IncludeIgnoresUnknownAttributes) {
  expectAssembled(R"(<esi:include data-x="1" src="/x" foo='b"r'/>)",
                  "[include /x||]", 0);
}

TEST(Parser, IncludeAttributeNamesAreCaseSensitive) {
  expectAssembled(R"(a<esi:include SRC="/x"/>b)", "ab", 1);
}

TEST(Parser, IncludeAcceptsAnUnquotedValueLikeVarnish) {
  expectAssembled(R"(<esi:include src=/x?a=1 />)", "[include /x?a=1||]", 0);
}

TEST(Parser, GreaterThanInsideQuotesBelongsToTheValue) {
  expectAssembled(R"(<esi:include src="/x?a>b" alt='>'/>)",
                  "[include /x?a>b|>|]", 0);
}

TEST(Parser, IncludeWithMalformedAttributesIsDroppedWithWarning) {
  expectAssembled(R"(a<esi:include src="/x" async/>b)", "ab", 1);
  expectAssembled(R"(a<esi:include ="/x"/>b)", "ab", 1);
  expectAssembled(R"(a<esi:include src="/x" / >b)", "ab", 1);
}

TEST(Parser, IncludeWithTwoSrcIsDroppedWithWarning) {
  expectAssembled(R"(a<esi:include src="/x" src="/y"/>b)", "ab", 1);
}

TEST(Parser, IncludeOpenAtFinishIsVerbatimWithWarning) {
  expectAssembled(R"(a<esi:include src="/x")", R"(a<esi:include src="/x")", 1);
  expectAssembled(R"(a<esi:include src="/x" /)", R"(a<esi:include src="/x" /)",
                  1);
  expectAssembled(R"(a<esi:include src="/x>)", R"(a<esi:include src="/x>)", 1);
}

TEST(Parser, LessThanInsideAnEsiTagStartsTheNextOne) {
  expectAssembled(R"(<esi:include src="/x" <esi:include src="/y"/>)",
                  R"(<esi:include src="/x" [include /y||])", 1);
}

TEST(Parser, TagLongerThanTheLimitIsTextWithWarning) {
  const std::string longTag =
      "<esi:include src=\"/" + std::string(40, 'a') + "\"/>";
  expectAssembled(longTag + "b<esi:include src=\"/y\"/>",
                  longTag + "b[include /y||]", 1, ParserLimits{32});
  // A tag of exactly the limit still counts.
  expectAssembled("<esi:include src=\"/y\"/>", "[include /y||]", 0,
                  ParserLimits{23});
}

// --------------------------------------------------------------------------
// <esi:remove>

TEST(Parser, RemoveDropsItsContentAndAnyEsiInside) {
  expectAssembled(
      R"(a<esi:remove>b<esi:include src="/x"/>c<!--esi d-->e<esi:foo/>)"
      R"(</esi:remove>f)",
      "af", 0);
}

TEST(Parser, NestedRemoveEndsAtItsMatchingCloseWithWarning) {
  expectAssembled("a<esi:remove>b<esi:remove>c</esi:remove>d</esi:remove>e",
                  "ae", 1);
}

TEST(Parser, UnclosedRemoveDropsTheRestWithWarningAtFinish) {
  expectAssembled(R"(a<esi:remove>b<esi:include src="/x"/>c)", "a", 1);
}

TEST(Parser, EmptyRemoveRemovesNothingWithWarning) {
  expectAssembled("a<esi:remove/>b", "ab", 1);
}

TEST(Parser, HtmlCommentInsideRemoveHidesItsClose) {
  expectAssembled("a<esi:remove><!--</esi:remove>--></esi:remove>b", "ab", 0);
}

// --------------------------------------------------------------------------
// <!--esi -->, <esi:comment>, <esi:vars>, unknown tags

TEST(Parser, EsiCommentMarkersAreStrippedAndContentProcessed) {
  expectAssembled(R"(a<!--esi b<esi:include src="/x"/>c-->d)",
                  "a b[include /x||]cd", 0);
  expectAssembled("a<!--esi-->b", "ab", 0);
}

TEST(Parser, EsiCommentEndsAtTheFirstDoubleDashBeforeGreaterThan) {
  expectAssembled("<!--esi a--->b", " a-b", 0);
  expectAssembled("<!--esi a- -> -- >-- ->", " a- -> -- >-- ->", 1);
  expectAssembled("<!--esi a--<b>-->c", " a--<b>c", 0);
}

TEST(Parser, HtmlCommentInsideEsiCommentStaysVerbatim) {
  expectAssembled("<!--esi a<!-- b -->c-->d", " a<!-- b -->cd", 0);
}

TEST(Parser, UnclosedEsiCommentWarnsAtFinish) {
  expectAssembled("a<!--esi b--", "a b--", 1);
}

TEST(Parser, CommentTagIsDropped) {
  expectAssembled(R"(a<esi:comment text="hi"/>b)", "ab", 0);
  expectAssembled(R"(a<esi:comment text="hi"></esi:comment>b)", "ab", 0);
}

TEST(Parser, VarsTagsAreStrippedAndTheirContentProcessed) {
  expectAssembled(
      R"(a<esi:vars>b $(HTTP_HOST) <esi:include src="/x"/></esi:vars>c)",
      "ab [ref $(HTTP_HOST)] [include /x||]c", 0);
}

TEST(Parser, UnknownEsiTagsPassThroughWithWarning) {
  expectAssembled(R"(a<esi:inline name="x">b</esi:inline>c<esi:>)",
                  R"(a<esi:inline name="x">b</esi:inline>c<esi:>)", 3);
}

TEST(Parser, StrayEndTagsAreDroppedWithWarning) {
  expectAssembled("a</esi:remove>b</esi:include>c</esi:vars>d", "abcd", 3);
}

// --------------------------------------------------------------------------
// $(...) references in <esi:vars>

TEST(Parser, ReferencesAreReportedOnlyInsideVars) {
  expectAssembled("$(HTTP_HOST)<esi:vars>$(HTTP_HOST)</esi:vars>$(HTTP_HOST)",
                  "$(HTTP_HOST)[ref $(HTTP_HOST)]$(HTTP_HOST)", 0);
}

TEST(Parser, ReferencesCarryKeysAndDefaultsAsWritten) {
  expectAssembled(
      R"(<esi:vars>$(HTTP_COOKIE{a)b}|'x)\'y')$(QUERY_STRING|bare)</esi:vars>)",
      R"([ref $(HTTP_COOKIE{a)b}|'x)\'y')][ref $(QUERY_STRING|bare)])", 0);
}

TEST(Parser, DollarThatStartsNoReferenceIsText) {
  expectAssembled(
      "<esi:vars>$(document).ready(); $ 5 $(A b) $(lower) $$(HTTP_HOST)"
      "$(A<b>$(B)</esi:vars>",
      "$(document).ready(); $ 5 $(A b) $(lower) $[ref $(HTTP_HOST)]"
      "$(A<b>[ref $(B)]",
      0);
}

TEST(Parser, ReferenceLongerThanTheTagLimitIsTextWithWarning) {
  const std::string page = "<esi:vars>$(A|'" + std::string(40, 'x') + "')";
  expectAssembled(page, page.substr(10), 1, ParserLimits{32});
}

TEST(Parser, ReferenceInsideRemoveOrHtmlCommentIsNotReported) {
  expectAssembled(
      "<esi:vars><esi:remove>$(A)</esi:remove><!-- $(A) -->"
      "<!--esi $(A) --></esi:vars>",
      "<!-- $(A) --> [ref $(A)] ", 0);
}

// --------------------------------------------------------------------------
// choose / when / otherwise, try / attempt / except

TEST(Parser, ChooseReportsItsBranchesWithTheirTests) {
  expectAssembled(
      "<esi:choose> <esi:when test=\"$(HTTP_COOKIE{group})=='Advanced'\">A"
      "</esi:when><esi:when test='$(A) &amp; 1'>B</esi:when>"
      "<esi:otherwise>C</esi:otherwise></esi:choose>",
      "[choose] [when $(HTTP_COOKIE{group})=='Advanced']A[/when]"
      "[when $(A) & 1]B[/when][otherwise]C[/otherwise][/choose]",
      0);
}

TEST(Parser, TryReportsAttemptAndExcept) {
  expectAssembled(
      "<esi:try><esi:attempt><esi:include src=\"/a\"/></esi:attempt>"
      "<esi:except>x</esi:except></esi:try>",
      "[try][attempt][include /a||][/attempt][except]x[/except][/try]", 0);
}

TEST(Parser, ConstructsNest) {
  expectAssembled(
      "<esi:choose><esi:when test='1'><esi:try><esi:attempt><esi:choose>"
      "<esi:otherwise/></esi:choose></esi:attempt></esi:try></esi:when>"
      "</esi:choose>",
      "[choose][when 1][try][attempt][choose][otherwise][/otherwise]"
      "[/choose][/attempt][/try][/when][/choose]",
      0);
}

TEST(Parser, BranchesOutOfPlaceAreDroppedWithWarningKeepingTheirContent) {
  expectAssembled("<esi:when test='1'>a</esi:when><esi:attempt>b</esi:attempt>",
                  "ab", 4);
  expectAssembled("<esi:try><esi:when test='1'>a</esi:when></esi:try>",
                  "[try]a[/try]", 2);
}

TEST(Parser, SecondAttemptOrExceptIsDroppedWithWarning) {
  expectAssembled(
      "<esi:try><esi:except>e</esi:except><esi:attempt>a</esi:attempt>"
      "<esi:except>f</esi:except></esi:try>",
      "[try][except]e[/except]af[/try]", 4);
}

TEST(Parser, EndTagClosesWhatIsOpenInsideItWithWarning) {
  expectAssembled("<esi:choose><esi:when test='1'>a</esi:choose>b",
                  "[choose][when 1]a[/when][/choose]b", 1);
}

TEST(Parser, StrayBlockEndTagIsDroppedWithWarning) {
  expectAssembled("a</esi:when>b</esi:try>c", "abc", 2);
}

TEST(Parser, ConstructsOpenAtTheEndAreClosedWithWarning) {
  expectAssembled("<esi:try><esi:attempt>a", "[try][attempt]a[/attempt][/try]",
                  2);
}

TEST(Parser, ConstructsInsideRemoveAreDropped) {
  expectAssembled("<esi:remove><esi:choose></esi:remove>a", "a", 0);
}

TEST(Parser, ConstructsNestedTooDeepAreDroppedWithTheirEndTags) {
  std::string page;
  std::string expected;
  for (size_t i = 0; i < kMaxBlockDepth + 2; ++i) page += "<esi:try>";
  for (size_t i = 0; i < kMaxBlockDepth; ++i) expected += "[try]";
  for (size_t i = 0; i < kMaxBlockDepth + 2; ++i) page += "</esi:try>";
  for (size_t i = 0; i < kMaxBlockDepth; ++i) expected += "[/try]";
  const Parse parse = parseWhole(page);
  EXPECT_EQ(parse.assembled, expected);
  EXPECT_EQ(parse.warnings.size(), 2u);
}

TEST(Parser, ReplayedConstructsAreThoseTheParseStartsInside) {
  const std::string page = "x</esi:when><esi:otherwise>y</esi:otherwise></esi:choose>z";
  Assembler assembler(page);
  assembler.replay(Block::TRY, true);
  assembler.replay(Block::ATTEMPT, true);
  assembler.replay(Block::ATTEMPT, false);
  assembler.replay(Block::TRY, false);
  assembler.replay(Block::CHOOSE, true);
  assembler.replay(Block::WHEN, true);
  assembler.feedTo(page.size());
  const Parse parse = assembler.finish();
  EXPECT_EQ(parse.assembled, "x[/when][otherwise]y[/otherwise][/choose]z");
  EXPECT_TRUE(parse.warnings.empty());
}

TEST(Parser, WhenWithMalformedAttributesHasAnEmptyTestWithWarning) {
  expectAssembled("<esi:choose><esi:when test>a</esi:when></esi:choose>",
                  "[choose][when]a[/when][/choose]", 1);
}

// --------------------------------------------------------------------------
// HTML comments and CDATA

TEST(Parser, HtmlCommentIsVerbatimAndHidesEsi) {
  expectAssembled(R"(a<!-- <esi:include src="/x"/> -- --->b)",
                  R"(a<!-- <esi:include src="/x"/> -- --->b)", 0);
  expectAssembled("a<!---->b<!--e-->c", "a<!---->b<!--e-->c", 0);
}

TEST(Parser, CdataIsVerbatimAndHidesEsi) {
  expectAssembled(
      R"(a<![CDATA[ <esi:include src="/x"/> ]]]>b<esi:include src="/y"/>)",
      R"(a<![CDATA[ <esi:include src="/x"/> ]]]>b[include /y||])", 0);
}

TEST(Parser, UnclosedHtmlCommentOrCdataIsVerbatimWithWarning) {
  expectAssembled("a<!-- b", "a<!-- b", 1);
  expectAssembled("a<!--e", "a<!--e", 1);
  expectAssembled("a<!--", "a<!--", 1);
  expectAssembled("a<![CDATA[ b", "a<![CDATA[ b", 1);
}

// --------------------------------------------------------------------------
// Streaming

const char MIXED_PAGE[] =
    "<html><head><!-- a comment with <esi:include src=\"/no\"/> --></head>\n"
    "<body class='x'>\n"
    "<esi:include src=\"/frag?a=1&amp;b=2\" alt='/alt?c=3&amp;d=4' "
    "onerror=\"continue\"/>\n"
    "<esi:remove><a href=\"/fallback\">fallback</a>"
    "<esi:include src=\"/removed\"/></esi:remove>\n"
    "<!--esi <p>hidden from browsers <esi:include src=\"frag2\"/></p> -->\n"
    "<esi:comment text=\"dropped\"/>\n"
    "<esi:vars><p>$(HTTP_COOKIE{id})</p></esi:vars>\n"
    "<esi:try><esi:attempt>tried</esi:attempt></esi:try>\n"
    "<script><![CDATA[ if (a < b) { '<esi:include src=\"/no\"/>' } ]]>"
    "</script>\n"
    "<esi:include\n\tsrc = '/odd' alt=\"/q&quot;uote\" \n></esi:include>"
    "<esi:include src=/bare />\n"
    "</esi:remove><esi:include src=\"\"/><ESI:include src=\"/upper\"/>\n"
    "</body></html>\n";

const char MIXED_PAGE_ASSEMBLED[] =
    "<html><head><!-- a comment with <esi:include src=\"/no\"/> --></head>\n"
    "<body class='x'>\n"
    "[include /frag?a=1&b=2|/alt?c=3&d=4|continue]\n"
    "\n"
    " <p>hidden from browsers [include frag2||]</p> \n"
    "\n"
    "<p>[ref $(HTTP_COOKIE{id})]</p>\n"
    "[try][attempt]tried[/attempt][/try]\n"
    "<script><![CDATA[ if (a < b) { '<esi:include src=\"/no\"/>' } ]]>"
    "</script>\n"
    "[include /odd|/q\"uote|][include /bare||]\n"
    "<ESI:include src=\"/upper\"/>\n"
    "</body></html>\n";

TEST(Parser, MixedPageSplitAnywhereOrFedByteByByteIsAssembled) {
  // The stray remove; the empty src.
  expectAssembled(MIXED_PAGE, MIXED_PAGE_ASSEMBLED, 2);
}

TEST(Parser, RandomPagesInRandomChunksAssembleAsWhole) {
  const std::vector<std::string> pieces = {
      "text ", "<", ">", "-", "--", "-->", "]]>", "'", "\"", "=", " ", "\n",
      "/", "<e", "<es", "<esi", "<esi:", "</esi:", "<!-", "<!--", "<!--e",
      "<!--esi", "<![CDATA[", "<esi:include src=\"/a&amp;b\"/>",
      "<esi:include src='/x' alt=\"/y\" onerror=\"continue\">",
      "</esi:include>", "<esi:include", " src=", "\"/q\"", "/>",
      "<esi:remove>", "</esi:remove>", "<esi:comment text='c'/>", "<esi:vars>",
      "</esi:vars>", "<esi:foo a='>'>", "</esi:foo>", "<b class=\"c\">",
      "&amp;", "&#x41;", "$", "$(", "$(HTTP_HOST)", "$(QUERY_STRING{q}|'a)b')",
      "<esi:choose>", "</esi:choose>", "<esi:when test=\"$(A)=='1'\">",
      "</esi:when>", "<esi:otherwise>", "</esi:otherwise>", "<esi:try>",
      "</esi:try>", "<esi:attempt>", "</esi:attempt>", "<esi:except>",
      "</esi:except>", "<esi:otherwise/>", "{", "}", "|",
  };
  std::mt19937 random(20240611);
  for (int iteration = 0; iteration < 3000; ++iteration) {
    std::string page;
    const int count = std::uniform_int_distribution<>(1, 40)(random);
    for (int i = 0; i < count; ++i) {
      page += pieces[std::uniform_int_distribution<size_t>(
          0, pieces.size() - 1)(random)];
    }
    // Some pages run into a small tag limit.
    const ParserLimits limits{iteration % 2 == 0 ? 8192u : 24u};

    std::vector<size_t> cuts;
    const int maxChunk = iteration % 3 == 0 ? 3 : 40;
    for (size_t at = 0;;) {
      at += std::uniform_int_distribution<>(1, maxChunk)(random);
      if (at >= page.size()) break;
      cuts.push_back(at);
    }
    SCOPED_TRACE(page);
    expectSameParse(parseChunks(page, cuts, limits), parseWhole(page, limits));
    if (::testing::Test::HasFailure()) return;
  }
}

// Checks only what a large page needs, without keeping its bytes.
class CountingSink final : public ParserSink {
 public:
  void verbatim(uint64_t, uint64_t length) override { verbatimBytes += length; }
  void include(std::string_view, std::string_view, bool) override {
    ++includes;
  }
  void reference(std::string_view) override {}
  void open(Block, std::string_view) override {}
  void close(Block) override {}
  void warning(uint64_t, std::string_view) override { ++warnings; }

  uint64_t verbatimBytes = 0;
  int includes = 0;
  int warnings = 0;
};

// Feeds about 8 MB of text in 64 KB chunks, after `before`, then `after`,
// checking after each chunk that released() trails by less than a tag.
void expectReleasedKeepsUp(CountingSink& sink, std::string_view before,
                           std::string_view after) {
  const ParserLimits limits;
  Parser parser(sink, limits);
  std::string chunk(64 * 1024, 'x');
  for (size_t i = 0; i < chunk.size(); i += 80) chunk[i] = '\n';
  parser.feed(before);
  uint64_t fed = before.size();
  for (int i = 0; i < 128; ++i) {
    parser.feed(chunk);
    fed += chunk.size();
    ASSERT_GE(parser.released() + limits.maxTagBytes, fed);
  }
  parser.feed(after);
  fed += after.size();
  parser.finish();
  EXPECT_EQ(parser.released(), fed);
}

TEST(Parser, ReleasedKeepsUpWithLargeText) {
  CountingSink sink;
  expectReleasedKeepsUp(sink, "<p>", "</p>");
  EXPECT_EQ(sink.verbatimBytes, 128u * 64 * 1024 + 7);
  EXPECT_EQ(sink.warnings, 0);
}

TEST(Parser, ReleasedKeepsUpPastAnUnterminatedLongTag) {
  CountingSink sink;
  expectReleasedKeepsUp(sink, "<esi:include src=\"", "<esi:include src=/x/>");
  EXPECT_EQ(sink.verbatimBytes, 128u * 64 * 1024 + 18);
  EXPECT_EQ(sink.includes, 1);
  EXPECT_EQ(sink.warnings, 1);
}

TEST(Parser, ReleasedKeepsUpInsideRemove) {
  CountingSink sink;
  expectReleasedKeepsUp(sink, "a<esi:remove>", "</esi:remove>b");
  EXPECT_EQ(sink.verbatimBytes, 2u);
}

TEST(Parser, ReleasedKeepsUpInsideAnHtmlComment) {
  CountingSink sink;
  expectReleasedKeepsUp(sink, "<!--", "-->");
  EXPECT_EQ(sink.verbatimBytes, 128u * 64 * 1024 + 7);
}

TEST(Parser, ReleasedHoldsBackOnlyWhatMayStillGoOut) {
  CountingSink sink;
  Parser parser(sink);
  parser.feed("abc<es");
  EXPECT_EQ(parser.released(), 3u);
  EXPECT_EQ(sink.verbatimBytes, 3u);
  parser.feed("t>");
  EXPECT_EQ(parser.released(), 8u);
  EXPECT_EQ(sink.verbatimBytes, 8u);
  parser.feed("<!--esi a--");
  EXPECT_EQ(parser.released(), 17u);
  parser.feed(">");
  EXPECT_EQ(parser.released(), 20u);
  parser.feed("<esi:remove>b<esi:incl");
  EXPECT_EQ(parser.released(), 42u);
  EXPECT_EQ(sink.verbatimBytes, 10u);
}

}  // namespace
}  // namespace esi
