#include "fleet/pending_queue.h"

#include <utility>

namespace esi {

void PendingQueue::push(FleetEntry entry) {
  entries_.push_back(std::move(entry));
  trim();
}

void PendingQueue::putBack(std::vector<FleetEntry> entries) {
  for (auto it = entries.rbegin(); it != entries.rend(); ++it) entries_.push_front(std::move(*it));
  trim();
}

FleetEntry PendingQueue::pop() {
  FleetEntry entry = std::move(entries_.front());
  entries_.pop_front();
  return entry;
}

std::set<std::string> PendingQueue::takeLostZones() { return std::exchange(lostZones_, {}); }

void PendingQueue::trim() {
  while (entries_.size() > limit_) {
    lostZones_.insert(entries_.front().query.zone);
    entries_.pop_front();
    ++dropped_;
  }
}

}  // namespace esi
