// Counters esid keeps for `esictl stats`.  One event loop thread updates
// them, so they are plain integers.

#pragma once

#include <cstdint>

#include <nlohmann/json_fwd.hpp>

namespace esi {

struct Stats {
  uint64_t connections = 0;      // worker connections accepted, ever
  uint64_t activeConnections = 0;
  uint64_t streams = 0;          // streams opened (bodies parsed), ever
  uint64_t planned = 0;          // cache hits answered with a parse plan
  uint64_t stitched = 0;         // of them, plans naming gzip segments
  uint64_t replayed = 0;         // of them, replayed by a worker on its own
  uint64_t activeStreams = 0;
  uint64_t bytes = 0;            // body bytes parsed
  uint64_t includes = 0;         // includes found
  uint64_t warnings = 0;         // odd markup passed over
  uint64_t errors = 0;           // refused includes and protocol violations
  uint64_t ringFull = 0;         // answers that had to wait for ring space
  uint64_t workerWaits = 0;      // times a worker waited for room in its ring
                                 // to esid, and esid's reading woke it
  uint64_t ringBytesIn = 0;      // message bytes read from the workers' rings
  uint64_t ringBytesOut = 0;     // and written to them

  nlohmann::json toJson() const;
};

}  // namespace esi
