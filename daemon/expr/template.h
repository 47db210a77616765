// Variable substitution (ESI 1.0, sections 3.7 and 4): text in which
// $(NAME), $(NAME{key}), $(NAME|default) and $(NAME{key}|default) are
// replaced by the request's values.  A template is compiled once, when the
// page's structure is parsed, and rendered for each request.
//
// Nothing from a request may add a header, a path segment outside the page's
// authority, or markup the page did not have; so what a reference yields is
// always data, escaped for where it goes (its default too, for one rule):
//  - Escaping::HTML, for <esi:vars> content: & < > " ' become entities, so a
//    value can neither open a tag nor leave an attribute value.
//  - Escaping::URL, for an include's query: every byte but the unreserved
//    ones (RFC 3986: letters, digits, - . _ ~) is percent-encoded, so a value
//    holds no '/', '?', '&', '#', CR, LF or NUL.  An include's path is
//    decoded again when it is resolved, so a "%2F" there would be a
//    separator after all: engine/program.h renders include paths with
//    pieces() and checks each value itself.
// The text around references is the page's own and goes out unchanged.
//
// A default is a single-quoted string ('new user', with \' and \\) or one
// bare word (default, as in the spec's example); it is used when the value
// is empty.  A "$(" that does not start a well-formed reference is text,
// as written: one with no closing ')', a lowercase name (jQuery's
// $(document) in a vars block is left alone), a default of two bare words,
// or one longer than 1 KiB.  Values are never read again for references.

#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "expr/syntax.h"
#include "expr/variables.h"

namespace esi {

enum class Escaping { HTML, URL };

class Template {
 public:
  // Never fails: whatever is not a reference is text.  Linear in text.
  static Template compile(std::string_view text);

  // Appends the text with every reference replaced by its escaped value.
  void renderTo(std::string& out, const RequestVariables& variables,
                Escaping escaping) const;
  std::string render(const RequestVariables& variables,
                     Escaping escaping) const;

  // Calls text(piece) for each run of the template's own text and
  // value(value) for each reference's value (its default where empty), in
  // order: for a caller that escapes by position.
  template <typename Text, typename Value>
  void pieces(const RequestVariables& variables, Text&& text,
              Value&& value) const {
    size_t done = 0;
    for (const Slot& slot : slots_) {
      text(std::string_view(text_).substr(done, slot.at - done));
      value(slot.reference.valueIn(variables));
      done = slot.at;
    }
    text(std::string_view(text_).substr(done));
  }

  // False when the text holds no reference: it goes out as it is.
  bool hasReferences() const { return !slots_.empty(); }
  // Extends it with text of its own (never read for references), or with
  // another template: for one that renders several at once.
  void appendText(std::string_view text) { text_ += text; }
  void append(const Template& other);

  // Heap memory it holds, roughly: for the budget of whoever keeps it.
  size_t bytes() const;

  // The variables it reads, each once, in order of first use; unknown
  // variables (always empty) are left out.
  std::vector<VariableRef> uses() const;

 private:
  struct Slot {
    size_t at;  // the reference's value goes before text_[at]
    expr::Reference reference;
  };
  std::string text_;  // the text without its references
  std::vector<Slot> slots_;
};

// What a rendered reference becomes; for those who put a value somewhere
// else than a template.
void appendEscaped(std::string& out, std::string_view value, Escaping escaping);

}  // namespace esi
