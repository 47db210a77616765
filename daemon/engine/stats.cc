#include "engine/stats.h"

#include <nlohmann/json.hpp>

namespace esi {

nlohmann::json Stats::toJson() const {
  return {{"connections", connections}, {"active_connections", activeConnections},
          {"streams", streams},         {"active_streams", activeStreams},
          {"bytes", bytes},             {"includes", includes},
          {"warnings", warnings},       {"errors", errors},
          {"ring_full", ringFull},      {"worker_waits", workerWaits},
          {"planned", planned},
          {"stitched", stitched},       {"replayed", replayed},
          {"ring_bytes_in", ringBytesIn}, {"ring_bytes_out", ringBytesOut},
          {"plan_misses", planMisses},  {"plan_drops", planDrops},
          {"fragments_resolved", fragmentsResolved},
          {"fragments_deferred", fragmentsDeferred},
          {"fragments_refused", fragmentsRefused},
          {"protocol_errors", protocolErrors},
          {"purge_errors", purgeErrors}};
}

}  // namespace esi
