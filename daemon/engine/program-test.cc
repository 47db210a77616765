#include "engine/program.h"

#include <gtest/gtest.h>

#include <string>

namespace esi {
namespace {

const PageAddress kPage{"/dir/page.html", "example.com"};

// src rendered for a request whose cookie v has this value (raw, as sent).
IncludeUri renderWithCookie(std::string_view src, const std::string& value) {
  const std::string cookie = "v=" + value;
  RequestInputs inputs;
  inputs.cookie = cookie;
  const RequestVariables variables(inputs, CookieAllowList({"*"}));
  return renderInclude(Template::compile(src), variables, kPage);
}

TEST(RenderInclude, PlainValueFillsItsSegment) {
  const IncludeUri uri = renderWithCookie("frag/$(HTTP_COOKIE{v}).html?v=$(HTTP_COOKIE{v})", "a b");
  ASSERT_TRUE(uri.ok) << uri.reason;
  EXPECT_EQ(uri.path, "/dir/frag/a b.html");
  EXPECT_EQ(uri.args, "v=a%20b");
}

TEST(RenderInclude, ValueCannotClimbOrAddASegment) {
  for (const std::string value :
       {"..", ".", "...", "../x", "a/b", "/etc/passwd", "a\\b", "%2F", "%2E%2E", "%2e%2e%2fx"}) {
    SCOPED_TRACE(value);
    const IncludeUri uri = renderWithCookie("/a/$(HTTP_COOKIE{v})/b", value);
    if (uri.ok) {
      // Only as data: one segment, below /a/, that decodes to the value.
      EXPECT_EQ(uri.path, "/a/" + value + "/b");
    } else {
      EXPECT_FALSE(uri.reason.empty());
    }
  }
  EXPECT_FALSE(renderWithCookie("/a/$(HTTP_COOKIE{v})/b", "..").ok);
  EXPECT_FALSE(renderWithCookie("/a/$(HTTP_COOKIE{v})/b", "../x").ok);
  EXPECT_TRUE(renderWithCookie("/a/$(HTTP_COOKIE{v})/b", "%2E%2E").ok);
}

TEST(RenderInclude, ValueNeverJoinsTheTemplatesTextIntoAnEscapeOrDotSegment) {
  // "%2" + "F" would decode to '/', "." + "." to a dot segment.
  const IncludeUri escape = renderWithCookie("/a/%2$(HTTP_COOKIE{v})", "F");
  ASSERT_TRUE(escape.ok) << escape.reason;
  EXPECT_EQ(escape.path, "/a/%2F");
  EXPECT_FALSE(renderWithCookie("/a/.$(HTTP_COOKIE{v})/b", ".").ok);
  const IncludeUri dots = renderWithCookie("/a/.$(HTTP_COOKIE{v})/b", ".x");
  ASSERT_TRUE(dots.ok);
  EXPECT_EQ(dots.path, "/a/..x/b");
}

TEST(RenderInclude, EmptyValueInThePathIsRefusedUnlessItHasADefault) {
  EXPECT_FALSE(renderWithCookie("/a/$(HTTP_COOKIE{none})/b", "x").ok);
  const IncludeUri uri = renderWithCookie("/a/$(HTTP_COOKIE{none}|guest)/b", "x");
  ASSERT_TRUE(uri.ok);
  EXPECT_EQ(uri.path, "/a/guest/b");
}

TEST(RenderInclude, ControlBytesInThePathAreRefused) {
  EXPECT_FALSE(renderWithCookie("/a/$(HTTP_COOKIE{v})", "x\r\nX-Injected: 1").ok);
  EXPECT_FALSE(renderWithCookie("/a/$(HTTP_COOKIE{v})", std::string("x\0y", 3)).ok);
}

TEST(RenderInclude, QuestionMarkAndHashInAValueAreDataInThePath) {
  const IncludeUri uri = renderWithCookie("/a/$(HTTP_COOKIE{v})?k=1", "x?y#z");
  ASSERT_TRUE(uri.ok);
  EXPECT_EQ(uri.path, "/a/x?y#z");
  EXPECT_EQ(uri.args, "k=1");
}

TEST(RenderInclude, ValuesInTheQueryCannotAddAParameterOrAHeader) {
  const IncludeUri uri =
      renderWithCookie("/a?q=$(HTTP_COOKIE{v})&k=1", "x&admin=1\r\nX: y#f </esi:vars>$('\"");
  ASSERT_TRUE(uri.ok) << uri.reason;
  EXPECT_EQ(uri.path, "/a");
  EXPECT_EQ(uri.args, "q=x%26admin%3D1%0D%0AX%3A%20y%23f%20%3C%2Fesi%3Avars%3E%24%28%27%22&k=1");
}

TEST(RenderInclude, ValueCannotNameAnotherAuthority) {
  EXPECT_FALSE(renderWithCookie("//$(HTTP_COOKIE{v})/a", "evil.example").ok);
  EXPECT_FALSE(renderWithCookie("http://$(HTTP_COOKIE{v})/a", "evil.example").ok);
}

TEST(RenderInclude, ValueOfTenKilobytesIsTakenAsAbsent) {
  // esi_expr reads 8 KiB of a header: a longer cookie is not there at all.
  EXPECT_FALSE(renderWithCookie("/a/$(HTTP_COOKIE{v})", std::string(10 * 1024, 'x')).ok);
  const IncludeUri uri = renderWithCookie("/a/$(HTTP_COOKIE{v}|d)", std::string(10 * 1024, 'x'));
  ASSERT_TRUE(uri.ok);
  EXPECT_EQ(uri.path, "/a/d");
}

// --- Evaluator -----------------------------------------------------------------

std::vector<Instruction> evaluate(const std::vector<ProgramStep>& program,
                                  const RequestValues& values) {
  Evaluator evaluator(kPage, values);
  std::vector<Instruction> out;
  for (const ProgramStep& step : program) evaluator.step(step, out);
  return out;
}

TEST(Evaluator, LiteralValueIsHtmlEscapedAndNeverReadAgain) {
  RequestValues values;
  values.cookies = "v=</esi:vars><script>$(HTTP_HOST)\"'&";
  values.host = "secret";
  const auto out = evaluate({LiteralStep{Template::compile("$(HTTP_COOKIE{v})")}}, values);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(std::get<LiteralText>(out[0]).bytes,
            "&lt;/esi:vars&gt;&lt;script&gt;$(HTTP_HOST)&quot;&#39;&amp;");
}

TEST(Evaluator, EmptyLiteralEmitsNothing) {
  EXPECT_TRUE(evaluate({LiteralStep{Template::compile("$(HTTP_COOKIE{v})")}}, {}).empty());
}

TEST(Evaluator, ContiguousVerbatimRunsGoOutAsOne) {
  const auto out = evaluate({VerbatimRun{0, 3}, VerbatimRun{3, 4}, VerbatimRun{9, 1}}, {});
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(std::get<VerbatimRun>(out[0]).length, 7u);
}

TEST(Evaluator, IncludeRefusedForThisRequestHasAnEmptyPath) {
  IncludeStep step;
  step.src = Template::compile("/u/$(HTTP_COOKIE{id})");
  step.alt = Template::compile("/guest");
  RequestValues values;
  values.cookies = "id=../../admin";
  const auto out = evaluate({step}, values);
  ASSERT_EQ(out.size(), 1u);
  const auto& call = std::get<IncludeCall>(out[0]);
  EXPECT_TRUE(call.path.empty());
  EXPECT_EQ(call.altPath, "/guest");
}

}  // namespace
}  // namespace esi
