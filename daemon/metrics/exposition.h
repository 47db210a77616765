// Prometheus text exposition format 0.0.4: families with HELP and TYPE
// lines, then their samples.  The caller names families with constants;
// label values may be anything and are escaped here.

#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>
#include <string_view>
#include <utility>

#include "metrics/histogram.h"

namespace esi {

using Label = std::pair<std::string_view, std::string_view>;
using Labels = std::initializer_list<Label>;

class Exposition {
 public:
  // Starts a family; its samples follow until the next family.
  Exposition& counter(std::string_view name, std::string_view help);
  Exposition& gauge(std::string_view name, std::string_view help);

  // A sample of the current family, with these labels.
  Exposition& sample(uint64_t value, Labels labels = {});
  Exposition& sample(double value, Labels labels = {});

  // A whole histogram family: NAME_bucket per bound and +Inf, _sum, _count.
  Exposition& histogram(std::string_view name, std::string_view help, const Histogram& h);

  const std::string& text() const { return text_; }

 private:
  void family(std::string_view name, std::string_view type, std::string_view help);
  void line(std::string_view suffix, Labels labels, std::string_view extraName,
            std::string_view extraValue, std::string_view value);

  std::string text_;
  std::string name_;
};

// A number as Prometheus writes it: integers without a point, +Inf.
std::string formatValue(double value);

}  // namespace esi
