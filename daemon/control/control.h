// The control API behind `esictl`: one command in, one answer out.  Every
// command checks the caller's credentials first.

#pragma once

#include <string_view>
#include <sys/types.h>
#include <unistd.h>

#include "engine/stats.h"
#include "transport/server.h"
#include "variants/purger.h"

namespace esi {

class Control {
 public:
  Control(const Stats& stats, const Purger& purger, uid_t owner = geteuid())
      : stats_(stats), purger_(purger), owner_(owner) {}

  ControlAnswer handle(std::string_view command, const PeerCredentials& peer) const;

 private:
  const Stats& stats_;
  const Purger& purger_;
  const uid_t owner_;  // besides root, the only user allowed
};

}  // namespace esi
