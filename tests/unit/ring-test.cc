#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <vector>

#include "esi/ring.h"

namespace {

// One ring in ordinary memory, with a producer and a consumer view of it, as
// the two processes have.
class RingTest : public ::testing::Test {
 protected:
  static constexpr uint32_t kSize = 4096;

  void SetUp() override {
    memory_.assign(kSize, 0);
    std::memset(&ctl_, 0, sizeof(ctl_));
    esi_ring_attach(&producer_, &ctl_, memory_.data(), kSize);
    esi_ring_attach(&consumer_, &ctl_, memory_.data(), kSize);
  }

  bool put(const std::string& payload) {
    void* slot = esi_ring_reserve(&producer_, payload.size());
    if (slot == nullptr) return false;
    std::memcpy(slot, payload.data(), payload.size());
    esi_ring_commit(&producer_, payload.size());
    return true;
  }

  std::string take() {
    const uint8_t* msg;
    uint32_t len;
    EXPECT_EQ(esi_ring_peek(&consumer_, &msg, &len), ESI_RING_OK);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(msg) % 8, 0u);
    std::string out(reinterpret_cast<const char*>(msg), len);
    esi_ring_release(&consumer_);
    return out;
  }

  alignas(64) esi_ring_ctl_t ctl_;
  std::vector<uint8_t> memory_;
  esi_ring_t producer_;
  esi_ring_t consumer_;
};

TEST_F(RingTest, RecordsComeOutInOrderAndAligned) {
  ASSERT_TRUE(put("one"));
  ASSERT_TRUE(put("second record"));
  EXPECT_EQ(take(), "one");
  EXPECT_EQ(take(), "second record");
  const uint8_t* msg;
  uint32_t len;
  EXPECT_EQ(esi_ring_peek(&consumer_, &msg, &len), ESI_RING_EMPTY);
}

TEST_F(RingTest, WrapAroundKeepsEveryRecordContiguous) {
  // Records of awkward sizes walk the indexes across the end many times;
  // u32 indexes are free-running, so also start near their wrap.
  producer_.tail = consumer_.head = ctl_.head = ctl_.tail = 0xFFFFF000u;
  for (int i = 0; i < 2000; ++i) {
    std::string payload(1 + (i * 37) % 900, static_cast<char>('a' + i % 26));
    ASSERT_TRUE(put(payload)) << i;
    ASSERT_EQ(take(), payload) << i;
  }
}

TEST_F(RingTest, FullRingRefusesUntilTheConsumerReleases) {
  const std::string big(1000, 'x');
  int stored = 0;
  while (put(big)) ++stored;
  EXPECT_EQ(stored, 4);  // 4 x (1000 + 8 header) fits in 4096, a fifth does not
  EXPECT_EQ(esi_ring_reserve(&producer_, 1000), nullptr);
  take();
  EXPECT_TRUE(put(big));
}

TEST_F(RingTest, OversizedPayloadIsRefused) {
  EXPECT_EQ(esi_ring_reserve(&producer_, kSize), nullptr);
  EXPECT_EQ(esi_ring_reserve(&producer_, esi_ring_max_payload(&producer_) + 1), nullptr);
  EXPECT_NE(esi_ring_reserve(&producer_, esi_ring_max_payload(&producer_)), nullptr);
}

TEST_F(RingTest, ProducerWakesOnlyASleepingConsumer) {
  void* slot = esi_ring_reserve(&producer_, 8);
  ASSERT_NE(slot, nullptr);
  EXPECT_EQ(esi_ring_commit(&producer_, 8), 0);  // nobody asleep
  take();
  EXPECT_EQ(esi_ring_wait_data(&consumer_), 1);  // empty: may sleep
  slot = esi_ring_reserve(&producer_, 8);
  EXPECT_EQ(esi_ring_commit(&producer_, 8), 1);  // must wake it
  slot = esi_ring_reserve(&producer_, 8);
  EXPECT_EQ(esi_ring_commit(&producer_, 8), 0);  // already woken once
}

TEST_F(RingTest, AQuietRecordLeavesTheConsumerAsleepUntilAWakeIsDue) {
  EXPECT_EQ(esi_ring_wake_due(&producer_), 0);   // empty: nothing owed
  EXPECT_EQ(esi_ring_wait_data(&consumer_), 1);  // asleep
  ASSERT_NE(esi_ring_reserve(&producer_, 8), nullptr);
  esi_ring_commit_quiet(&producer_, 8);
  EXPECT_EQ(esi_ring_used(&producer_), 16u);     // header and payload
  EXPECT_EQ(ctl_.consumer_waiting, 1u);          // still asleep
  ASSERT_NE(esi_ring_reserve(&producer_, 8), nullptr);
  EXPECT_EQ(esi_ring_commit(&producer_, 8), 1);  // a loud one wakes it
  EXPECT_EQ(esi_ring_wake_due(&producer_), 0);   // woken: nothing owed
  take();
  take();
  EXPECT_EQ(esi_ring_used(&producer_), 0u);
  EXPECT_EQ(esi_ring_wait_data(&consumer_), 1);
  EXPECT_EQ(esi_ring_wake_due(&producer_), 0);   // asleep, nothing unread
  ASSERT_NE(esi_ring_reserve(&producer_, 8), nullptr);
  esi_ring_commit_quiet(&producer_, 8);
  EXPECT_EQ(esi_ring_wake_due(&producer_), 1);   // asleep with a record
  EXPECT_EQ(esi_ring_wake_due(&producer_), 0);   // once
}

TEST_F(RingTest, ConsumerThatSeesDataDoesNotSleep) {
  put("x");
  EXPECT_EQ(esi_ring_wait_data(&consumer_), 0);
}

TEST_F(RingTest, ConsumerWakesAProducerWaitingForSpace) {
  const std::string big(1000, 'x');
  while (put(big)) {
  }
  EXPECT_EQ(esi_ring_wait_space(&producer_, 1000), 1);
  const uint8_t* msg;
  uint32_t len;
  ASSERT_EQ(esi_ring_peek(&consumer_, &msg, &len), ESI_RING_OK);
  EXPECT_EQ(esi_ring_release(&consumer_), 1);
}

TEST_F(RingTest, TailBeyondTheRingIsCorrupt) {
  ctl_.tail = consumer_.head + kSize + 8;
  const uint8_t* msg;
  uint32_t len;
  EXPECT_EQ(esi_ring_peek(&consumer_, &msg, &len), ESI_RING_CORRUPT);
}

TEST_F(RingTest, RecordLongerThanPublishedDataIsCorrupt) {
  put("12345678");
  reinterpret_cast<uint32_t*>(memory_.data())[0] = 2000;  // a lying length
  const uint8_t* msg;
  uint32_t len;
  EXPECT_EQ(esi_ring_peek(&consumer_, &msg, &len), ESI_RING_CORRUPT);
}

TEST_F(RingTest, UnknownRecordTypeIsCorrupt) {
  put("12345678");
  reinterpret_cast<uint32_t*>(memory_.data())[1] = 77;
  const uint8_t* msg;
  uint32_t len;
  EXPECT_EQ(esi_ring_peek(&consumer_, &msg, &len), ESI_RING_CORRUPT);
}

TEST_F(RingTest, ProducerIgnoresAConsumerIndexAheadOfItsTail) {
  ctl_.head = producer_.tail + 64;  // the consumer claims to have read the future
  EXPECT_EQ(esi_ring_reserve(&producer_, 8), nullptr);
}

}  // namespace
