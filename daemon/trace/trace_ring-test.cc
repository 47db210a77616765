#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "trace/trace_ring.h"

namespace esi {
namespace {

TraceEntry page(std::string url, uint32_t status) {
  TraceEntry entry;
  entry.url = std::move(url);
  entry.status = status;
  entry.how = "parse";
  return entry;
}

TEST(TraceRingTest, GivesWhatCameAfterTheReadersLastEntry) {
  TraceRing ring(8);
  ring.add(page("/a", 200));
  ring.add(page("/b", 200));
  TraceSlice first = ring.since(0, {});
  ASSERT_EQ(first.entries.size(), 2u);
  EXPECT_EQ(first.entries[0].url, "/a");
  EXPECT_EQ(first.entries[1].seq, 2u);
  EXPECT_EQ(first.last, 2u);
  ring.add(page("/c", 200));
  TraceSlice next = ring.since(first.last, {});
  ASSERT_EQ(next.entries.size(), 1u);
  EXPECT_EQ(next.entries[0].url, "/c");
  EXPECT_EQ(next.missed, 0u);
  EXPECT_TRUE(ring.since(next.last, {}).entries.empty());
}

TEST(TraceRingTest, OverwritesTheOldestAndCountsWhatAReaderMissed) {
  TraceRing ring(4);
  for (int i = 1; i <= 10; ++i) ring.add(page("/" + std::to_string(i), 200));
  TraceSlice slice = ring.since(0, {});
  EXPECT_EQ(slice.missed, 6u);  // 1..6 were overwritten
  ASSERT_EQ(slice.entries.size(), 4u);
  EXPECT_EQ(slice.entries.front().url, "/7");
  EXPECT_EQ(slice.entries.back().url, "/10");
  // A reader that saw up to 5 missed only 6.
  EXPECT_EQ(ring.since(5, {}).missed, 1u);
  EXPECT_EQ(ring.since(6, {}).missed, 0u);
}

TEST(TraceRingTest, FiltersByStatusAndUrlPrefix) {
  TraceRing ring(16);
  ring.add(page("/shop/a", 200));
  ring.add(page("/shop/b", 404));
  ring.add(page("/news", 404));
  TraceEntry purge;
  purge.kind = TraceEntry::Kind::kPurge;
  purge.url = "/shop/";
  ring.add(purge);
  TraceSlice shop404 = ring.since(0, {404, "/shop"});
  ASSERT_EQ(shop404.entries.size(), 1u);
  EXPECT_EQ(shop404.entries[0].url, "/shop/b");
  EXPECT_EQ(ring.since(0, {0, "/shop"}).entries.size(), 3u);  // the purge too
  EXPECT_EQ(ring.since(0, {404, ""}).entries.size(), 2u);
  EXPECT_EQ(ring.since(0, {0, "/shop"}).last, 4u);
}

TEST(TraceRingTest, CutsLongUrlsAndSaysWhatEachKindIs) {
  TraceRing ring(2);
  ring.add(page(std::string(TraceRing::kMaxUrlBytes + 10, 'a'), 200));
  const TraceEntry entry = ring.since(0, {}).entries.at(0);
  EXPECT_EQ(entry.url.size(), TraceRing::kMaxUrlBytes);
  const nlohmann::json json = entry.toJson();
  EXPECT_EQ(json["kind"], "page");
  EXPECT_EQ(json["status"], 200);
  EXPECT_GT(json["ms"].get<int64_t>(), 0);
  TraceEntry purge;
  purge.kind = TraceEntry::Kind::kPurge;
  purge.fragments = 3;
  purge.path = "index";
  const nlohmann::json purgeJson = purge.toJson();
  EXPECT_EQ(purgeJson["kind"], "purge");
  EXPECT_EQ(purgeJson["files"], 3);
  EXPECT_FALSE(purgeJson.contains("status"));
}

}  // namespace
}  // namespace esi
