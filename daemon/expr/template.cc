#include "expr/template.h"

#include <algorithm>

namespace esi {
namespace {

bool isUnreserved(char c) {
  return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') ||
         (c >= '0' && c <= '9') || c == '-' || c == '.' || c == '_' ||
         c == '~';
}

bool isHtmlSpecial(char c) {
  return c == '&' || c == '<' || c == '>' || c == '"' || c == '\'';
}

// Runs without a special byte go out whole: values are mostly plain words.
void appendHtmlEscaped(std::string& out, std::string_view value) {
  for (;;) {
    const size_t special = static_cast<size_t>(
        std::find_if(value.begin(), value.end(), isHtmlSpecial) - value.begin());
    out.append(value.substr(0, special));
    if (special == value.size()) return;
    switch (value[special]) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      default: out += "&#39;"; break;
    }
    value.remove_prefix(special + 1);
  }
}

void appendPercentEncoded(std::string& out, std::string_view value) {
  static constexpr char HEX[] = "0123456789ABCDEF";
  for (const char c : value) {
    if (isUnreserved(c)) {
      out += c;
    } else {
      const auto byte = static_cast<unsigned char>(c);
      out += '%';
      out += HEX[byte >> 4];
      out += HEX[byte & 0xf];
    }
  }
}

}  // namespace

void appendEscaped(std::string& out, std::string_view value,
                   Escaping escaping) {
  if (escaping == Escaping::HTML) {
    appendHtmlEscaped(out, value);
  } else {
    appendPercentEncoded(out, value);
  }
}

Template Template::compile(std::string_view text) {
  Template compiled;
  compiled.text_.reserve(text.size());
  for (;;) {
    const size_t dollar = text.find("$(");
    compiled.text_.append(text.substr(0, dollar));
    if (dollar == std::string_view::npos) break;
    text.remove_prefix(dollar);
    size_t length;
    if (auto reference = expr::parseReference(text, length)) {
      compiled.slots_.push_back(
          {compiled.text_.size(), std::move(*reference)});
      text.remove_prefix(length);
    } else {
      compiled.text_ += '$';  // text, and the '(' may open the next one
      text.remove_prefix(1);
    }
  }
  return compiled;
}

void Template::renderTo(std::string& out, const RequestVariables& variables,
                        Escaping escaping) const {
  pieces(
      variables, [&](std::string_view text) { out += text; },
      [&](std::string_view value) { appendEscaped(out, value, escaping); });
}

std::string Template::render(const RequestVariables& variables,
                             Escaping escaping) const {
  std::string out;
  renderTo(out, variables, escaping);
  return out;
}

void Template::append(const Template& other) {
  for (const Slot& slot : other.slots_) {
    slots_.push_back({text_.size() + slot.at, slot.reference});
  }
  text_ += other.text_;
}

size_t Template::bytes() const {
  size_t total = text_.capacity() + slots_.capacity() * sizeof(Slot);
  for (const Slot& slot : slots_) {
    total += slot.reference.variable.key.capacity() +
             slot.reference.fallback.capacity();
  }
  return total;
}

std::vector<VariableRef> Template::uses() const {
  std::vector<VariableRef> refs;
  for (const Slot& slot : slots_) refs.push_back(slot.reference.variable);
  return expr::distinctUses(std::move(refs));
}

}  // namespace esi
