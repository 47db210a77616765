#include "transport/purge_orders.h"

#include <gtest/gtest.h>

#include <optional>
#include <vector>

namespace esi {
namespace {

struct Taker : PurgeOrderTaker {
  bool takePurgeOrder(uint32_t order, const PurgeQuery& query, const PurgeOrderOptions&) override {
    if (full) return false;
    taken.push_back({order, query.value});
    return true;
  }
  bool full = false;
  std::vector<std::pair<uint32_t, std::string>> taken;
};

PurgeQuery keyQuery(std::string zone, std::string key) {
  return PurgeQuery{PurgeQuery::Kind::kKey, std::move(zone), std::move(key)};
}

TEST(PurgeOrders, OrderGoesToAWorkerOfTheZoneAndItsReportAnswers) {
  PurgeOrders orders;
  Taker a, b;
  orders.serves("pages", &a);
  orders.serves("other", &b);
  std::optional<PurgeOrderOutcome> outcome;
  orders.order(keyQuery("pages", "/k"), [&](const PurgeOrderOutcome& o) { outcome = o; });
  ASSERT_EQ(a.taken.size(), 1u);
  EXPECT_TRUE(b.taken.empty());
  EXPECT_FALSE(outcome);
  orders.done(&a, a.taken[0].first, PurgeOrderOutcome{3, true, {}, {}});
  ASSERT_TRUE(outcome);
  EXPECT_EQ(outcome->count, 3u);
  EXPECT_TRUE(outcome->scanned);
}

TEST(PurgeOrders, ZoneWithoutWorkersFailsAtOnce) {
  PurgeOrders orders;
  std::optional<PurgeOrderOutcome> outcome;
  orders.order(keyQuery("pages", "/k"), [&](const PurgeOrderOutcome& o) { outcome = o; });
  ASSERT_TRUE(outcome);
  EXPECT_NE(outcome->error.find("no connected NGINX worker"), std::string::npos);
}

TEST(PurgeOrders, WorkerThatGoesAwayFailsItsOrders) {
  PurgeOrders orders;
  Taker a;
  orders.serves("pages", &a);
  std::optional<PurgeOrderOutcome> outcome;
  orders.order(keyQuery("pages", "/k"), [&](const PurgeOrderOutcome& o) { outcome = o; });
  orders.withdraw(&a);
  ASSERT_TRUE(outcome);
  EXPECT_NE(outcome->error.find("went away"), std::string::npos);
  // and it gets no more orders
  outcome.reset();
  orders.order(keyQuery("pages", "/k"), [&](const PurgeOrderOutcome& o) { outcome = o; });
  EXPECT_EQ(a.taken.size(), 1u);
  ASSERT_TRUE(outcome);
  EXPECT_FALSE(outcome->error.empty());
}

TEST(PurgeOrders, ReportOfAnOrderTheWorkerDoesNotHoldIsIgnored) {
  PurgeOrders orders;
  Taker a, b;
  orders.serves("pages", &a);
  orders.serves("pages", &b);
  int answers = 0;
  orders.order(keyQuery("pages", "/k"), [&](PurgeOrderOutcome) { ++answers; });
  Taker& holder = a.taken.empty() ? b : a;
  Taker& other = a.taken.empty() ? a : b;
  const uint32_t id = holder.taken[0].first;
  orders.done(&other, id, PurgeOrderOutcome{});  // a lying worker
  orders.done(&holder, id + 1, PurgeOrderOutcome{});  // an order never given
  EXPECT_EQ(answers, 0);
  orders.done(&holder, id, PurgeOrderOutcome{});
  orders.done(&holder, id, PurgeOrderOutcome{});  // twice
  EXPECT_EQ(answers, 1);
}

TEST(PurgeOrders, FullWorkerIsPassedOverAndWorkersTakeTurns) {
  PurgeOrders orders;
  Taker a, b;
  orders.serves("pages", &a);
  orders.serves("pages", &b);
  a.full = true;
  for (int i = 0; i < 2; ++i) orders.order(keyQuery("pages", "/k"), [](PurgeOrderOutcome) {});
  EXPECT_TRUE(a.taken.empty());
  EXPECT_EQ(b.taken.size(), 2u);
  a.full = false;
  for (int i = 0; i < 2; ++i) orders.order(keyQuery("pages", "/k"), [](PurgeOrderOutcome) {});
  EXPECT_EQ(a.taken.size(), 1u);
  EXPECT_EQ(b.taken.size(), 3u);
}

}  // namespace
}  // namespace esi
