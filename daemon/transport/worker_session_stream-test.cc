// A response's stream: open, body, end, and the splices that answer them
// (worker_session_stream.cc).

#include "transport/worker_session_test_worker.h"

namespace esi::session_test {
namespace {

TEST_F(WorkerSessionTest, PageSplitAcrossBodiesIsAnsweredWithSplices) {
  worker_->open(1, "/shop/index.html", "example.com");
  worker_->body(1, "<p>a<esi:incl");
  serve();
  worker_->body(1, "ude src=\"cart?x=1&amp;y=2\"/>b</p>");
  worker_->end(1);
  serve();
  EXPECT_FALSE(fatal_);
  EXPECT_TRUE(worker_->received.last);
  EXPECT_EQ(worker_->received.assembled, "<p>a[/shop/cart?x=1&y=2]b</p>");
  EXPECT_EQ(stats_.streams, 1u);
  EXPECT_EQ(stats_.includes, 1u);
  EXPECT_EQ(stats_.activeStreams, 0u);
}

TEST_F(WorkerSessionTest, IncludeOfAnotherAuthorityArrivesWithAnEmptyPath) {
  worker_->open(3, "/", "example.com");
  worker_->body(3, "<esi:include src=\"http://evil.example/x\"/>");
  worker_->end(3);
  serve();
  EXPECT_EQ(worker_->received.assembled, "[?]");
  EXPECT_EQ(stats_.errors, 1u);
}

// An include tag of exactly `length` bytes, '<' to '>', and what a worker
// gets for it when it is parsed.
std::string includeTag(size_t length) {
  const std::string head = "<esi:include src=\"/f/";
  const std::string tail = "\"/>";
  return head + std::string(length - head.size() - tail.size(), 'a') + tail;
}

std::string includeOf(size_t length) {
  return "[/f/" + std::string(length - 24, 'a') + "?]";
}

TEST_F(WorkerSessionTest, OpenSetsTheLongestTagThatIsParsed) {
  worker_->open(1, "/", "h", "", 300);
  worker_->body(1, includeTag(300) + includeTag(301));
  worker_->end(1);
  serve();
  EXPECT_FALSE(fatal_);
  EXPECT_EQ(worker_->received.assembled, includeOf(300) + includeTag(301));
  EXPECT_EQ(stats_.warnings, 1u);
}

TEST_F(WorkerSessionTest, NoTagLimitInOpenMeansTheDefault) {
  worker_->open(1, "/", "h");
  worker_->body(1, includeTag(8192) + includeTag(8193));
  worker_->end(1);
  serve();
  EXPECT_EQ(worker_->received.assembled, includeOf(8192) + includeTag(8193));
}

TEST_F(WorkerSessionTest, AnOutOfRangeTagLimitIsClampedNotTrusted) {
  worker_->open(1, "/", "h", "", 1);
  worker_->body(1, includeTag(256) + includeTag(257));
  worker_->end(1);
  serve();
  EXPECT_EQ(worker_->received.assembled, includeOf(256) + includeTag(257));
  worker_->received.assembled.clear();
  worker_->open(2, "/", "h", "", UINT32_MAX);
  worker_->body(2, includeTag(9000));
  worker_->end(2);
  serve();
  EXPECT_FALSE(fatal_);
  EXPECT_EQ(worker_->received.assembled, includeOf(9000));
}

TEST_F(WorkerSessionTest, BodyForAStreamNeverOpenedEndsTheSession) {
  worker_->body(9, "hello");
  serve();
  ASSERT_TRUE(fatal_);
  EXPECT_NE(fatal_->find("not open"), std::string::npos);
}

TEST_F(WorkerSessionTest, StreamOpenedTwiceEndsTheSession) {
  worker_->open(4, "/", "h");
  worker_->open(4, "/", "h");
  serve();
  EXPECT_TRUE(fatal_);
}

TEST_F(WorkerSessionTest, VarsLiteralsAndTryMarkersTravelInSplices) {
  worker_->open(1, "/", "example.com", "id=<7>; other=x");
  worker_->body(1, "<esi:vars>[$(HTTP_COOKIE{id})]</esi:vars><esi:try><esi:attempt>a"
                   "</esi:attempt><esi:except>e</esi:except></esi:try>");
  worker_->end(1);
  serve();
  EXPECT_FALSE(fatal_);
  EXPECT_EQ(worker_->received.assembled, "[&lt;7&gt;]{a|e}");
}

TEST_F(WorkerSessionTest, ARequestVariableLongerThan64KiBEndsTheSession) {
  worker_->open(1, "/", "h", "a=" + std::string(64 * 1024, 'x'));
  serve();
  ASSERT_TRUE(fatal_);
  EXPECT_NE(fatal_->find("request variable"), std::string::npos);
}

TEST_F(WorkerSessionTest, AStitchLevelAbove9EndsTheSession) {
  worker_->openCached(1, kObject, 0, false, "", 10);
  serve();
  ASSERT_TRUE(fatal_);
  EXPECT_NE(fatal_->find("stitch level"), std::string::npos);
}

}  // namespace
}  // namespace esi::session_test
