// The entries a node carried out while Redis was away, waiting in order to
// be appended.  Bounded: past its limit the oldest entry goes, and its zone
// is remembered, so that the node can tell the fleet that zone lost purges.

#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <set>
#include <string>
#include <vector>

#include "fleet/entry.h"

namespace esi {

class PendingQueue {
 public:
  explicit PendingQueue(size_t limit) : limit_(limit == 0 ? 1 : limit) {}

  // Appends; drops the oldest entry when full.
  void push(FleetEntry entry);
  // Puts entries that were sent but never acknowledged back in front, in
  // their order; drops the oldest beyond the limit.
  void putBack(std::vector<FleetEntry> entries);

  bool empty() const { return entries_.empty(); }
  size_t size() const { return entries_.size(); }
  FleetEntry pop();

  uint64_t dropped() const { return dropped_; }
  // The zones of the entries dropped since the last call.
  std::set<std::string> takeLostZones();

 private:
  void trim();

  size_t limit_;
  std::deque<FleetEntry> entries_;
  uint64_t dropped_ = 0;
  std::set<std::string> lostZones_;
};

}  // namespace esi
