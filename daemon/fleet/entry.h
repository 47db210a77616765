// What travels on the fleet's Redis stream: one entry per purge a node
// carried out, and the stream positions nodes keep.  Everything a stream
// entry says is checked here, where it enters esid: an entry that does not
// parse, or asks for more than a purge, is refused whole.

#pragma once

#include <compare>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "variants/purger.h"

namespace esi {

// A Redis stream entry ID, "MS-SEQ".
struct StreamId {
  uint64_t ms = 0;
  uint64_t seq = 0;

  // nullopt unless text is two decimal numbers joined by '-'.
  static std::optional<StreamId> parse(std::string_view text);
  std::string text() const;
  auto operator<=>(const StreamId&) const = default;
};

// One purge, as the node that carried it out first tells the others.
struct FleetEntry {
  std::string node;    // the origin node (fleet_node)
  PurgeQuery query;    // zone, kind, key / prefix / tag
  std::string uid;     // the purge's name for acknowledgements
  bool askAcks = false;  // esictl purge --wait: every node acknowledges
};

// The limits an entry must keep.  A key as long as esid takes from an NGINX
// worker's purge (64 KiB: any cache key NGINX can store fits), a zone name
// and a node name as NGINX and host names go.
constexpr size_t kMaxEntryValueBytes = size_t{64} * 1024;
constexpr size_t kMaxZoneNameBytes = 255;
constexpr size_t kMaxNodeNameBytes = 255;
constexpr size_t kMaxUidBytes = 512;

// The stream fields of an entry, for XADD: v, node, zone, kind, value, uid
// and, when asked, ack; soft for a soft purge.
std::vector<std::pair<std::string, std::string>> encodeEntry(const FleetEntry& entry);

// The entry these fields are, or nullopt with *why saying what is wrong: an
// unknown version, a missing, repeated or unknown field, a bad kind, a name
// or value out of bounds.
std::optional<FleetEntry> decodeEntry(
    const std::vector<std::pair<std::string_view, std::string_view>>& fields, std::string* why);

// Empty when the entry may go on the stream, else why not (the same checks
// decodeEntry makes, so that a node never publishes what others refuse).
std::string checkEntry(const FleetEntry& entry);

// An entry's kind field: key, prefix, tag or pattern.
std::string_view entryKindName(PurgeQuery::Kind kind);

// A node name: 1 to 255 bytes of letters, digits and ".-_:".
bool validNodeName(std::string_view name);

// Entries the stream lost before this node read them.  A node that applied
// entries up to the appliedOrdinal-th ever added (1-based; 0: none) looks
// at a stream that holds `length` entries of `entriesAdded` ever added:
// trimming (XADD MAXLEN) removes the oldest, so it holds ordinals
// entriesAdded - length + 1 onwards, and those between are lost.
uint64_t lostEntries(uint64_t appliedOrdinal, uint64_t entriesAdded, uint64_t length);

}  // namespace esi
