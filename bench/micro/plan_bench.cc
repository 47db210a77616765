// Parse plans: what a cache hit costs esid with a plan (Plan::evaluate, per
// request) against what the plan saves (parsing the page).
//
// The page is bench.py's language page: text with 4 <esi:vars> blocks of 4
// references each and 4 <esi:choose> blocks, evaluated for bench.py's
// client (its Cookie, query string, Accept-Language, User-Agent and Host);
// "without" is the same page with their outcome written in and one
// <esi:comment>, as bench.py's baseline.  The page is parsed once, as on the
// recording hit; each iteration then evaluates the plan for one request
// (BM_PlanEvaluate) or parses the page again (BM_PlanParse).

#include "engine/stats.h"
#include "engine/stream.h"
#include "plans/plan_store.h"

#include <benchmark/benchmark.h>

#include <optional>
#include <random>
#include <string>
#include <string_view>
#include <utility>

namespace {

// (markup, what it yields for kValues)
constexpr std::pair<std::string_view, std::string_view> kVars[] = {
    {"$(HTTP_COOKIE{user})", "alice"},
    {"$(HTTP_COOKIE{theme})", "dark"},
    {"$(HTTP_COOKIE{session}|anonymous)", "anonymous"},
    {"$(QUERY_STRING{q})", "shoes"},
    {"$(QUERY_STRING{page})", "2"},
    {"$(QUERY_STRING{sort}|price)", "price"},
    {"$(HTTP_ACCEPT_LANGUAGE{en})", "true"},
    {"$(HTTP_ACCEPT_LANGUAGE{de})", "false"},
    {"$(HTTP_USER_AGENT{browser})", "MOZILLA"},
    {"$(HTTP_USER_AGENT{os})", "UNIX"},
    {"$(HTTP_USER_AGENT{version})", "5.0"},
    {"$(HTTP_HOST)", "shop.example"},
    {"$(HTTP_REFERER|direct)", "direct"},
    {"$(HTTP_COOKIE{user})", "alice"},
    {"$(QUERY_STRING{q})", "shoes"},
    {"$(HTTP_COOKIE{missing}|none)", "none"},
};

constexpr std::pair<std::string_view, std::string_view> kChooses[] = {
    {"<esi:choose><esi:when test=\"$(HTTP_COOKIE{theme}) == 'dark'\">"
     "<p>dark theme</p></esi:when><esi:otherwise><p>light theme</p>"
     "</esi:otherwise></esi:choose>",
     "<p>dark theme</p>"},
    {"<esi:choose><esi:when test=\"$(QUERY_STRING{page}) > 1\">"
     "<a>previous page</a></esi:when><esi:otherwise></esi:otherwise>"
     "</esi:choose>",
     "<a>previous page</a>"},
    {"<esi:choose><esi:when test=\"$(HTTP_ACCEPT_LANGUAGE{de})\">"
     "<p>Hallo</p></esi:when><esi:when test=\"$(HTTP_ACCEPT_LANGUAGE{en})\">"
     "<p>Hello</p></esi:when><esi:otherwise><p>Hi</p></esi:otherwise>"
     "</esi:choose>",
     "<p>Hello</p>"},
    {"<esi:choose><esi:when test=\"$(HTTP_USER_AGENT{browser}) == 'MSIE'\">"
     "<p>old browser</p></esi:when><esi:otherwise><p>modern browser</p>"
     "</esi:otherwise></esi:choose>",
     "<p>modern browser</p>"},
};

const esi::RequestValues kValues{
    .host = "shop.example",
    .userAgent = "Mozilla/5.0 (X11; Linux x86_64; rv:120.0) Gecko/20100101 "
                 "Firefox/120.0",
    .referer = "",
    .acceptLanguage = "en-GB,en;q=0.8,fr;q=0.5",
    .queryString = "q=shoes&page=2",
    .cookies = "user=alice; theme=dark",
};

const esi::PageAddress kPage{"/lang/page.html", "shop.example"};

constexpr std::string_view kWords[] = {
    "lorem", "ipsum", "dolor", "sit", "amet", "consectetur", "adipiscing",
    "elit", "sed", "do", "eiusmod", "tempor", "incididunt", "ut", "labore"};

// Text-heavy filler: a '<' every 71 bytes or so, no tag cut in two.
std::string text(size_t size, std::mt19937& rng) {
  std::uniform_int_distribution<size_t> pick(0, std::size(kWords) - 1);
  std::string out;
  for (;;) {
    std::string unit = "<b>";
    while (unit.size() < 71) {
      unit += kWords[pick(rng)];
      unit += ' ';
    }
    if (out.size() + unit.size() > size) break;
    out += unit;
  }
  out.resize(size, ' ');
  return out;
}

// The page with its constructs (withConstructs) or their outcome, in 8
// pieces of text: a choose after every even one, a vars block after every
// odd one.
std::string languagePage(size_t size, bool withConstructs) {
  std::mt19937 rng(static_cast<uint32_t>(size));
  std::string page =
      withConstructs ? "" : "<esi:comment text=\"a planned page\"/>";
  for (size_t i = 0; i < 8; ++i) {
    page += text(size / 8, rng);
    if (i % 2 == 0) {
      const auto& [markup, outcome] = kChooses[i / 2];
      page += withConstructs ? markup : outcome;
    } else {
      page += withConstructs ? "<esi:vars><ul>" : "<ul>";
      for (size_t v = (i / 2) * 4; v < (i / 2) * 4 + 4; ++v) {
        page += "<li>";
        page += withConstructs ? kVars[v].first : kVars[v].second;
        page += "</li>";
      }
      page += withConstructs ? "</ul></esi:vars>" : "</ul>";
    }
  }
  return page;
}

// The plan a recording hit makes of the page.
std::optional<esi::Plan> planOf(const std::string& page) {
  esi::Stats stats;
  esi::Stream stream(kPage.uri, kPage.authority, stats);
  stream.setRequestValues(kValues);
  stream.record(page.size());
  stream.feed(page);
  stream.finish();
  return esi::buildPlan(stream.recordedProgram(), stream.recordedBody());
}

// range(0): page bytes; range(1): 1 with the constructs, 0 without.
void BM_PlanEvaluate(benchmark::State& state) {
  const std::string page = languagePage(static_cast<size_t>(state.range(0)),
                                        state.range(1) != 0);
  const std::optional<esi::Plan> plan = planOf(page);
  if (!plan) {
    state.SkipWithError("the page has no plan");
    return;
  }
  esi::PlanEvaluation evaluation;
  for (auto _ : state) {
    plan->evaluate(kPage, kValues, evaluation);
    benchmark::DoNotOptimize(evaluation.size());
  }
  state.counters["steps"] = static_cast<double>(evaluation.size());
}

// What the plan replaces: parsing the page and evaluating it, per request.
void BM_PlanParse(benchmark::State& state) {
  const std::string page = languagePage(static_cast<size_t>(state.range(0)),
                                        state.range(1) != 0);
  esi::Stats stats;
  for (auto _ : state) {
    esi::Stream stream(kPage.uri, kPage.authority, stats);
    stream.setRequestValues(kValues);
    stream.feed(page);
    stream.finish();
    benchmark::DoNotOptimize(stream.takeInstructions().size());
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) *
                          static_cast<int64_t>(page.size()));
}

void pageArgs(benchmark::internal::Benchmark* b) {
  for (int64_t size : {16 << 10, 256 << 10}) {
    for (int64_t constructs : {0, 1}) b->Args({size, constructs});
  }
  b->ArgNames({"bytes", "constructs"});
}

BENCHMARK(BM_PlanEvaluate)->Apply(pageArgs);
BENCHMARK(BM_PlanParse)->Apply(pageArgs);

}  // namespace

BENCHMARK_MAIN();
