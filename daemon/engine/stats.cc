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
          {"ring_bytes_in", ringBytesIn}, {"ring_bytes_out", ringBytesOut}};
}

}  // namespace esi
