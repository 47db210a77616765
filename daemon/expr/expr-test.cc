#include <gtest/gtest.h>

#include <ctime>

#include "expr/expression.h"
#include "expr/template.h"
#include "expr/variables.h"

namespace esi {
namespace {

// The example values of the spec's table of variables (section 4).
constexpr RequestInputs SPEC_TABLE = {
    .host = "esi.xyz.com",
    .cookie = "id=571; visits=42",
    .referer = "http://roberts.xyz.com/",
    .userAgent = "Mozilla; MSIE 5.5",
    .acceptLanguage = "da, en-gb, en",
    .queryString = "first=Robin&last=Roberts",
};

const CookieAllowList ALL_COOKIES({"*"});

VariableRef ref(Variable variable) { return {variable, false, ""}; }

VariableRef ref(Variable variable, std::string key) {
  return {variable, true, std::move(key)};
}

// "NAME" or "NAME{key}", as written inside $( ).
VariableRef named(std::string_view spelled) {
  const size_t brace = spelled.find('{');
  if (brace == std::string_view::npos) return ref(variableNamed(spelled));
  return ref(
      variableNamed(spelled.substr(0, brace)),
      std::string(spelled.substr(brace + 1, spelled.size() - brace - 2)));
}

// Each variable, spelled as in $( ), has the value beside it.
void expectValues(
    const RequestVariables& variables,
    std::initializer_list<std::pair<std::string_view, std::string_view>>
        values) {
  for (const auto& [spelled, value] : values) {
    EXPECT_EQ(variables.value(named(spelled)), value) << spelled;
  }
}

// Processor time, not wall time: the machine may be busy with other work.
double cpuSecondsSince(std::clock_t start) {
  return static_cast<double>(std::clock() - start) / CLOCKS_PER_SEC;
}

std::string html(std::string_view text, const RequestVariables& variables) {
  return Template::compile(text).render(variables, Escaping::HTML);
}

std::string url(std::string_view text, const RequestVariables& variables) {
  return Template::compile(text).render(variables, Escaping::URL);
}

bool holds(std::string_view text, const RequestVariables& variables) {
  const Expression expression = Expression::compile(text);
  EXPECT_TRUE(expression.ok()) << text << ": " << expression.error();
  return expression.evaluate(variables);
}

void expectTrue(std::initializer_list<std::string_view> texts,
                const RequestVariables& variables) {
  for (const std::string_view text : texts) {
    EXPECT_TRUE(holds(text, variables)) << text;
  }
}

void expectFalse(std::initializer_list<std::string_view> texts,
                 const RequestVariables& variables) {
  for (const std::string_view text : texts) {
    EXPECT_FALSE(holds(text, variables)) << text;
  }
}

void expectMalformed(std::initializer_list<std::string_view> texts) {
  const RequestVariables variables(SPEC_TABLE, ALL_COOKIES);
  for (const std::string_view text : texts) {
    const Expression expression = Expression::compile(text);
    EXPECT_FALSE(expression.ok()) << text;
    EXPECT_NE(expression.error().find("at byte"), std::string::npos)
        << text << ": " << expression.error();
    EXPECT_FALSE(expression.evaluate(variables)) << text;
  }
}

// ==========================================================================
// Request variables

TEST(ExprVariables, SpecTableExamplesEvaluateAsTheSpecSays) {
  const RequestVariables v(SPEC_TABLE, ALL_COOKIES);
  expectValues(v, {
      {"HTTP_COOKIE{visits}", "42"},  // 4.1.1
      {"HTTP_COOKIE{id}", "571"},
      {"HTTP_ACCEPT_LANGUAGE{en-gb}", "true"},
      {"HTTP_ACCEPT_LANGUAGE{da}", "true"},
      {"HTTP_ACCEPT_LANGUAGE{fr}", "false"},
      {"HTTP_HOST", "esi.xyz.com"},
      {"HTTP_REFERER", "http://roberts.xyz.com/"},
      {"QUERY_STRING{first}", "Robin"},
      {"QUERY_STRING{last}", "Roberts"},
      {"QUERY_STRING", "first=Robin&last=Roberts"},
      {"HTTP_USER_AGENT", "Mozilla; MSIE 5.5"},
      {"HTTP_USER_AGENT{browser}", "MSIE"},
      {"HTTP_USER_AGENT{version}", "5.5"},
      {"HTTP_USER_AGENT{os}", "OTHER"},
      {"HTTP_ACCEPT_LANGUAGE", "da, en-gb, en"},
  });
}

TEST(ExprVariables, NamesAreTheSpecsUppercaseOnes) {
  EXPECT_EQ(variableNamed("HTTP_HOST"), Variable::HTTP_HOST);
  EXPECT_EQ(variableNamed("QUERY_STRING"), Variable::QUERY_STRING);
  EXPECT_EQ(variableNamed("http_host"), Variable::UNKNOWN);
  EXPECT_EQ(variableNamed("HTTP_HEADER"), Variable::UNKNOWN);
  EXPECT_EQ(nameOf(Variable::HTTP_ACCEPT_LANGUAGE), "HTTP_ACCEPT_LANGUAGE");
  EXPECT_EQ(headerOf(Variable::HTTP_ACCEPT_LANGUAGE), "Accept-Language");
  EXPECT_EQ(headerOf(Variable::HTTP_USER_AGENT), "User-Agent");
  EXPECT_EQ(headerOf(Variable::QUERY_STRING), "");
  EXPECT_EQ(headerOf(Variable::UNKNOWN), "");
}

TEST(ExprVariables, UnknownVariablesAndKeysAreEmpty) {
  const RequestVariables v(SPEC_TABLE, ALL_COOKIES);
  expectValues(v, {
      {"UNKNOWN", ""},
      {"HTTP_HOST{x}", ""},
      {"HTTP_REFERER{}", ""},
      {"HTTP_COOKIE{none}", ""},
      {"HTTP_COOKIE{}", ""},
      {"HTTP_USER_AGENT{Browser}", ""},
      {"QUERY_STRING{none}", ""},
      {"HTTP_ACCEPT_LANGUAGE{}", "false"},
  });
  const RequestVariables none;
  expectValues(none, {
      {"HTTP_HOST", ""},
      {"HTTP_USER_AGENT{browser}", "OTHER"},
  });
}

TEST(ExprVariables, DictionaryKeysAreCaseSensitive) {
  const RequestVariables v({.cookie = "Visits=1; visits=2",
                            .queryString = "Q=1&q=2"},
                           ALL_COOKIES);
  expectValues(v, {
      {"HTTP_COOKIE{visits}", "2"},
      {"HTTP_COOKIE{Visits}", "1"},
      {"HTTP_COOKIE{VISITS}", ""},
      {"QUERY_STRING{q}", "2"},
      {"QUERY_STRING{Q}", "1"},
  });
}

TEST(ExprVariables, NoCookieIsExposedUnlessAllowed) {
  const RequestInputs inputs{.cookie = "session=secret; id=571; visits=42"};
  const RequestVariables none(inputs, CookieAllowList());
  expectValues(none, {
      {"HTTP_COOKIE", ""},
      {"HTTP_COOKIE{id}", ""},
  });

  const RequestVariables some(inputs, CookieAllowList({"visits", "id"}));
  expectValues(some, {
      {"HTTP_COOKIE", "id=571; visits=42"},
      {"HTTP_COOKIE{id}", "571"},
      {"HTTP_COOKIE{session}", ""},
  });

  const RequestVariables all(inputs, ALL_COOKIES);
  expectValues(all, {
      {"HTTP_COOKIE", "session=secret; id=571; visits=42"},
      {"HTTP_COOKIE{session}", "secret"},
  });

  // "*" is the whole name, not a pattern.
  const RequestVariables star(inputs, CookieAllowList({"s*"}));
  expectValues(star, {
      {"HTTP_COOKIE{session}", ""},
  });
}

TEST(ExprVariables, CookiesAreReadAsBrowsersSendThem) {
  const RequestVariables v(
      {.cookie = " a = 1 ;b=x=y;;novalue; =anonymous;a=2;c=\"quoted\";d="},
      ALL_COOKIES);
  expectValues(v, {
      {"HTTP_COOKIE{a}", "1"},  // the first
      {"HTTP_COOKIE{b}", "x=y"},
      {"HTTP_COOKIE{novalue}", ""},
      {"HTTP_COOKIE{c}", "\"quoted\""},
      {"HTTP_COOKIE{d}", ""},
      {"HTTP_COOKIE", "a=1; b=x=y; a=2; c=\"quoted\"; d="},
  });
}

TEST(ExprVariables, QueryParametersArePercentAndPlusDecoded) {
  const RequestVariables v(
      {.queryString = "a=1&a=2&b=x+y%20z&%63=see&bad=%zz%4&flag&e=&crlf=%0d%0A"
                      "%00%3C&=anon"},
      ALL_COOKIES);
  expectValues(v, {
      {"QUERY_STRING{a}", "1"},
      {"QUERY_STRING{b}", "x y z"},
      {"QUERY_STRING{c}", "see"},
      {"QUERY_STRING{bad}", "%zz%4"},
      {"QUERY_STRING{flag}", ""},
      {"QUERY_STRING{e}", ""},
      {"QUERY_STRING{crlf}", std::string_view("\r\n\0<", 4)},
      {"QUERY_STRING{}", "anon"},
      {"QUERY_STRING", "a=1&a=2&b=x+y%20z&%63=see&bad=%zz%4&flag&e=&crlf="
                       "%0d%0A%00%3C&=anon"},
  });
}

TEST(ExprVariables, AcceptLanguageMatchesLanguageRanges) {
  const RequestVariables v(
      {.acceptLanguage = "en-GB;q=0.8, FR , de;q=0, pt-br;q=0.000, es;q=1"},
      ALL_COOKIES);
  auto accepts = [&](std::string tag) {
    return v.value(ref(Variable::HTTP_ACCEPT_LANGUAGE, std::move(tag)));
  };
  EXPECT_EQ(accepts("en-GB"), "true");
  EXPECT_EQ(accepts("en-gb"), "true");   // tags ignore case
  EXPECT_EQ(accepts("fr"), "true");
  EXPECT_EQ(accepts("fr-CA"), "true");   // range "fr" covers fr-CA
  EXPECT_EQ(accepts("en"), "false");     // range "en-GB" does not cover en
  EXPECT_EQ(accepts("english"), "false");
  EXPECT_EQ(accepts("de"), "false");     // q=0: not acceptable
  EXPECT_EQ(accepts("pt-br"), "false");
  EXPECT_EQ(accepts("es"), "true");

  const RequestVariables any({.acceptLanguage = "*;q=0.1"}, ALL_COOKIES);
  expectValues(any, {
      {"HTTP_ACCEPT_LANGUAGE{ja}", "true"},
  });
  const RequestVariables empty({}, ALL_COOKIES);
  expectValues(empty, {
      {"HTTP_ACCEPT_LANGUAGE{en}", "false"},
  });
}

struct UserAgentCase {
  std::string_view userAgent, browser, os, version;
};

TEST(ExprVariables, UserAgentsAreClassifiedAsTheSpecSaysAndModernOnesMapped) {
  const UserAgentCase cases[] = {
      // ESI 1.0's time.
      {"Mozilla/4.0 (compatible; MSIE 5.5; Windows NT 5.0)", "MSIE", "WIN",
       "5.5"},
      {"Mozilla/4.0 (compatible; MSIE 5.23; Mac_PowerPC)", "MSIE", "MAC",
       "5.23"},
      {"Mozilla/4.7 [en] (X11; I; Linux 2.2.14 i686)", "MOZILLA", "UNIX",
       "4.7"},
      {"Mozilla/4.78 [en] (Win98; U)", "MOZILLA", "WIN", "4.78"},
      {"Mozilla/4.0 (compatible; MSIE 6.0b; Windows NT 5.1)", "MSIE", "WIN",
       "6.0b"},
      // Today's: every Mozilla/5.0 is MOZILLA 5.0.
      {"Mozilla/5.0 (Windows NT 10.0; Win64; x64) AppleWebKit/537.36 (KHTML, "
       "like Gecko) Chrome/120.0.0.0 Safari/537.36",
       "MOZILLA", "WIN", "5.0"},
      {"Mozilla/5.0 (X11; Linux x86_64; rv:121.0) Gecko/20100101 "
       "Firefox/121.0",
       "MOZILLA", "UNIX", "5.0"},
      {"Mozilla/5.0 (Macintosh; Intel Mac OS X 10_15_7) AppleWebKit/605.1.15 "
       "(KHTML, like Gecko) Version/17.1 Safari/605.1.15",
       "MOZILLA", "MAC", "5.0"},
      {"Mozilla/5.0 (iPhone; CPU iPhone OS 17_1 like Mac OS X) "
       "AppleWebKit/605.1.15 (KHTML, like Gecko) Version/17.1 Mobile/15E148 "
       "Safari/604.1",
       "MOZILLA", "MAC", "5.0"},
      {"Mozilla/5.0 (Linux; Android 14; Pixel 8) AppleWebKit/537.36 (KHTML, "
       "like Gecko) Chrome/120.0.0.0 Mobile Safari/537.36",
       "MOZILLA", "UNIX", "5.0"},
      {"Mozilla/5.0 (Windows NT 10.0; Win64; x64) AppleWebKit/537.36 (KHTML, "
       "like Gecko) Chrome/120.0.0.0 Safari/537.36 Edg/120.0.0.0",
       "MOZILLA", "WIN", "5.0"},
      {"Mozilla/5.0 (X11; CrOS x86_64 14541.0.0) AppleWebKit/537.36", "MOZILLA",
       "UNIX", "5.0"},
      {"Mozilla/5.0 (Windows NT 6.1; Trident/7.0; rv:11.0) like Gecko", "MSIE",
       "WIN", "11.0"},
      {"Mozilla/5.0 (compatible; Googlebot/2.1; +http://www.google.com/"
       "bot.html)",
       "MOZILLA", "OTHER", "5.0"},
      // Others.
      {"Opera/9.80 (Windows NT 6.0) Presto/2.12.388 Version/12.14", "OTHER",
       "WIN", "9.80"},
      {"curl/8.1.2", "OTHER", "OTHER", "8.1.2"},
      {"MyApp/1.2 CFNetwork/1410.0.3 Darwin/22.6.0", "OTHER", "MAC", "1.2"},
      {"Wget", "OTHER", "OTHER", ""},
      {"not a product/1", "OTHER", "OTHER", ""},
      {"", "OTHER", "OTHER", ""},
  };
  for (const UserAgentCase& c : cases) {
    SCOPED_TRACE(c.userAgent);
    const RequestVariables v({.userAgent = c.userAgent}, ALL_COOKIES);
    EXPECT_EQ(v.value(ref(Variable::HTTP_USER_AGENT, "browser")), c.browser);
    EXPECT_EQ(v.value(ref(Variable::HTTP_USER_AGENT, "os")), c.os);
    EXPECT_EQ(v.value(ref(Variable::HTTP_USER_AGENT, "version")), c.version);
  }
}

TEST(ExprVariables, SingleValuesPastTheLimitAreAbsent) {
  const std::string longHost(9000, 'h');
  const RequestVariables v({.host = longHost,
                            .referer = std::string(8192, 'r'),
                            .userAgent = "Mozilla/5.0 " + longHost},
                           ALL_COOKIES);
  expectValues(v, {
      {"HTTP_HOST", ""},
      {"HTTP_REFERER", std::string(8192, 'r')},
      {"HTTP_USER_AGENT", ""},
      {"HTTP_USER_AGENT{browser}", "OTHER"},
  });
}

TEST(ExprVariables, ListsPastTheLimitKeepTheirWholeEntries) {
  const std::string megabyte(1 << 20, 'x');
  const RequestVariables v(
      {.cookie = "a=1; big=" + megabyte + "; after=2",
       .acceptLanguage = "fr, " + megabyte + ", de",
       .queryString = "q=1&big=" + megabyte + "&after=2"},
      ALL_COOKIES);
  expectValues(v, {
      {"HTTP_COOKIE{a}", "1"},
      {"HTTP_COOKIE{big}", ""},
      {"HTTP_COOKIE{after}", ""},
      {"HTTP_COOKIE", "a=1"},
      {"HTTP_ACCEPT_LANGUAGE{fr}", "true"},
      {"HTTP_ACCEPT_LANGUAGE{de}", "false"},
      {"QUERY_STRING{q}", "1"},
      {"QUERY_STRING{big}", ""},
      {"QUERY_STRING", "q=1"},
  });

  // An entry ending exactly at the limit counts.
  const RequestVariables exact({.cookie = "a=" + std::string(6, 'v') + ";b=1"},
                               ALL_COOKIES, RequestLimits{8});
  expectValues(exact, {
      {"HTTP_COOKIE{a}", "vvvvvv"},
      {"HTTP_COOKIE{b}", ""},
  });
}

TEST(ExprVariables, ManyEntriesAreReadInLittleTime) {
  std::string cookies, query;
  for (int i = 0; i < 100000; ++i) {
    cookies += "c" + std::to_string(i) + "=" + std::to_string(i) + "; ";
    query += "p" + std::to_string(i % 7) + "=v&";
  }
  const std::clock_t start = std::clock();
  for (int i = 0; i < 5; ++i) {
    const RequestVariables v({.cookie = cookies, .queryString = query},
                             ALL_COOKIES, RequestLimits{4 << 20});
    EXPECT_EQ(v.value(ref(Variable::HTTP_COOKIE, "c99999")), "99999");
    EXPECT_EQ(v.value(ref(Variable::QUERY_STRING, "p3")), "v");
  }
  EXPECT_LT(cpuSecondsSince(start), 10);  // quadratic would take hours
}

// ==========================================================================
// Substitution

TEST(ExprTemplate, SpecVarsExampleSubstitutesTheCookie) {  // 3.7
  const RequestVariables v({.cookie = "type=premium"}, ALL_COOKIES);
  const char* vars =
      R"(<img src="http://www.example.com/$(HTTP_COOKIE{type})/hello.gif"/ >)";
  EXPECT_EQ(html(vars, v),
            R"(<img src="http://www.example.com/premium/hello.gif"/ >)");
}

TEST(ExprTemplate, SpecEsiCommentExampleSubstitutesTheName) {  // 3.8
  const RequestVariables v({.cookie = "name=Robin"}, ALL_COOKIES);
  EXPECT_EQ(html("<p>Hello, $(HTTP_COOKIE{name})!</p>", v),
            "<p>Hello, Robin!</p>");
}

TEST(ExprTemplate, SpecVariableExamplesSubstitute) {  // 4, 4.1
  const RequestVariables v({.host = "esi.xyz.com",
                            .cookie = "username=robin; visits=42"},
                           ALL_COOKIES);
  EXPECT_EQ(html("$(HTTP_HOST)", v), "esi.xyz.com");
  EXPECT_EQ(html("$(HTTP_COOKIE{username})", v), "robin");
  EXPECT_EQ(html("$(HTTP_COOKIE{visits})", v), "42");
}

TEST(ExprTemplate, SpecDefaultExamplesApplyWhereTheValueIsEmpty) {  // 4.2
  const char* src = "http://example.com/$(HTTP_COOKIE{id}|default).html";
  const RequestVariables without({}, ALL_COOKIES);
  EXPECT_EQ(url(src, without), "http://example.com/default.html");
  const RequestVariables with({.cookie = "id=571"}, ALL_COOKIES);
  EXPECT_EQ(url(src, with), "http://example.com/571.html");
  const RequestVariables empty({.cookie = "id="}, ALL_COOKIES);
  EXPECT_EQ(url(src, empty), "http://example.com/default.html");

  EXPECT_EQ(html("$(HTTP_COOKIE{first_name}|'new user')", without),
            "new user");
  EXPECT_EQ(url("$(HTTP_COOKIE{first_name}|'new user')", without),
            "new%20user");
  EXPECT_EQ(html("$(HTTP_COOKIE{first_name}|'new user')",
                 RequestVariables({.cookie = "first_name=Robin"}, ALL_COOKIES)),
            "Robin");
}

TEST(ExprTemplate, DefaultsAreQuotedStringsOrOneBareWord) {
  const RequestVariables v({}, ALL_COOKIES);
  EXPECT_EQ(html(R"($(HTTP_HOST|'it\'s \\ \x'))", v), R"(it&#39;s \ \x)");
  EXPECT_EQ(html("$(HTTP_HOST|'')", v), "");
  EXPECT_EQ(html("$(HTTP_HOST|)", v), "");
  EXPECT_EQ(html("$(HTTP_HOST|a.b-c/d)", v), "a.b-c/d");
  EXPECT_EQ(html("$(HTTP_HOST{k}|x)", v), "x");
  // The spec wants quotes around whitespace: this is text.
  EXPECT_EQ(html("$(HTTP_HOST|new user)", v), "$(HTTP_HOST|new user)");
  EXPECT_EQ(html("$(HTTP_HOST|'unclosed)", v), "$(HTTP_HOST|'unclosed)");
  EXPECT_EQ(html("$(HTTP_HOST|'a'b)", v), "$(HTTP_HOST|'a'b)");
}

TEST(ExprTemplate, UnknownVariablesAreEmpty) {
  const RequestVariables v(SPEC_TABLE, ALL_COOKIES);
  EXPECT_EQ(html("[$(HTTP_FOO)][$(X{y})][$(HTTP_HEADER{Host}|none)]", v),
            "[][][none]");
}

TEST(ExprTemplate, MalformedReferencesAreText) {
  const RequestVariables v({.host = "h"}, ALL_COOKIES);
  EXPECT_EQ(html("$(", v), "$(");
  EXPECT_EQ(html("a$", v), "a$");
  EXPECT_EQ(html("$(HTTP_HOST", v), "$(HTTP_HOST");
  EXPECT_EQ(html("$()", v), "$()");
  EXPECT_EQ(html("$( HTTP_HOST)", v), "$( HTTP_HOST)");
  EXPECT_EQ(html("$(HTTP_HOST )", v), "$(HTTP_HOST )");
  EXPECT_EQ(html("$(HTTP_COOKIE{x)", v), "$(HTTP_COOKIE{x)");
  EXPECT_EQ(html("$(1ABC)", v), "$(1ABC)");
  EXPECT_EQ(html("$ (HTTP_HOST)", v), "$ (HTTP_HOST)");
  EXPECT_EQ(html("$$(HTTP_HOST)", v), "$h");
  EXPECT_EQ(html("$($(HTTP_HOST))", v), "$(h)");
  EXPECT_EQ(html("$(HTTP_HOST|$(HTTP_HOST))", v), "$(HTTP_HOST|h)");
  EXPECT_EQ(html("$(HTTP_HOST$(HTTP_HOST)", v), "$(HTTP_HOSTh");
  // A reference longer than 1 KiB is text.
  const std::string longKey(1100, 'k');
  EXPECT_EQ(html("$(HTTP_COOKIE{" + longKey + "})", v),
            "$(HTTP_COOKIE{" + longKey + "})");
}

TEST(ExprTemplate, LowercaseNamesLikeJQueryAreLeftAlone) {
  const RequestVariables v({.host = "h"}, ALL_COOKIES);
  const char* script =
      "$(document).ready(function() { $(this).hide(); $('#a'); $(\"b\"); });";
  EXPECT_EQ(html(script, v), script);
  EXPECT_FALSE(Template::compile(script).hasReferences());
  EXPECT_EQ(html("$(http_host)", v), "$(http_host)");
}

TEST(ExprTemplate, HtmlEscapingKeepsValuesFromAddingMarkup) {
  const RequestVariables v(
      {.cookie = R"(x="><script>alert('1')</script>&)",
       .queryString = "end=%3C/esi:vars%3E%3Cesi:include%20src=/admin/%3E"
                      "&ref=$(HTTP_COOKIE{x})&nul=%00%0D%0A"},
      ALL_COOKIES);
  EXPECT_EQ(html(R"x(<a title="$(HTTP_COOKIE{x})">)x", v),
            "<a title=\"&quot;&gt;&lt;script&gt;alert(&#39;1&#39;)"
            "&lt;/script&gt;&amp;\">");
  EXPECT_EQ(html("$(QUERY_STRING{end})", v),
            "&lt;/esi:vars&gt;&lt;esi:include src=/admin/&gt;");
  // Values are data: a reference inside one is not read again.
  EXPECT_EQ(html("$(QUERY_STRING{ref})", v), "$(HTTP_COOKIE{x})");
  EXPECT_EQ(html("$(QUERY_STRING{nul})", v), std::string("\0\r\n", 3));
}

TEST(ExprTemplate, UrlEscapingKeepsValuesFromAddingStructure) {
  const RequestVariables v(
      {.queryString = "p=..%2F..%2Fadmin%3Fx%3D1%26y%23z&crlf=a%0D%0AHost:%20"
                      "evil%00&ok=Az09-._~&utf=caf%C3%A9&pct=%25%2541+"},
      ALL_COOKIES);
  EXPECT_EQ(url("/frag/$(QUERY_STRING{p})?a=1", v),
            "/frag/..%2F..%2Fadmin%3Fx%3D1%26y%23z?a=1");
  EXPECT_EQ(url("/f?v=$(QUERY_STRING{crlf})", v),
            "/f?v=a%0D%0AHost%3A%20evil%00");
  EXPECT_EQ(url("$(QUERY_STRING{ok})", v), "Az09-._~");
  EXPECT_EQ(url("$(QUERY_STRING{utf})", v), "caf%C3%A9");
  EXPECT_EQ(url("$(QUERY_STRING{pct})", v), "%25%2541%20");
  EXPECT_EQ(url("/$(QUERY_STRING)", v),
            "/p%3D..%252F..%252Fadmin%253Fx%253D1%2526y%2523z%26crlf%3Da%250D"
            "%250AHost%3A%2520evil%2500%26ok%3DAz09-._~%26utf%3Dcaf%25C3%25A9"
            "%26pct%3D%2525%252541%2B");
  // The page's own text is the page's.
  EXPECT_EQ(url("/a b?<$(HTTP_HOST|x)>", v), "/a b?<x>");
}

TEST(ExprTemplate, TextWithoutReferencesIsUnchanged) {
  const RequestVariables v(SPEC_TABLE, ALL_COOKIES);
  const std::string text = "<p>plain &amp; $ ( ) { } | ' \" text</p>";
  const Template t = Template::compile(text);
  EXPECT_FALSE(t.hasReferences());
  EXPECT_EQ(t.render(v, Escaping::HTML), text);
  EXPECT_EQ(t.render(v, Escaping::URL), text);
  EXPECT_EQ(html("", v), "");
}

TEST(ExprTemplate, RenderToAppendsAndIsRepeatable) {
  const RequestVariables v(SPEC_TABLE, ALL_COOKIES);
  const Template t = Template::compile("[$(HTTP_COOKIE{id})]");
  std::string out = "x";
  t.renderTo(out, v, Escaping::HTML);
  t.renderTo(out, v, Escaping::HTML);
  EXPECT_EQ(out, "x[571][571]");
}

TEST(ExprTemplate, UsesListsEachKnownVariableOnceInOrder) {
  const Template t = Template::compile(
      "$(QUERY_STRING{a}) $(HTTP_HOST) $(HTTP_FOO) $(QUERY_STRING{a}|x) "
      "$(QUERY_STRING) $(HTTP_COOKIE{id}) $(HTTP_HOST) $(QUERY_STRING{b})");
  const std::vector<VariableRef> expected = {
      ref(Variable::QUERY_STRING, "a"), ref(Variable::HTTP_HOST),
      ref(Variable::QUERY_STRING), ref(Variable::HTTP_COOKIE, "id"),
      ref(Variable::QUERY_STRING, "b")};
  EXPECT_EQ(t.uses(), expected);
  EXPECT_TRUE(Template::compile("plain").uses().empty());
}

TEST(ExprTemplate, HostileTextCompilesInLinearTime) {
  std::string text;
  for (int i = 0; i < 100000; ++i) text += "$(HTTP_COOKIE{";
  const std::clock_t start = std::clock();
  const RequestVariables v(SPEC_TABLE, ALL_COOKIES);
  EXPECT_EQ(html(text, v), text);
  std::string many;
  for (int i = 0; i < 100000; ++i) many += "$(HTTP_HOST)$(HTTP_COOKIE{id})";
  const Template t = Template::compile(many);
  EXPECT_EQ(t.uses().size(), 2u);
  EXPECT_EQ(t.render(v, Escaping::URL).size(), 100000u * 14);
  EXPECT_LT(cpuSecondsSince(start), 10);  // quadratic would take hours
}

// ==========================================================================
// Expressions

TEST(ExprExpression, SpecChooseExampleSelectsByCookie) {  // 3.3
  const char* advanced = "$(HTTP_COOKIE{group})=='Advanced'";
  const char* basic = "$(HTTP_COOKIE{group})=='Basic User'";
  const RequestVariables a({.cookie = "group=Advanced"}, ALL_COOKIES);
  const RequestVariables b({.cookie = "group=Basic User"}, ALL_COOKIES);
  const RequestVariables n({}, ALL_COOKIES);
  EXPECT_TRUE(holds(advanced, a));
  EXPECT_FALSE(holds(basic, a));
  EXPECT_FALSE(holds(advanced, b));
  EXPECT_TRUE(holds(basic, b));
  EXPECT_FALSE(holds(advanced, n));
  EXPECT_FALSE(holds(basic, n));
}

TEST(ExprExpression, SpecHostExampleComparesTheHost) {  // 5
  const RequestVariables v({.host = "example.com"}, ALL_COOKIES);
  expectTrue({"$(HTTP_HOST) == 'example.com'"}, v);
  expectFalse({"$(HTTP_HOST) == 'example.org'"}, v);
}

TEST(ExprExpression, SpecOperatorExamplesEvaluate) {  // 5.1
  const RequestVariables v;
  expectFalse({"!(1==1)", "!('a'<='c')", "(4!=5)&(4==5)"}, v);
  expectTrue({"(1==1)|('abc'=='def')"}, v);
}

TEST(ExprExpression, SpecExamplesThatWillNotEvaluate) {  // 5.1
  // Double quotes delimit no literal.
  expectMalformed({R"(("abc" | "edf"))"});
  // (1 & 4) "will not evaluate" in the spec; bare operands are conditions
  // here (expression.h), so it is true.
  EXPECT_TRUE(holds("(1 & 4)", RequestVariables()));
}

TEST(ExprExpression, SpecListAndDictionaryExamplesAreConditions) {  // 4.1
  const RequestVariables v(SPEC_TABLE, ALL_COOKIES);
  expectTrue({"$(HTTP_ACCEPT_LANGUAGE{en-gb})", "$(HTTP_COOKIE{visits})==42",
              "$(HTTP_COOKIE{visits})", "$(HTTP_USER_AGENT{browser})=='MSIE'",
              "$(HTTP_USER_AGENT{version}) >= 4",
              "$(QUERY_STRING{first})=='Robin'"},
             v);
  expectFalse({"$(HTTP_ACCEPT_LANGUAGE{fr})", "$(HTTP_COOKIE{username})",
               "$(HTTP_USER_AGENT{os})=='WIN'"},
              v);
}

TEST(ExprExpression, ComparisonBindsTighterThanNotThanAndThanOr) {
  const RequestVariables v;
  expectTrue({"!1==2", "! 1 == 2", "1==1|1==2&1==2", "1==2&1==2|1==1",
              "!(1==2)&!(2==3)", "!!(1==1)", "!!!(1==2)"},
             v);
  expectFalse({"(1==1|1==2)&1==2", "!1==1", "1==2|!(1==1)", "!!'x'==''"}, v);
}

TEST(ExprExpression, NumbersCompareAsNumbersWhateverTheirQuotes) {
  const RequestVariables v({.cookie = "n=01; v=1.50; neg=-3"}, ALL_COOKIES);
  expectTrue({"'1.0' == 1", "'01' == 1", "01 == '1'", "1.50 == 1.5",
              "-0 == 0", "+1 == 1", "-1 < 0", "-2 < -1.5", "-1.5 > -2",
              "10 > 9", "'10' > '9'", "2 >= 2.0", "2 <= 2",
              "12345678901234567890 < 12345678901234567891",
              "0.1000000000000000000001 > 0.1",
              "100000000000000000000000000000000000000000 > 99",
              "$(HTTP_COOKIE{n}) == 1", "$(HTTP_COOKIE{v}) < 2",
              "$(HTTP_COOKIE{neg}) < -2.5", "$(HTTP_COOKIE{neg}) != 3"},
             v);
  expectFalse({"'1.0' != 1", "1 == 2", "-1 > 0", "0.5 > 0.50"}, v);
}

TEST(ExprExpression, OtherValuesCompareAsStringsByteByByte) {
  const RequestVariables v;
  expectTrue({"'a' < 'b'", "'B' < 'a'", "'10' < '9a'", "'1.05a' > '1.05'",
              "'3.01.23' < '3.1'", "'abc' == 'abc'", "'abc' != 'ABC'",
              "'\xff' > 'a'", "'a' < 'ab'", "' 1' != 1", "'1e3' != 1000",
              "'.5' != 0.5", "'1.' != 1", "'0x10' != 16"},
             v);
  expectFalse({"'abc' == 'ABC'", "'b' <= 'a'"}, v);
}

TEST(ExprExpression, EmptyOperandsOrderNothingButCompareEqual) {
  const RequestVariables v;
  expectFalse({"$(HTTP_COOKIE{none}) < 1", "$(HTTP_COOKIE{none}) >= ''",
               "'' <= ''", "1 > ''", "'' < 'a'", "$(HTTP_HOST) == 'a'",
               "$(HTTP_HOST) != ''", "$(HTTP_HOST) has ''", "'abc' has ''"},
              v);
  expectTrue({"$(HTTP_COOKIE{none}) == ''", "$(HTTP_COOKIE{none}) != 'a'",
              "$(UNKNOWN_VARIABLE) == ''", "!($(HTTP_HOST) == 'a')"},
             v);
}

TEST(ExprExpression, BareOperandsAreTrueUnlessEmptyZeroOrFalse) {
  const RequestVariables v({.cookie = "set=yes; zero=0.0; no=false"},
                           ALL_COOKIES);
  expectTrue({"'abc'", "1", "-1", "0.01", "'0a'", "'False'", "'true'",
              "$(HTTP_COOKIE{set})", "!$(HTTP_COOKIE{none})",
              "$(HTTP_COOKIE{set}) & 'x'", "'' | 'x'", "($(HTTP_COOKIE{set}))"},
             v);
  expectFalse({"''", "0", "'0'", "'-0.00'", "'false'", "$(HTTP_COOKIE{zero})",
               "$(HTTP_COOKIE{no})", "$(HTTP_COOKIE{none})", "1 & 0",
               "0 | ''"},
              v);
}

TEST(ExprExpression, DefaultsApplyInExpressions) {
  const RequestVariables v({.cookie = "set=yes"}, ALL_COOKIES);
  expectTrue({"$(HTTP_COOKIE{x}|'guest') == 'guest'",
              "$(HTTP_COOKIE{set}|'guest') == 'yes'",
              "$(HTTP_COOKIE{x}|5) > 4"},
             v);
}

TEST(ExprExpression, LiteralsTakeBackslashEscapedQuotes) {
  const RequestVariables v({.cookie = "q=it's; b=a\\b"}, ALL_COOKIES);
  expectTrue({R"($(HTTP_COOKIE{q}) == 'it\'s')",
              R"($(HTTP_COOKIE{b}) == 'a\\b')", R"('a\b' == 'a\\b')",
              "'' == ''", "'a b' == 'a b'", "'(' != ')'", "'|' != '&'"},
             v);
}

TEST(ExprExpression, WhitespaceIsOptionalAroundSymbols) {
  const RequestVariables v({.cookie = "g=Advanced"}, ALL_COOKIES);
  expectTrue({"$(HTTP_COOKIE{g})=='Advanced'",
              " \t$(HTTP_COOKIE{g}) \r\n== 'Advanced' ", "(1==1)&(2==2)",
              "( ( 1 == 1 ) )", "!(1==2)", "1<2", "2>1", "1<=1", "1>=1",
              "1!=2"},
             v);
}

TEST(ExprExpression, HasFindsSubstrings) {
  const RequestVariables v(
      {.cookie = "x=xxabcxx", .userAgent = "Mozilla/5.0 (iPhone; CPU OS)"},
      ALL_COOKIES);
  expectTrue(
      {"$(HTTP_COOKIE{x}) has 'abc'", "$(HTTP_COOKIE{x}) has 'x'",
       "$(HTTP_USER_AGENT) has 'iPhone'", "$(HTTP_USER_AGENT) has_i 'IPHONE'",
       "'aaab' has 'aab'", "'abababac' has 'ababac'",
       "$(HTTP_COOKIE{x}) has $(HTTP_COOKIE{x})",
       "!($(HTTP_COOKIE{x}) has 'abd')"},
      v);
  expectFalse({"$(HTTP_COOKIE{x}) has 'ABC'", "$(HTTP_USER_AGENT) has 'IPHONE'",
               "'ab' has 'abc'", "$(HTTP_COOKIE{none}) has 'a'",
               "'abc' has $(HTTP_COOKIE{none})", "'abababab' has 'ababac'"},
              v);
}

TEST(ExprExpression, WordOperatorsNeedWhitespaceAndLowercase) {
  expectMalformed({"'abc'has 'b'", "'abc' has'b'", "'abc'has'b'",
                   "'abc' HAS 'b'", "'abc' Has 'b'", "'abc' has",
                   "has 'b'", "'a' contains 'b'"});
}


TEST(ExprExpression, MatchesSearchesWithARegularExpression) {
  const RequestVariables v(
      {.referer = "https://Shop.example.com/cart?id=7",
       .userAgent = "Mozilla/5.0 (Linux; Android 14) Mobile"},
      ALL_COOKIES);
  expectTrue({"$(HTTP_REFERER) matches 'example\\.com'",
              "$(HTTP_REFERER) matches '^https?://[A-Za-z.]+/cart'",
              "$(HTTP_REFERER) matches_i '^HTTPS://SHOP\\.'",
              "$(HTTP_USER_AGENT) matches 'Android [0-9]+'",
              "$(HTTP_REFERER) matches '''id=\\d+$'''",
              "$(HTTP_REFERER) matches '''it's'''|1==1",
              "'' matches '^$'", "'caf\xc3\xa9' matches_i 'CAF\xc3\x89'"},
             v);
  expectFalse({"$(HTTP_REFERER) matches '^https://[a-z.]+/'",
               "$(HTTP_REFERER) matches 'EXAMPLE'",
               "$(HTTP_REFERER) matches '^example'",
               "$(HTTP_COOKIE{none}) matches 'a'"},
              v);
}

TEST(ExprExpression, MatchesPatternsAreLiteralsThatCompile) {
  expectMalformed({"'a' matches $(HTTP_HOST)", "'a' matches '('",
                   "'a' matches '(a)\\1'", "'a' matches 'a{1001}'",
                   "'a' matches '''unclosed''"});
  const std::string longPattern =
      "'a' matches '" + std::string(1025, 'a') + "'";
  expectMalformed({longPattern});
}

TEST(ExprExpression, CatastrophicPatternsRunInLinearTime) {
  const std::string subject(8000, 'a');
  const RequestVariables v({.cookie = "x=" + subject + "!"}, ALL_COOKIES);
  const std::clock_t start = std::clock();
  for (int i = 0; i < 100; ++i) {
    EXPECT_FALSE(holds("$(HTTP_COOKIE{x}) matches '^(a+)+$'", v));
    EXPECT_FALSE(holds("$(HTTP_COOKIE{x}) matches '(a|aa)*b'", v));
  }
  EXPECT_LT(cpuSecondsSince(start), 10);  // quadratic would take hours
}

TEST(ExprExpression, CaseMattersInValuesButNotInLanguageTags) {
  const RequestVariables v(
      {.host = "Example.com", .acceptLanguage = "EN-gb"}, ALL_COOKIES);
  expectTrue({"$(HTTP_HOST) == 'Example.com'", "$(HTTP_HOST) has_i 'EXAMPLE'",
              "$(HTTP_ACCEPT_LANGUAGE{en-GB})"},
             v);
  expectFalse({"$(HTTP_HOST) == 'example.com'"}, v);
  expectMalformed({"$(http_host) == ''", "$(Http_Host) == ''"});
}

TEST(ExprExpression, HostileValuesStayValues) {
  const RequestVariables v(
      {.cookie = "x=a' | '1'=='1; y=) | (1==1",
       .queryString = "q=%27%29%7C%281%3D%3D1&n=%00&crlf=%0D%0A"},
      ALL_COOKIES);
  expectFalse({"$(HTTP_COOKIE{x}) == 'a'", "$(HTTP_COOKIE{y}) == ''",
               "$(QUERY_STRING{q}) == 'x'", "$(QUERY_STRING{n}) == ''",
               "$(QUERY_STRING{crlf}) == ''"},
              v);
  expectTrue({"$(HTTP_COOKIE{x}) == 'a\\' | \\'1\\'==\\'1'",
              "$(QUERY_STRING{q}) == '\\')|(1==1'", "$(QUERY_STRING{n})",
              "$(QUERY_STRING{crlf}) has '\n'"},
             v);
}

TEST(ExprExpression, MalformedExpressionsAreFalseWithAReason) {
  expectMalformed({
      "", "   ", "1 2", "'a' 'b'", "(1==1", "1==1)", "()", "=", "1 = 1",
      "1 === 1", "&&", "1 && 1", "1 || 1", "1 &", "| 1", "!", "1 !",
      "$(HTTP_HOST) == example.com", "example", "'unclosed", "'a\\'",
      "1 == 1 == 1", "1 < 2 < 3", "(1==1)==(1==1)", "!1 == !1", "1.2.3 == 1",
      "1. == 1", "- 1 == -1", "$(HTTP_HOST", "$(HTTP_HOST|a b) == ''",
      "$HTTP_HOST == ''", "$", "#", "1 == 1 # comment", "\xc3\xa9",
      std::string_view("1 ==\0 1", 7), "{1}", "1 == 1;",
  });
  EXPECT_EQ(Expression::compile("1 == ").error(),
            "at byte 5: expected an operand, found end");
  EXPECT_EQ(Expression::compile("'a' = 'b'").error(),
            "at byte 4: '=' is no operator: write '=='");
  EXPECT_EQ(Expression::compile("(1 == 1").error(),
            "at byte 0: unclosed parenthesis");
}

TEST(ExprExpression, DefaultExpressionIsMalformed) {
  const Expression e;
  EXPECT_FALSE(e.ok());
  EXPECT_FALSE(e.evaluate(RequestVariables()));
  EXPECT_TRUE(e.uses().empty());
}

TEST(ExprExpression, NestingIsBoundedAt64) {
  const RequestVariables v;
  auto nested = [](int depth, std::string_view open, std::string_view close) {
    std::string text;
    for (int i = 0; i < depth; ++i) text += open;
    text += "1==1";
    for (int i = 0; i < depth; ++i) text += close;
    return text;
  };
  EXPECT_TRUE(holds(nested(64, "(", ")"), v));
  EXPECT_TRUE(holds(nested(64, "!", ""), v));
  EXPECT_TRUE(holds(nested(32, "!(", ")"), v));
  expectMalformed({nested(65, "(", ")"), nested(65, "!", ""),
                   nested(33, "!(", ")"), nested(100000, "(", ")"),
                   nested(100000, "!", "")});
  const Expression e = Expression::compile(nested(65, "(", ")"));
  EXPECT_EQ(e.error(), "at byte 64: nested more than 64 deep");
  EXPECT_TRUE(Expression::compile(nested(100, "(", ")"),
                                  ExpressionLimits{.maxNesting = 100})
                  .ok());
}

TEST(ExprExpression, LongFlatExpressionsNeedNoDepth) {
  std::string any = "1==2";
  std::string all = "1==1";
  for (int i = 0; i < 100000; ++i) {
    any += "|1==2";
    all += "&'a'";
  }
  any += "|$(HTTP_HOST)=='h'";
  const RequestVariables v({.host = "h"}, ALL_COOKIES);
  EXPECT_TRUE(holds(any, v));
  EXPECT_TRUE(holds(all, v));
  EXPECT_FALSE(holds("!(" + all + ")", v));
}

TEST(ExprExpression, UsesListsEachKnownVariableOnceInOrder) {
  const Expression e = Expression::compile(
      "$(HTTP_COOKIE{a}) == 1 | ($(HTTP_HOST) has 'x' & !$(HTTP_COOKIE{a}|2))"
      " | $(NOT_A_VARIABLE) | $(HTTP_ACCEPT_LANGUAGE{da}) | 'literal'");
  ASSERT_TRUE(e.ok()) << e.error();
  const std::vector<VariableRef> expected = {
      ref(Variable::HTTP_COOKIE, "a"), ref(Variable::HTTP_HOST),
      ref(Variable::HTTP_ACCEPT_LANGUAGE, "da")};
  EXPECT_EQ(e.uses(), expected);
  EXPECT_TRUE(Expression::compile("1==1").uses().empty());
}

TEST(ExprExpression, CopiesEvaluateAlike) {
  const RequestVariables v({.host = "shop.example.com"}, ALL_COOKIES);
  std::vector<Expression> copies;
  {
    const Expression original = Expression::compile(
        "$(HTTP_HOST) has 'shop' & !($(HTTP_HOST) == 'x')");
    copies.assign(3, original);
  }
  for (const Expression& e : copies) EXPECT_TRUE(e.evaluate(v));
}

}  // namespace
}  // namespace esi
