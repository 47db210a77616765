// Purges that esictl asks for.  Only an NGINX worker can mark a keys_zone
// node (the zone lives in NGINX's shared memory), so esid hands each order
// to a connected worker that serves the zone; the worker carries it out as
// it would an HTTP purge and reports back.  An order whose worker goes away
// fails at once: nobody waits for an answer that cannot come.

#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "variants/purger.h"

namespace esi {

// What became of a purge in the fleet (Response.purged.fleet): status ""
// without a fleet, "published" or "pending"; uid names it there.
struct FleetNote {
  std::string status;
  std::string uid;
};

struct PurgeOrderOutcome {
  uint64_t count = 0;    // files removed
  bool scanned = false;  // the zone's directory was read
  std::string error;     // non-empty: the purge was not carried out
  FleetNote fleet;       // what became of it in the fleet
};

struct PurgeOrderOptions {
  // The order carries out a fleet entry (or the fleet's purge of a whole
  // zone after a gap): it is not told to the fleet again.
  bool fromFleet = false;
  // esictl purge --fleet --wait: the fleet's nodes acknowledge it.
  bool askAcks = false;
};

// Called once a worker's purge is answered (outcome: what it removes),
// unless it carries out a fleet entry: tells the fleet, and returns what
// the worker hears of it.
using PurgeFeed = std::function<FleetNote(const PurgeQuery& query, const PurgeOutcome& outcome,
                                          bool askAcks)>;

// A worker's connection, as far as orders go.
class PurgeOrderTaker {
 public:
  virtual ~PurgeOrderTaker() = default;
  // False when the order cannot be sent; the order then fails.
  virtual bool takePurgeOrder(uint32_t order, const PurgeQuery& query,
                              const PurgeOrderOptions& options) = 0;
};

class PurgeOrders {
 public:
  using Done = std::function<void(PurgeOrderOutcome)>;

  PurgeOrders() = default;
  PurgeOrders(const PurgeOrders&) = delete;
  PurgeOrders& operator=(const PurgeOrders&) = delete;

  // The taker's worker announced the zone.
  void serves(std::string_view zone, PurgeOrderTaker* taker);
  // The taker is going away: its orders fail, it gets no more.
  void withdraw(PurgeOrderTaker* taker);

  // done runs once, from the loop: when the worker reports, or at once.
  void order(PurgeQuery query, Done done, PurgeOrderOptions options = {});

  // The zones some connected worker serves now.
  std::vector<std::string> zones() const;
  // Called whenever a worker announces a zone.
  void onServes(std::function<void()> callback) { onServes_ = std::move(callback); }
  // The taker's worker reports an order; an order it does not hold (a lying
  // or late worker) is ignored.
  void done(PurgeOrderTaker* taker, uint32_t order, PurgeOrderOutcome outcome);

 private:
  struct Open {
    PurgeOrderTaker* taker;
    Done done;
  };

  std::map<std::string, std::vector<PurgeOrderTaker*>, std::less<>> takers_;
  std::map<uint32_t, Open> open_;
  std::function<void()> onServes_;
  uint32_t nextOrder_ = 1;
  size_t nextTaker_ = 0;  // round robin over a zone's workers
};

}  // namespace esi
