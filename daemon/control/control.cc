#include "control/control.h"

#include <string>

#include <nlohmann/json.hpp>

namespace esi {

ControlAnswer Control::handle(std::string_view command,
                              const PeerCredentials& peer) const {
  if (peer.uid != 0 && peer.uid != owner_) {
    return {false, "permission denied: uid " + std::to_string(peer.uid) +
                       " may not control esid"};
  }
  if (command == "stats") {
    return {true, stats_.toJson().dump()};
  }
  if (command == "zones") {
    return {true, purger_.zones().dump()};
  }
  return {false, "unknown command \"" + std::string(command) + "\""};
}

}  // namespace esi
