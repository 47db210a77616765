#include "metrics/histogram.h"

#include <algorithm>

namespace esi {

std::vector<double> Histogram::defaultSeconds() {
  return {0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10};
}

std::vector<double> Histogram::fineSeconds() {
  std::vector<double> bounds = {0.00001, 0.000025, 0.00005, 0.0001, 0.00025,
                                 0.0005,  0.001,    0.0025};
  const std::vector<double> coarse = defaultSeconds();
  bounds.insert(bounds.end(), coarse.begin(), coarse.end());
  return bounds;
}

Histogram::Histogram(std::vector<double> bounds)
    : bounds_(std::move(bounds)), counts_(bounds_.size(), 0) {}

void Histogram::observe(double value) {
  // The first bound not below the value: Prometheus' buckets are "le".
  const auto bucket = std::lower_bound(bounds_.begin(), bounds_.end(), value);
  if (bucket != bounds_.end()) ++counts_[static_cast<size_t>(bucket - bounds_.begin())];
  ++count_;
  sum_ += value;
}

uint64_t Histogram::cumulative(size_t i) const {
  uint64_t total = 0;
  for (size_t b = 0; b <= i && b < counts_.size(); ++b) total += counts_[b];
  return total;
}

}  // namespace esi
