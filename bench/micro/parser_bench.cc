// Parser throughput: MB/s of page fed through esi::Parser in NGINX-sized
// chunks, on the pages of bench/'s ESI-cost matrix.
//
// markup-dense pages have one '<' every 11 bytes, text-heavy ones every 71
// (the two ends the seed measured between); 0 or 16 <esi:include> tags are
// spread evenly through the page.  The sink only counts, so what is measured
// is the scan and the tag parse, nothing downstream.
//
// What a parse plan costs instead of this parse: plan_bench.cc.

#include "parser/parser.h"

#include <benchmark/benchmark.h>

#include <cstdint>
#include <random>
#include <string>
#include <string_view>

namespace {

constexpr std::string_view kWords[] = {
    "lorem", "ipsum", "dolor", "sit", "amet", "consectetur", "adipiscing",
    "elit", "sed", "do", "eiusmod", "tempor", "incididunt", "ut", "labore",
    "et", "dolore", "magna", "aliqua", "enim", "minim", "veniam", "quis",
    "nostrud", "exercitation", "ullamco", "laboris", "nisi", "aliquip"};

// A page of `size` bytes with a '<' every `gap` bytes and `includes`
// include tags spread evenly, as bench.py's cost pages.
std::string makePage(size_t size, size_t gap, int includes) {
  std::mt19937 rng(static_cast<uint32_t>(size + gap + includes));
  std::uniform_int_distribution<size_t> pick(0, std::size(kWords) - 1);
  std::string tags;
  for (int i = 0; i < includes; ++i) {
    tags += "<esi:include src=\"/cf/" + std::to_string(i) + "\"/>";
  }
  const size_t fillerSize = size > tags.size() ? size - tags.size() : 0;
  std::string filler;
  filler.reserve(fillerSize + gap);
  bool closing = false;
  while (filler.size() < fillerSize) {
    std::string unit = closing ? "</b>" : "<b>";
    closing = !closing;
    while (unit.size() < gap) {
      std::string w(kWords[pick(rng)]);
      w += ' ';
      unit += w.substr(0, gap - unit.size());
    }
    filler += unit;
  }
  filler.resize(fillerSize);
  if (includes == 0) return filler;

  std::string page;
  page.reserve(size);
  size_t from = 0;
  for (int i = 0; i < includes; ++i) {
    size_t at = filler.find('<', fillerSize * (i + 1) / (includes + 1));
    if (at == std::string::npos) at = fillerSize;
    page.append(filler, from, at - from);
    page += "<esi:include src=\"/cf/" + std::to_string(i) + "\"/>";
    from = at;
  }
  page.append(filler, from, std::string::npos);
  return page;
}

class CountingSink : public esi::ParserSink {
 public:
  void verbatim(uint64_t, uint64_t length) override { verbatimBytes += length; }
  void include(std::string_view src, std::string_view, bool) override {
    includes += 1;
    benchmark::DoNotOptimize(src.data());
  }
  void warning(uint64_t, std::string_view) override { warnings += 1; }

  uint64_t verbatimBytes = 0;
  uint64_t includes = 0;
  uint64_t warnings = 0;
};

// range(0): page bytes; range(1): includes; range(2): chunk bytes.
void parse(benchmark::State& state, size_t gap) {
  const auto size = static_cast<size_t>(state.range(0));
  const auto includes = static_cast<int>(state.range(1));
  const auto chunk = static_cast<size_t>(state.range(2));
  const std::string page = makePage(size, gap, includes);
  const std::string_view view(page);

  uint64_t found = 0;
  for (auto _ : state) {
    CountingSink sink;
    esi::Parser parser(sink);
    for (size_t at = 0; at < view.size(); at += chunk) {
      parser.feed(view.substr(at, chunk));
    }
    parser.finish();
    found = sink.includes;
    benchmark::DoNotOptimize(sink.verbatimBytes);
  }
  if (found != static_cast<uint64_t>(includes)) {
    state.SkipWithError("the parser did not find every include");
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) *
                          static_cast<int64_t>(size));
  state.counters["pages/s"] =
      benchmark::Counter(static_cast<double>(state.iterations()),
                         benchmark::Counter::kIsRate);
}

void BM_ParseMarkupDense(benchmark::State& state) { parse(state, 11); }
void BM_ParseTextHeavy(benchmark::State& state) { parse(state, 71); }

// Page sizes of the cost matrix, 0 and 16 includes, in 16 KB chunks (the
// module's default esi_buffer_size); then one size in 4 KB and 256 KB chunks
// to show what the chunk size does.
void pageArgs(benchmark::internal::Benchmark* b) {
  for (int64_t size : {16 << 10, 256 << 10, 4 << 20}) {
    for (int64_t includes : {0, 16}) b->Args({size, includes, 16 << 10});
  }
  b->Args({256 << 10, 0, 4 << 10});
  b->Args({256 << 10, 0, 256 << 10});
  b->ArgNames({"bytes", "includes", "chunk"});
}

BENCHMARK(BM_ParseMarkupDense)->Apply(pageArgs);
BENCHMARK(BM_ParseTextHeavy)->Apply(pageArgs);

}  // namespace

BENCHMARK_MAIN();
