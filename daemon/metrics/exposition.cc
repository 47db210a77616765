#include "metrics/exposition.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>

namespace esi {

namespace {

// Label values escape backslash, double quote and line feed; HELP text
// escapes backslash and line feed.
void appendEscaped(std::string& out, std::string_view text, bool quotes) {
  for (char c : text) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '"' && quotes) {
      out += "\\\"";
    } else {
      out += c;
    }
  }
}

}  // namespace

std::string formatValue(double value) {
  if (std::isinf(value)) return value > 0 ? "+Inf" : "-Inf";
  if (std::isnan(value)) return "NaN";
  char text[32];
  if (value == std::floor(value) && std::fabs(value) < 1e15) {
    std::snprintf(text, sizeof(text), "%.0f", value);
    return text;
  }
  // The shortest of 15 to 17 digits that reads back as the same double.
  for (int digits = 15; digits <= 17; ++digits) {
    std::snprintf(text, sizeof(text), "%.*g", digits, value);
    if (std::strtod(text, nullptr) == value) break;
  }
  return text;
}

void Exposition::family(std::string_view name, std::string_view type, std::string_view help) {
  name_ = name;
  text_ += "# HELP ";
  text_ += name;
  text_ += ' ';
  appendEscaped(text_, help, false);
  text_ += "\n# TYPE ";
  text_ += name;
  text_ += ' ';
  text_ += type;
  text_ += '\n';
}

Exposition& Exposition::counter(std::string_view name, std::string_view help) {
  family(name, "counter", help);
  return *this;
}

Exposition& Exposition::gauge(std::string_view name, std::string_view help) {
  family(name, "gauge", help);
  return *this;
}

void Exposition::line(std::string_view suffix, Labels labels, std::string_view extraName,
                      std::string_view extraValue, std::string_view value) {
  text_ += name_;
  text_ += suffix;
  bool first = true;
  const auto label = [&](std::string_view key, std::string_view labelValue) {
    text_ += first ? '{' : ',';
    first = false;
    text_ += key;
    text_ += "=\"";
    appendEscaped(text_, labelValue, true);
    text_ += '"';
  };
  for (const auto& [key, labelValue] : labels) label(key, labelValue);
  if (!extraName.empty()) label(extraName, extraValue);
  if (!first) text_ += '}';
  text_ += ' ';
  text_ += value;
  text_ += '\n';
}

Exposition& Exposition::sample(uint64_t value, Labels labels) {
  line({}, labels, {}, {}, std::to_string(value));
  return *this;
}

Exposition& Exposition::sample(double value, Labels labels) {
  line({}, labels, {}, {}, formatValue(value));
  return *this;
}

Exposition& Exposition::histogram(std::string_view name, std::string_view help,
                                  const Histogram& h) {
  family(name, "histogram", help);
  for (size_t i = 0; i < h.bounds().size(); ++i) {
    line("_bucket", {}, "le", formatValue(h.bounds()[i]), std::to_string(h.cumulative(i)));
  }
  line("_bucket", {}, "le", "+Inf", std::to_string(h.count()));
  line("_sum", {}, {}, {}, formatValue(h.sum()));
  line("_count", {}, {}, {}, std::to_string(h.count()));
  return *this;
}

}  // namespace esi
