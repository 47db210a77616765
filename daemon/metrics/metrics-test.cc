#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "metrics/exposition.h"
#include "metrics/histogram.h"

namespace esi {
namespace {

TEST(HistogramTest, CountsEachValueInTheFirstBucketNotBelowIt) {
  Histogram h({0.1, 1, 10});
  h.observe(0.05);
  h.observe(0.1);  // "le": on the bound counts in its bucket
  h.observe(0.5);
  h.observe(20);   // above every bound: only +Inf
  EXPECT_EQ(h.cumulative(0), 2u);
  EXPECT_EQ(h.cumulative(1), 3u);
  EXPECT_EQ(h.cumulative(2), 3u);
  EXPECT_EQ(h.count(), 4u);
  EXPECT_DOUBLE_EQ(h.sum(), 20.65);
}

TEST(HistogramTest, DefaultBucketsArePrometheusOwn) {
  const std::vector<double> bounds = Histogram::defaultSeconds();
  ASSERT_EQ(bounds.size(), 11u);
  EXPECT_EQ(bounds.front(), 0.005);
  EXPECT_EQ(bounds.back(), 10);
}

TEST(HistogramTest, FineBucketsTellMicrosecondsApart) {
  Histogram h(Histogram::fineSeconds());
  ASSERT_TRUE(std::is_sorted(h.bounds().begin(), h.bounds().end()));
  EXPECT_EQ(h.bounds().front(), 0.00001);
  EXPECT_EQ(h.bounds().back(), 10);
  h.observe(0.000004);
  h.observe(0.0003);
  EXPECT_EQ(h.cumulative(0), 1u);
  EXPECT_EQ(h.cumulative(4), 1u);  // le 0.00025
  EXPECT_EQ(h.cumulative(5), 2u);  // le 0.0005
}

TEST(ExpositionTest, WritesHelpTypeAndLabelledSamples) {
  Exposition out;
  out.counter("esid_purges_total", "Purges.")
      .sample(uint64_t{3}, {{"kind", "exact"}, {"path", "index"}})
      .sample(uint64_t{0}, {{"kind", "tag"}, {"path", "directory"}});
  out.gauge("esid_sessions", "Workers.").sample(uint64_t{2});
  EXPECT_EQ(out.text(),
            "# HELP esid_purges_total Purges.\n"
            "# TYPE esid_purges_total counter\n"
            "esid_purges_total{kind=\"exact\",path=\"index\"} 3\n"
            "esid_purges_total{kind=\"tag\",path=\"directory\"} 0\n"
            "# HELP esid_sessions Workers.\n"
            "# TYPE esid_sessions gauge\n"
            "esid_sessions 2\n");
}

TEST(ExpositionTest, EscapesLabelValuesAndHelp) {
  Exposition out;
  out.gauge("esid_x", "a \\ b\nc").sample(uint64_t{1}, {{"zone", "a\"b\\c\nd"}});
  EXPECT_EQ(out.text(),
            "# HELP esid_x a \\\\ b\\nc\n"
            "# TYPE esid_x gauge\n"
            "esid_x{zone=\"a\\\"b\\\\c\\nd\"} 1\n");
}

TEST(ExpositionTest, WritesAHistogramWithCumulativeBucketsSumAndCount) {
  Histogram h({0.5, 1});
  h.observe(0.25);
  h.observe(0.75);
  h.observe(3);
  Exposition out;
  out.histogram("esid_scan_seconds", "Scans.", h);
  EXPECT_EQ(out.text(),
            "# HELP esid_scan_seconds Scans.\n"
            "# TYPE esid_scan_seconds histogram\n"
            "esid_scan_seconds_bucket{le=\"0.5\"} 1\n"
            "esid_scan_seconds_bucket{le=\"1\"} 2\n"
            "esid_scan_seconds_bucket{le=\"+Inf\"} 3\n"
            "esid_scan_seconds_sum 4\n"
            "esid_scan_seconds_count 3\n");
}

TEST(ExpositionTest, FormatsValuesAsPrometheusReadsThem) {
  EXPECT_EQ(formatValue(2), "2");
  EXPECT_EQ(formatValue(0.1 + 0.2), "0.30000000000000004");
  EXPECT_EQ(formatValue(0.005), "0.005");
  EXPECT_EQ(formatValue(std::numeric_limits<double>::infinity()), "+Inf");
  EXPECT_EQ(formatValue(std::nan("")), "NaN");
}

}  // namespace
}  // namespace esi
