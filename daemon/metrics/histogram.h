// A Prometheus classic histogram: cumulative counts per upper bound, a sum
// and a count.  One event loop thread observes, so the counts are plain.

#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace esi {

class Histogram {
 public:
  // Prometheus' default buckets, in seconds: from 5 ms to 10 s.
  static std::vector<double> defaultSeconds();
  // From 10 us to 10 s, for what usually takes microseconds: a purge the
  // variant index answers (the default's first bucket would hold them all).
  static std::vector<double> fineSeconds();

  // bounds: ascending upper bounds; +Inf is implied.
  explicit Histogram(std::vector<double> bounds = defaultSeconds());

  void observe(double value);

  const std::vector<double>& bounds() const { return bounds_; }
  // Observations <= bounds()[i]; cumulative, as exposed.
  uint64_t cumulative(size_t i) const;
  uint64_t count() const { return count_; }
  double sum() const { return sum_; }

 private:
  std::vector<double> bounds_;
  std::vector<uint64_t> counts_;  // per bucket, not cumulative
  uint64_t count_ = 0;
  double sum_ = 0;
};

}  // namespace esi
