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

}  // namespace
}  // namespace esi
