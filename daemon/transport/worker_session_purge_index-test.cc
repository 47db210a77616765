// The variant index's feed: zones and forgets (worker_session_purge_index.cc).

#include "transport/worker_session_test_worker.h"

namespace esi::session_test {
namespace {

TEST_F(WorkerSessionTest, AForgetOfMoreFilesThanAWorkerKeepsListsNone) {
  std::vector<Md5> many(1025);
  for (size_t i = 0; i < many.size(); ++i) {
    many[i][0] = static_cast<uint8_t>(i);
    many[i][1] = static_cast<uint8_t>(i >> 8);
  }
  session_->sendForget(std::vector<Md5>(many.begin(), many.begin() + 1024));
  session_->sendForget(many);
  worker_->drain();
  ASSERT_EQ(worker_->received.forgets.size(), 2u);
  EXPECT_EQ(worker_->received.forgets[0].size(), 1024u);
  EXPECT_EQ(worker_->received.forgets[1].size(), 0u);  // forget everything
}

TEST_F(WorkerSessionTest, ZoneWithARelativeOrClimbingPathEndsTheSession) {
  worker_->zone("pages", "/var/cache/../../etc");
  serve();
  EXPECT_TRUE(fatal_);
}

}  // namespace
}  // namespace esi::session_test
