// A worker's purges, by scan and by index, soft and hard, and what the
// other workers are told to forget (worker_session_purge.cc).

#include "transport/worker_session_test_worker.h"

#include <cstdio>

namespace esi::session_test {
namespace {

// A cache file as NGINX writes it: header, KEY line, response.
void writeCacheFile(const std::string& path, const std::string& key) {
  std::string file(336, '\0');
  const uint64_t version = 5;
  std::memcpy(file.data(), &version, 8);
  file += "\nKEY: " + key + "\n";
  const uint16_t headerStart = static_cast<uint16_t>(file.size());
  file += "HTTP/1.1 200 OK\r\n\r\n";
  const uint16_t bodyStart = static_cast<uint16_t>(file.size());
  std::memcpy(file.data() + 54, &headerStart, 2);
  std::memcpy(file.data() + 56, &bodyStart, 2);
  std::FILE* f = std::fopen(path.c_str(), "wb");
  std::fwrite(file.data(), 1, file.size(), f);
  std::fclose(f);
}

TEST_F(WorkerSessionTest, PurgeFindsEveryVariantByScanThenByIndex) {
  const std::string root = ::testing::TempDir() + "purge-zone-" + std::to_string(getpid());
  mkdir(root.c_str(), 0700);
  Md5 variant = md5Of("/page");
  variant[15] ^= 0xff;
  writeCacheFile(root + "/" + md5ToHex(md5Of("/page")), "/page");
  writeCacheFile(root + "/" + md5ToHex(variant), "/page");
  writeCacheFile(root + "/" + md5ToHex(md5Of("/other")), "/other");

  worker_->zone("pages", root);
  worker_->purgeKey(7, "pages", "/page");
  awaitPurged();
  ASSERT_TRUE(worker_->received.purgeDone);
  EXPECT_TRUE(worker_->received.purgeScanned);
  std::sort(worker_->received.purgedFiles.begin(), worker_->received.purgedFiles.end());
  std::vector<std::string> both{md5ToHex(md5Of("/page")), md5ToHex(variant)};
  std::sort(both.begin(), both.end());
  EXPECT_EQ(worker_->received.purgedFiles, both);

  // Stored after the purge: the index answers alone, with only the new one.
  worker_->stored("pages", "/page", variant);
  worker_->purgeKey(8, "pages", "/page");
  awaitPurged();
  EXPECT_FALSE(worker_->received.purgeScanned);
  EXPECT_EQ(worker_->received.purgedFiles, std::vector<std::string>{md5ToHex(variant)});
  EXPECT_FALSE(fatal_);
  std::system(("rm -rf " + root).c_str());
}

TEST_F(WorkerSessionTest, ASoftPurgeLeavesItsFilesInTheIndex) {
  const std::string root = ::testing::TempDir() + "soft-zone-" + std::to_string(getpid());
  mkdir(root.c_str(), 0700);
  writeCacheFile(root + "/" + md5ToHex(md5Of("/page")), "/page");
  const std::vector<std::string> page{md5ToHex(md5Of("/page"))};

  worker_->zone("pages", root);
  worker_->purgeKey(7, "pages", "/page", true);  // scans, then marks it stale
  awaitPurged();
  EXPECT_EQ(worker_->received.purgedFiles, page);
  worker_->purgeKey(8, "pages", "/page", true);  // the index still has it
  awaitPurged();
  EXPECT_FALSE(worker_->received.purgeScanned);
  EXPECT_EQ(worker_->received.purgedFiles, page);
  worker_->purgeKey(9, "pages", "/page");        // removed: the index forgets
  awaitPurged();
  EXPECT_EQ(worker_->received.purgedFiles, page);
  worker_->purgeKey(10, "pages", "/page");
  awaitPurged();
  EXPECT_FALSE(worker_->received.purgeScanned);
  EXPECT_TRUE(worker_->received.purgedFiles.empty());
  EXPECT_FALSE(fatal_);
  std::system(("rm -rf " + root).c_str());
}

TEST_F(WorkerSessionTest, APurgeThatFindsFilesIsAnnouncedAndForgottenBeforeItsAnswer) {
  const std::string root = ::testing::TempDir() + "forget-zone-" + std::to_string(getpid());
  mkdir(root.c_str(), 0700);
  writeCacheFile(root + "/" + md5ToHex(md5Of("/page")), "/page");

  worker_->zone("pages", root);
  worker_->purgeKey(7, "pages", "/page");
  awaitPurged();
  ASSERT_EQ(purgedCalls_.size(), 1u);
  EXPECT_EQ(purgedCalls_[0], std::vector<Md5>{md5Of("/page")});
  ASSERT_EQ(worker_->received.forgets.size(), 1u);
  EXPECT_EQ(worker_->received.forgets[0], std::vector<std::string>{md5ToHex(md5Of("/page"))});

  worker_->purgeKey(8, "pages", "/gone");  // nothing found: nothing to forget
  awaitPurged();
  EXPECT_EQ(purgedCalls_.size(), 1u);
  EXPECT_EQ(worker_->received.forgets.size(), 1u);
  EXPECT_FALSE(fatal_);
  std::system(("rm -rf " + root).c_str());
}

// esi_purge_timeout: the worker gave up on a purge still waiting for the
// zone's first scan and closed its connection, so the files the answer
// names are never unlinked, though answering made the index forget them.
TEST_F(WorkerSessionTest, APurgeAnsweredAfterItsWorkerWentLeavesTheZoneInDoubt) {
  const std::string root = ::testing::TempDir() + "gone-zone-" + std::to_string(getpid());
  mkdir(root.c_str(), 0700);
  writeCacheFile(root + "/" + md5ToHex(md5Of("/page")), "/page");

  worker_->zone("pages", root);
  worker_->purgeKey(7, "pages", "/page");
  // One turn reads both; the scan's end comes on a later one.
  uv_run(&loop_, UV_RUN_ONCE);
  session_->drainReports();  // as when the worker's end closes
  session_.reset();

  // A soft purge, which leaves the index as it finds it, asks after the
  // session's purge has been answered: the file is still on disk.
  std::optional<PurgeOutcome> probe;
  purger_.purge({.zone = "pages", .value = "/page", .soft = true},
                [&probe](PurgeOutcome outcome) { probe = std::move(outcome); });
  runUntil([&probe] { return probe.has_value(); });
  ASSERT_TRUE(probe);
  EXPECT_EQ(probe->files, std::vector<Md5>{md5Of("/page")});
  EXPECT_TRUE(probe->scanned);
  std::system(("rm -rf " + root).c_str());
}

}  // namespace
}  // namespace esi::session_test
