#include <gtest/gtest.h>

#include <set>
#include <string>

#include <nlohmann/json.hpp>

#include "control/metrics_page.h"
#include "variants/purger.h"

namespace esi {
namespace {

bool has(const std::string& text, const std::string& line) {
  return text.find("\n" + line + "\n") != std::string::npos;
}

TEST(MetricsPageTest, ShowsEveryCountWithItsLabels) {
  Stats stats;
  stats.streams = 5;
  stats.planned = 4;
  stats.replayed = 3;
  stats.planMisses = 2;
  stats.planDrops = 1;
  stats.fragmentsRefused = 2;
  stats.errors = 3;  // 2 refused includes, 1 violation
  stats.protocolErrors = 1;
  stats.purges[static_cast<size_t>(PurgeQuery::Kind::kTag)][1][0] = 7;
  stats.purgeSeconds.observe(0.002);
  stats.activeConnections = 2;
  Histogram scans;
  scans.observe(3);
  nlohmann::json counters = stats.toJson();
  counters.update({{"ring_used_requests", 10}, {"ring_used_responses", 20}, {"ring_capacity", 4096}});
  const std::string text = renderMetrics({stats, counters, scans, 4});

  EXPECT_TRUE(has(text, "esid_pages_total{how=\"parse\"} 5"));
  EXPECT_TRUE(has(text, "esid_pages_total{how=\"plan\"} 1"));
  EXPECT_TRUE(has(text, "esid_pages_total{how=\"replay\"} 3"));
  EXPECT_TRUE(has(text, "esid_plan_lookups_total{result=\"hit\"} 4"));
  EXPECT_TRUE(has(text, "esid_plan_lookups_total{result=\"miss\"} 2"));
  EXPECT_TRUE(has(text, "esid_plan_lookups_total{result=\"drop\"} 1"));
  EXPECT_TRUE(has(text, "esid_fragments_total{outcome=\"refused\"} 2"));
  EXPECT_TRUE(has(text, "esid_errors_total{cause=\"protocol\"} 1"));
  EXPECT_TRUE(has(text, "esid_errors_total{cause=\"include_refused\"} 2"));
  EXPECT_TRUE(has(text, "esid_errors_total{cause=\"scan\"} 4"));
  EXPECT_TRUE(has(text, "esid_purges_total{kind=\"tag\",mode=\"soft\",path=\"index\"} 7"));
  EXPECT_TRUE(has(text, "esid_purges_total{kind=\"exact\",mode=\"hard\",path=\"directory\"} 0"));
  EXPECT_TRUE(has(text, "esid_sessions 2"));
  EXPECT_TRUE(has(text, "esid_ring_used_bytes{ring=\"responses\"} 20"));
  EXPECT_TRUE(has(text, "esid_ring_capacity_bytes 4096"));
  EXPECT_FALSE(has(text, "esid_ring_used_requests 10"));  // once, labelled
  EXPECT_TRUE(has(text, "esid_purge_duration_seconds_bucket{le=\"0.001\"} 0"));
  EXPECT_TRUE(has(text, "esid_purge_duration_seconds_bucket{le=\"0.0025\"} 1"));
  EXPECT_TRUE(has(text, "esid_purge_duration_seconds_count 1"));
  EXPECT_TRUE(has(text, "esid_scan_duration_seconds_bucket{le=\"2.5\"} 0"));
  EXPECT_TRUE(has(text, "esid_scan_duration_seconds_bucket{le=\"5\"} 1"));
  EXPECT_TRUE(has(text, "# TYPE esid_scan_duration_seconds histogram"));
}

TEST(MetricsPageTest, DeclaresEachFamilyOnceAndShowsUnknownCountersToo) {
  Stats stats;
  nlohmann::json counters = stats.toJson();
  counters["fleet_applied"] = 9;
  counters["something new"] = 2;
  Histogram scans;
  const std::string text = renderMetrics({stats, counters, scans, 0});
  EXPECT_TRUE(has(text, "esid_fleet_applied_total 9"));
  EXPECT_TRUE(has(text, "esid_something_new 2"));
  // Every TYPE line names a family of its own.
  std::set<std::string> families;
  for (size_t at = text.find("# TYPE "); at != std::string::npos;
       at = text.find("# TYPE ", at + 1)) {
    const std::string name = text.substr(at + 7, text.find(' ', at + 7) - at - 7);
    EXPECT_TRUE(families.insert(name).second) << name;
  }
  EXPECT_FALSE(families.contains("esid_planned_total"));  // esid_plan_lookups_total says it
}

}  // namespace
}  // namespace esi
