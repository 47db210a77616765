// Counters esid keeps for `esictl stats`.  One event loop thread updates
// them, so they are plain integers.

#pragma once

#include <array>
#include <cstdint>

#include <nlohmann/json_fwd.hpp>

#include "metrics/histogram.h"

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
  uint64_t planMisses = 0;       // hits of objects with no plan yet (parsed)
  uint64_t planDrops = 0;        // plans a worker found not to match
  uint64_t fragmentsResolved = 0;  // includes resolved once, when parsed
  uint64_t fragmentsDeferred = 0;  // resolved per request (they read it)
  uint64_t fragmentsRefused = 0;   // a src refused (another host, a bad URL)
  uint64_t protocolErrors = 0;     // of errors: workers' protocol violations
  uint64_t purgeErrors = 0;        // purges esid could not answer

  // Purges answered, by kind (exact, wildcard, tag, pattern), soft or not, and
  // whether the zone's directory was read.
  static constexpr size_t kPurgeKinds = 4;
  std::array<std::array<std::array<uint64_t, 2>, 2>, kPurgeKinds> purges{};
  // From a worker's purge request to esid's answer.
  Histogram purgeSeconds{Histogram::fineSeconds()};

  nlohmann::json toJson() const;
};

}  // namespace esi
