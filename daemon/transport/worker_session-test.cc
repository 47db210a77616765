// esid's side of a worker connection: the Welcome, the loop's turns and
// wake-ups, a record that is no message (worker_session.cc).  Each message
// family has its file of tests beside its own: worker_session_stream-test.cc,
// _plan-test.cc, _purge-test.cc, _purge_index-test.cc.

#include "transport/worker_session_test_worker.h"

namespace esi::session_test {
namespace {

TEST_F(WorkerSessionTest, WelcomeCarriesSealedRingsOfTheAnnouncedSize) {
  ASSERT_GT(worker_->welcomeBytes, 0);
  EXPECT_TRUE(worker_->seals & F_SEAL_SHRINK);
  EXPECT_TRUE(worker_->seals & F_SEAL_GROW);
  EXPECT_EQ(worker_->mapSize, esi_shm_size(256 * 1024));
  EXPECT_EQ(static_cast<esi_shm_header_t*>(worker_->map)->magic, ESI_SHM_MAGIC);
}

TEST_F(WorkerSessionTest, WelcomeCarriesTheSegmentArenaSealedAgainstWrites) {
  ASSERT_TRUE(worker_->fds[3]);
  EXPECT_EQ(worker_->arenaSize, arena_.size());
  EXPECT_TRUE(worker_->arenaSeals & F_SEAL_SHRINK);
  EXPECT_TRUE(worker_->arenaSeals & F_SEAL_GROW);
  EXPECT_TRUE(worker_->arenaSeals & 0x0010);  // F_SEAL_FUTURE_WRITE
  EXPECT_NE(worker_->arena, MAP_FAILED);
  void* writable = mmap(nullptr, worker_->arenaSize, PROT_READ | PROT_WRITE, MAP_SHARED,
                        worker_->fds[3].get(), 0);
  EXPECT_EQ(writable, MAP_FAILED);
  if (writable != MAP_FAILED) munmap(writable, worker_->arenaSize);
}

TEST_F(WorkerSessionTest, GarbageRecordEndsTheSession) {
  const uint64_t garbage[4] = {0x0000000500000000ull, ~0ull, ~0ull, ~0ull};
  worker_->raw(garbage, sizeof(garbage));
  serve();
  EXPECT_TRUE(fatal_);
}

TEST_F(WorkerSessionTest, AWorkerWaitingForRoomInItsRingIsCountedWhenEsidReads) {
  worker_->open(1, "/p", "example.com");
  worker_->body(1, "abc");
  // The worker found no room (asking for more than the ring holds) and
  // says it sleeps: esid's next read wakes it, once, and counts it.
  EXPECT_EQ(esi_ring_wait_space(&worker_->toDaemon, 512 * 1024), 1);
  serve();
  EXPECT_FALSE(fatal_);
  EXPECT_EQ(stats_.workerWaits, 1u);
  worker_->end(1);
  serve();
  EXPECT_EQ(stats_.workerWaits, 1u);  // nobody waited this time
  EXPECT_EQ(Stats{stats_}.toJson()["worker_waits"], 1);
}

TEST_F(WorkerSessionTest, ACatchUpReadsEveryQuietReportNotATurnsWorth) {
  recordPlanOf(kStitchedPage, 6);
  worker_->quiet = true;
  for (int i = 0; i < 200; ++i) worker_->replayed(kObject, "plans", false);
  uv_run(&loop_, UV_RUN_NOWAIT);
  EXPECT_EQ(stats_.replayed, 0u);  // nothing woke esid
  session_->catchUp();
  EXPECT_FALSE(fatal_);
  EXPECT_EQ(stats_.replayed, 200u);
}

TEST_F(WorkerSessionTest, BusyRingYieldsTheLoopAfterATurn) {
  for (uint32_t id = 1; id <= 100; ++id) worker_->open(id, "/", "h");
  uv_run(&loop_, UV_RUN_NOWAIT);
  EXPECT_EQ(stats_.streams, 64u);  // one turn, then the loop goes round
  uv_run(&loop_, UV_RUN_NOWAIT);
  EXPECT_EQ(stats_.streams, 100u);
  EXPECT_FALSE(fatal_);
}

}  // namespace
}  // namespace esi::session_test
