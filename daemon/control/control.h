// The control API behind `esictl`: one command in, one answer out (a purge
// answers once a worker carried it out).  Every command checks the caller's
// credentials first.

#pragma once

#include <sys/types.h>
#include <unistd.h>

#include <optional>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "engine/stats.h"
#include "fleet/fleet.h"
#include "plans/plan_store.h"
#include "segments/segment_arena.h"
#include "trace/trace_ring.h"
#include "transport/purge_orders.h"
#include "transport/server.h"
#include "variants/purger.h"

namespace esi {

class Control {
 public:
  Control(const Stats& stats, const Purger& purger, PurgeOrders& orders,
          const PlanStore& plans, const SegmentArena& arena, uid_t owner = geteuid())
      : stats_(stats), purger_(purger), orders_(orders), plans_(plans), arena_(arena),
        owner_(owner) {}

  void handle(std::string_view command, const PeerCredentials& peer,
              const ControlAnswerFn& answer);

  // Members of this group may control esid too (control_group); nullopt:
  // only root and esid's own user.
  void allowGroup(std::optional<gid_t> group) { group_ = group; }

  // esid's fleet, if it has one: `esictl fleet`, its counters in stats, and
  // purges whose nodes acknowledge.
  void setFleet(Fleet* fleet) { fleet_ = fleet; }

  // The workers' server, whose sessions read what their workers wrote
  // without waking esid before any answer (so that counts and the trace
  // are whole), and whose rings' use is in metrics; and the trace `esictl
  // log` reads.  Both must outlive the control.
  void setServer(Server* server) { server_ = server; }
  void setTrace(const TraceRing* trace) { trace_ = trace; }

  // The Prometheus page (metrics_page.h): GET /metrics and `esictl stats
  // --prometheus` show the same.
  std::string metrics();

 private:
  bool allowed(const PeerCredentials& peer) const;
  ControlAnswer query(std::string_view command) const;
  ControlAnswer plans(std::string_view zone) const;
  ControlAnswer log(std::string_view args) const;
  nlohmann::json counters() const;
  std::string metricsPage() const;
  void purge(std::string_view args, bool askAcks, const ControlAnswerFn& answer);
  void fleet(std::string_view args, const ControlAnswerFn& answer);

  const Stats& stats_;
  const Purger& purger_;
  PurgeOrders& orders_;
  const PlanStore& plans_;
  const SegmentArena& arena_;
  const uid_t owner_;  // besides root, the only user allowed...
  std::optional<gid_t> group_;  // ...but for this group's members
  Fleet* fleet_ = nullptr;
  Server* server_ = nullptr;
  const TraceRing* trace_ = nullptr;
};

}  // namespace esi
