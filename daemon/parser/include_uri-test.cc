#include "parser/include_uri.h"

#include <gtest/gtest.h>

namespace esi {
namespace {

constexpr std::string_view PAGE = "/shop/a/index.html";
constexpr std::string_view AUTHORITY = "example.com";

struct Allowed {
  std::string_view src;
  std::string_view path;
  std::string_view args;
  std::string_view pageUri = PAGE;
  std::string_view pageAuthority = AUTHORITY;
};

struct Refused {
  std::string_view src;
  std::string_view pageUri = PAGE;
  std::string_view pageAuthority = AUTHORITY;
};

void expectAllowed(std::initializer_list<Allowed> cases) {
  for (const Allowed& c : cases) {
    SCOPED_TRACE(std::string(c.src) + " on " + std::string(c.pageAuthority) +
                 std::string(c.pageUri));
    const IncludeUri uri = resolveInclude(c.src, c.pageUri, c.pageAuthority);
    EXPECT_TRUE(uri.ok) << uri.reason;
    EXPECT_EQ(uri.path, c.path);
    EXPECT_EQ(uri.args, c.args);
    EXPECT_EQ(uri.reason, "");
  }
}

void expectRefused(std::initializer_list<Refused> cases) {
  for (const Refused& c : cases) {
    SCOPED_TRACE(std::string(c.src) + " on " + std::string(c.pageAuthority) +
                 std::string(c.pageUri));
    const IncludeUri uri = resolveInclude(c.src, c.pageUri, c.pageAuthority);
    EXPECT_FALSE(uri.ok) << uri.path;
    EXPECT_NE(uri.reason, "");
    EXPECT_EQ(uri.path, "");
    EXPECT_EQ(uri.args, "");
  }
}

TEST(IncludeUri, RelativeSrcResolvesAgainstThePageDirectory) {
  expectAllowed({
      {"frag", "/shop/a/frag", ""},
      {"../x?y=1", "/shop/x", "y=1"},
      {"./b/c", "/shop/a/b/c", ""},
      {"b/", "/shop/a/b/", ""},
      {"frag", "/frag", "", "/"},
      {"frag", "/dir/frag", "", "/dir/"},
      {"frag", "/frag", "", ""},
      {"frag", "/frag", "", "index.html"},
      {"?a=1", "/shop/a/index.html", "a=1"},
  });
}

TEST(IncludeUri, RelativeSrcKeepsThePagePathAsDecoded) {
  expectAllowed({{"x%2541", "/50%/x%41", "", "/50%/page"}});
}

TEST(IncludeUri, AbsolutePathIsKept) {
  expectAllowed({
      {"/x", "/x", ""},
      {"/", "/", ""},
  });
}

TEST(IncludeUri, SameAuthorityUrlsBecomeLocalPaths) {
  expectAllowed({
      {"http://example.com/x", "/x", ""},
      {"https://example.com/x?a=1", "/x", "a=1"},
      {"//example.com/x", "/x", ""},
      {"HTTP://EXAMPLE.com/x", "/x", ""},
      {"hTTpS://Example.COM/x", "/x", ""},
      {"http://example.com", "/", ""},
      {"http://example.com?q=1", "/", "q=1"},
      {"http://example.com:8080/x", "/x", "", PAGE, "example.com:8080"},
      {"http://example.com/x", "/x", "", PAGE, "Example.Com"},
  });
}

TEST(IncludeUri, DefaultPortsEqualNoPort) {
  expectAllowed({
      {"http://example.com:80/x", "/x", ""},
      {"https://example.com:443/x", "/x", ""},
      {"http://example.com/x", "/x", "", PAGE, "example.com:80"},
      {"https://example.com/x", "/x", "", PAGE, "example.com:443"},
      {"//example.com:80/x", "/x", ""},
      {"//example.com:443/x", "/x", ""},
      {"//example.com/x", "/x", "", PAGE, "example.com:443"},
  });
  expectRefused({
      {"http://example.com:443/x"},
      {"https://example.com:80/x"},
      {"http://example.com:8080/x"},
      {"http://example.com/x", PAGE, "example.com:8080"},
  });
}

TEST(IncludeUri, OtherAuthoritiesAreRefused) {
  expectRefused({
      {"http://evil/"},
      {"https://evil.com/x"},
      {"//evil/x"},
      {"http://example.com.evil.com/"},
      {"http://example.com%2eevil/"},
      {"http://[::1]/"},
      {"http://127.0.0.1/"},
      {"http:///x"},
      {"//"},
      {"http://example.com/x", PAGE, ""},
  });
}

TEST(IncludeUri, UserinfoIsRefused) {
  expectRefused({
      {"http://127.0.0.1@evil/"},
      {"http://example.com@evil/"},
      {"http://evil@example.com/"},
      {"//user:pass@example.com/x"},
  });
}

TEST(IncludeUri, BackslashesThatBrowsersReadAsSlashesAreRefused) {
  expectRefused({
      {"http:\\\\evil\\x"},
      {"/\\evil"},
      {"\\\\evil\\x"},
      {"\\x"},
      {"http://evil\\@example.com/"},
      {"//example.com\\@evil/"},
      {"http:/\\evil/"},
      {"/%5Cevil.example/x"},
      {"/%2e%2e%5cetc/passwd"},
      {"/a\\b"},
  });
}

TEST(IncludeUri, RunsOfSlashesAreMerged) {
  expectAllowed({
      {"/%2Fevil.example/x", "/evil.example/x", ""},
      {"//example.com//evil.example/x", "/evil.example/x", ""},
      {"/a//b///c", "/a/b/c", ""},
  });
}

TEST(IncludeUri, OtherSchemesAreRefused) {
  expectRefused({
      {"javascript:alert(1)"},
      {"file:///etc/passwd"},
      {"ftp://example.com/x"},
      {"data:text/html,x"},
      {"gopher://example.com/"},
      {"C:\\x"},
      {"http:/x"},
      {"http:x"},
  });
}

TEST(IncludeUri, QueryIsKeptVerbatimAndFragmentDropped) {
  expectAllowed({
      {"/x?a=1&b=2#frag", "/x", "a=1&b=2"},
      {"/x#frag?not=args", "/x", ""},
      {"/x?a=%2F%0d%0a&b=?", "/x", "a=%2F%0d%0a&b=?"},
      {"/x?", "/x", ""},
  });
}

TEST(IncludeUri, PathIsPercentDecodedBeforeDotSegmentsGo) {
  expectAllowed({
      {"/a%2Fb", "/a/b", ""},
      {"/a%2fb%20c", "/a/b c", ""},
      {"/a/%2e%2E/b", "/b", ""},
      {"/a/b%2F..%2Fc", "/a/c", ""},
      {"%2e%2e/%2e%2e/etc", "/etc", ""},
      {"/bad%zz%4", "/bad%zz%4", ""},
      {"/caf%C3%A9", "/caf\xc3\xa9", ""},
  });
}

TEST(IncludeUri, DotSegmentsAreRemoved) {
  expectAllowed({
      {"/a/./b/../c", "/a/c", ""},
      {"/a/b/..", "/a/", ""},
      {"/a/b/.", "/a/b/", ""},
      {"/a/..", "/", ""},
      {"/.", "/", ""},
      {"/a/.../b", "/a/.../b", ""},
      {"/a/..b/c", "/a/..b/c", ""},
      {"//example.com/a/../b", "/b", ""},
  });
}

TEST(IncludeUri, ClimbingAboveTheRootIsRefused) {
  expectRefused({
      {"/a/../../b"},
      {"/.."},
      {"/../x"},
      {"%2e%2e/%2e%2e/etc", "/index.html"},
      {"../../../x"},
      {"/a/%2e%2e%2f%2e%2e/b"},
      {"http://example.com/../x"},
  });
}

TEST(IncludeUri, ControlCharactersAreRefused) {
  expectRefused({
      {"/a/%0d%0aX-Injected:1"},
      {"/a%00"},
      {"/a%7f"},
      {"/a%09b"},
      {std::string_view("/a\0b", 4)},
      {"/a\nb"},
      {"/x?a=1\r\nX-Injected:1"},
      {"/x?a=1 b"},
      {std::string_view("/x?a\0", 5)},
      {"/x?a=\x7f"},
  });
}

TEST(IncludeUri, EmptySrcIsRefused) {
  expectRefused({{""}, {"#frag"}});
}

}  // namespace
}  // namespace esi
