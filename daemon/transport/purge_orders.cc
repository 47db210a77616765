#include "transport/purge_orders.h"

#include <algorithm>

#include <spdlog/spdlog.h>

namespace esi {

void PurgeOrders::serves(std::string_view zone, PurgeOrderTaker* taker) {
  auto it = takers_.find(zone);
  if (it == takers_.end()) it = takers_.emplace(std::string(zone), std::vector<PurgeOrderTaker*>{}).first;
  if (std::find(it->second.begin(), it->second.end(), taker) == it->second.end()) {
    it->second.push_back(taker);
    if (onServes_) onServes_();
  }
}

std::vector<std::string> PurgeOrders::zones() const {
  std::vector<std::string> served;
  for (const auto& [zone, takers] : takers_) {
    if (!takers.empty()) served.push_back(zone);
  }
  return served;
}

void PurgeOrders::withdraw(PurgeOrderTaker* taker) {
  for (auto& [zone, takers] : takers_) std::erase(takers, taker);
  std::vector<Done> failed;
  for (auto it = open_.begin(); it != open_.end();) {
    if (it->second.taker == taker) {
      failed.push_back(std::move(it->second.done));
      it = open_.erase(it);
    } else {
      ++it;
    }
  }
  for (Done& done : failed) {
    done(PurgeOrderOutcome{0, false, "the NGINX worker carrying out the purge went away", {}});
  }
}

void PurgeOrders::order(PurgeQuery query, Done done, PurgeOrderOptions options) {
  auto it = takers_.find(query.zone);
  if (it == takers_.end() || it->second.empty()) {
    done(PurgeOrderOutcome{0, false, "no connected NGINX worker serves zone \"" + query.zone + "\"", {}});
    return;
  }
  std::vector<PurgeOrderTaker*>& takers = it->second;
  // A worker whose ring is full cannot take it; another may.
  for (size_t tried = 0; tried < takers.size(); ++tried) {
    PurgeOrderTaker* taker = takers[nextTaker_++ % takers.size()];
    const uint32_t id = nextOrder_++;
    if (nextOrder_ == 0) nextOrder_ = 1;
    open_.emplace(id, Open{taker, std::move(done)});
    if (taker->takePurgeOrder(id, query, options)) {
      spdlog::info("purge order {} of zone {} handed to a worker", id, query.zone);
      return;
    }
    done = std::move(open_.at(id).done);
    open_.erase(id);
  }
  done(PurgeOrderOutcome{0, false, "no NGINX worker of zone \"" + query.zone + "\" can take the purge now", {}});
}

void PurgeOrders::done(PurgeOrderTaker* taker, uint32_t order, PurgeOrderOutcome outcome) {
  auto it = open_.find(order);
  if (it == open_.end() || it->second.taker != taker) {
    spdlog::warn("a worker reported purge order {}, which it does not hold", order);
    return;
  }
  Done done = std::move(it->second.done);
  open_.erase(it);
  done(std::move(outcome));
}

}  // namespace esi
