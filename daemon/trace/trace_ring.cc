#include "trace/trace_ring.h"

#include <chrono>

#include <nlohmann/json.hpp>

namespace esi {

nlohmann::json TraceEntry::toJson() const {
  nlohmann::json out = {{"seq", seq},
                        {"ms", unixMs},
                        {"kind", kind == Kind::kPage ? "page" : "purge"},
                        {"url", url},
                        {"how", how},
                        {"micros", micros}};
  if (kind == Kind::kPage) {
    out["status"] = status;
    out["fragments"] = fragments;
    out["bytes"] = bytes;
  } else {
    out["zone"] = zone;
    out["files"] = fragments;
    out["path"] = path;
    out["error"] = error;
  }
  return out;
}

bool TraceFilter::passes(const TraceEntry& entry) const {
  if (status != 0 && entry.status != status) return false;
  return std::string_view(entry.url).substr(0, prefix.size()) == prefix;
}

TraceRing::TraceRing(size_t entries) : slots_(entries == 0 ? 1 : entries) {}

void TraceRing::add(TraceEntry entry) {
  entry.seq = next_++;
  entry.unixMs = std::chrono::duration_cast<std::chrono::milliseconds>(
                     std::chrono::system_clock::now().time_since_epoch())
                     .count();
  if (entry.url.size() > kMaxUrlBytes) entry.url.resize(kMaxUrlBytes);
  slots_[entry.seq % slots_.size()] = std::move(entry);
}

TraceSlice TraceRing::since(uint64_t after, const TraceFilter& filter) const {
  TraceSlice slice;
  slice.last = last();
  const uint64_t oldest = next_ > slots_.size() ? next_ - slots_.size() : 1;
  if (after + 1 < oldest) {
    slice.missed = oldest - (after + 1);
    after = oldest - 1;
  }
  for (uint64_t seq = after + 1; seq < next_; ++seq) {
    const TraceEntry& entry = slots_[seq % slots_.size()];
    if (filter.passes(entry)) slice.entries.push_back(entry);
  }
  return slice;
}

}  // namespace esi
