// esid's Prometheus page: every counter and gauge of `esictl stats`, with
// labels where one count has kinds, and the histograms.  The one renderer
// behind both GET /metrics and `esictl stats --prometheus`.

#pragma once

#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "engine/stats.h"
#include "metrics/histogram.h"

namespace esi {

struct MetricsSources {
  const Stats& stats;
  // What `esictl stats` prints: stats.toJson() with the arena's, the
  // fleet's and the rings' counters.
  const nlohmann::json& counters;
  const Histogram& scanSeconds;
  uint64_t scansFailed = 0;
};

std::string renderMetrics(const MetricsSources& sources);

}  // namespace esi
