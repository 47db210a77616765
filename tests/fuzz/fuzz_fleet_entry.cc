// esid's decoder of the fleet's Redis stream entries (daemon/fleet/entry.h)
// on any fields, as another node, or anything else that can XADD to the
// stream, wrote them.  An entry is refused with a reason, or it is one esid
// would publish itself: checkEntry finds nothing wrong, each field is what
// the input said, and encodeEntry gives back exactly the input's fields
// (v 1, node, zone, kind, value, uid, ack and soft only as "1"), in any
// order.  A field's text, read as a stream ID, is two decimal numbers and
// prints back as an ID that reads the same.
//
// Input: fields, each a name and a value, each a 2-byte little-endian
// length and its bytes (a length past the end takes what is left).

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "fleet/entry.h"
#include "fuzz_check.h"

namespace {

using Fields = std::vector<std::pair<std::string_view, std::string_view>>;

std::string_view take(std::string_view* input) {
  if (input->size() < 2) {
    const std::string_view rest = *input;
    input->remove_prefix(input->size());
    return rest;
  }
  const size_t len = static_cast<uint8_t>((*input)[0]) |
                     (static_cast<size_t>(static_cast<uint8_t>((*input)[1])) << 8);
  input->remove_prefix(2);
  const std::string_view text = input->substr(0, len);
  input->remove_prefix(text.size());
  return text;
}

void checkStreamId(std::string_view text) {
  const std::optional<esi::StreamId> id = esi::StreamId::parse(text);
  if (!id) return;
  const size_t dash = text.find('-');
  FUZZ_CHECK(dash != std::string_view::npos && dash > 0 && dash + 1 < text.size());
  for (size_t i = 0; i < text.size(); i++) {
    FUZZ_CHECK(i == dash || (text[i] >= '0' && text[i] <= '9'));
  }
  const std::optional<esi::StreamId> again = esi::StreamId::parse(id->text());
  FUZZ_CHECK(again && *again == *id);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // Copies of exactly their size (no std::string, whose short strings
  // have room to spare): ASan sees a read past a field.
  std::vector<std::unique_ptr<char[]>> storage;
  std::vector<std::string_view> texts;
  std::string_view input(reinterpret_cast<const char*>(data), size);
  while (!input.empty() || texts.size() % 2) {
    const std::string_view text = take(&input);
    storage.push_back(std::make_unique<char[]>(text.size()));
    std::copy(text.begin(), text.end(), storage.back().get());
    texts.emplace_back(storage.back().get(), text.size());
  }
  Fields fields;
  for (size_t i = 0; i < texts.size(); i += 2) {
    fields.emplace_back(texts[i], texts[i + 1]);
    checkStreamId(texts[i + 1]);
  }

  std::string why;
  const std::optional<esi::FleetEntry> entry = esi::decodeEntry(fields, &why);
  if (!entry) {
    FUZZ_CHECK(!why.empty());
    return 0;
  }
  FUZZ_CHECK(esi::checkEntry(*entry).empty());
  FUZZ_CHECK(esi::validNodeName(entry->node));
  FUZZ_CHECK(entry->query.value.size() <= esi::kMaxEntryValueBytes);
  FUZZ_CHECK(entry->query.value.find('\0') == std::string::npos);

  std::vector<std::pair<std::string, std::string>> encoded = esi::encodeEntry(*entry);
  std::vector<std::pair<std::string, std::string>> given;
  for (const auto& [name, text] : fields) given.emplace_back(name, text);
  std::sort(encoded.begin(), encoded.end());
  std::sort(given.begin(), given.end());
  FUZZ_CHECK(encoded == given);

  // What esid publishes, another node reads back the same.
  Fields again;
  for (const auto& [name, text] : encoded) again.emplace_back(name, text);
  std::string whyAgain;
  const std::optional<esi::FleetEntry> back = esi::decodeEntry(again, &whyAgain);
  FUZZ_CHECK(back && whyAgain.empty());
  FUZZ_CHECK(back->node == entry->node && back->uid == entry->uid &&
             back->askAcks == entry->askAcks && back->query.zone == entry->query.zone &&
             back->query.kind == entry->query.kind && back->query.value == entry->query.value &&
             back->query.soft == entry->query.soft);
  return 0;
}
