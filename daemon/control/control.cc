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
  // "variants ZONE KEY": the key is the rest of the line, spaces and all.
  if (command.substr(0, 9) == "variants ") {
    const std::string_view rest = command.substr(9);
    const size_t space = rest.find(' ');
    if (space == std::string_view::npos) return {false, "usage: variants ZONE KEY"};
    const nlohmann::json answer = purger_.variants(rest.substr(0, space), rest.substr(space + 1));
    if (answer.is_null()) {
      return {false, "no zone \"" + std::string(rest.substr(0, space)) + "\""};
    }
    return {true, answer.dump()};
  }
  return {false, "unknown command \"" + std::string(command) + "\""};
}

}  // namespace esi
