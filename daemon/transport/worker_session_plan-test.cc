// Parse plans: recorded from a first hit, sent for the next, dropped when
// the worker finds they no longer match, replayed by the worker, and their
// gzip segments (worker_session_plan.cc).

#include "transport/worker_session_test_worker.h"

namespace esi::session_test {
namespace {

TEST_F(WorkerSessionTest, FirstHitRecordsThePlanAndTheNextHitGetsIt) {
  worker_->openCached(1, kObject);
  serve();
  EXPECT_TRUE(worker_->received.plan.empty());  // an empty splice: send the body
  worker_->body(1, "ab<esi:include src=\"/x\"/>cd");
  worker_->end(1);
  serve();
  EXPECT_EQ(worker_->received.assembled, "ab[/x?]cd");

  worker_->openCached(2, kObject);
  serve();
  EXPECT_FALSE(fatal_);
  EXPECT_EQ(worker_->received.plan, "V0+2 C2:<esi:include src=\"/x\"/> I/x V25+2");
  EXPECT_EQ(worker_->received.planLength, 27u);
  EXPECT_EQ(stats_.planned, 1u);
  EXPECT_EQ(stats_.activeStreams, 0u);  // nothing more comes for stream 2
  EXPECT_TRUE(worker_->received.reusable);
}

TEST_F(WorkerSessionTest, PagesAreTracedAsServedAndPlanLookupsCounted) {
  TraceRing trace;
  session_->setTrace(&trace);
  worker_->openCached(1, kObject);  // no plan yet: a miss, parsed
  serve();
  worker_->body(1, "ab<esi:include src=\"/x\"/>cd");
  worker_->end(1);
  serve();
  worker_->openCached(2, kObject);  // the plan: a hit
  serve();
  worker_->openCached(3, kObject, 2, true);  // the worker found it wrong: a drop
  worker_->body(3, "<esi:include src=\"/x\"/>cd");
  worker_->cancel(3);
  serve();
  EXPECT_FALSE(fatal_);
  EXPECT_EQ(stats_.planMisses, 1u);
  EXPECT_EQ(stats_.planned, 1u);
  EXPECT_EQ(stats_.planDrops, 1u);
  EXPECT_EQ(stats_.fragmentsResolved, 2u);
  const TraceSlice slice = trace.since(0, {});
  ASSERT_EQ(slice.entries.size(), 3u);
  const auto fields = [](const TraceEntry& e) {
    return std::make_tuple(e.url, e.status, e.how, e.fragments, e.bytes);
  };
  EXPECT_EQ(fields(slice.entries[0]), std::make_tuple("/p", 203u, "parse", 1u, 27u));
  EXPECT_EQ(fields(slice.entries[1]), std::make_tuple("/p", 203u, "plan", 1u, 27u));
  EXPECT_EQ(fields(slice.entries[2]), std::make_tuple("/p", 203u, "cancel", 1u, 25u));
}

TEST_F(WorkerSessionTest, OnePlanIsEvaluatedForEachHitsOwnCookies) {
  const std::string page =
      "<esi:choose><esi:when test=\"$(HTTP_COOKIE{g})=='a'\">A</esi:when>"
      "<esi:otherwise><esi:include src=\"/o/$(HTTP_COOKIE{id})\"/></esi:otherwise>"
      "</esi:choose>";
  worker_->openCached(1, kObject, 0, false, "g=a");
  worker_->body(1, page);
  worker_->end(1);
  serve();
  EXPECT_EQ(worker_->received.assembled, "A");

  worker_->openCached(2, kObject, 0, false, "g=a");
  serve();
  EXPECT_EQ(worker_->received.plan,
            "C0:<esi:choose><esi:when test=\"$(HTTP_COOKIE{g})=='a'\"> V52+1 "
            "C53:</esi:when><esi:otherwise><esi:include src=\"/o/$(HTTP_COOKIE{id})\"/>"
            "</esi:otherwise></esi:choose>");
  worker_->received.plan.clear();
  worker_->openCached(3, kObject, 0, false, "id=7");
  serve();
  EXPECT_EQ(worker_->received.plan,
            "C0:<esi:choose><esi:when test=\"$(HTTP_COOKIE{g})=='a'\"> I/o/7");
  EXPECT_FALSE(worker_->received.reusable);
  EXPECT_FALSE(fatal_);
  EXPECT_EQ(stats_.planned, 2u);
}

TEST_F(WorkerSessionTest, AFailedPlanIsForgottenAndTheRestParsedFromItsBase) {
  worker_->openCached(1, kObject);
  worker_->body(1, "ab<esi:include src=\"/x\"/>cd");
  worker_->end(1);
  serve();
  worker_->openCached(2, kObject, 2, true);
  worker_->body(2, "");  // offsets of stream 2 start at its base
  serve();
  EXPECT_FALSE(fatal_);
  worker_->openCached(3, kObject);
  serve();
  EXPECT_TRUE(worker_->received.plan.empty()) << worker_->received.plan;
  EXPECT_EQ(stats_.planned, 0u);
}

TEST_F(WorkerSessionTest, AFailedPlanResumesInsideTheBranchItStoppedIn) {
  const std::string page =
      "a<esi:choose><esi:when test=\"$(HTTP_COOKIE{g})=='x'\">b</esi:when>"
      "<esi:otherwise>c</esi:otherwise></esi:choose>d";
  worker_->openCached(1, kObject, 0, false, "g=x");
  worker_->body(1, page);
  worker_->end(1);
  serve();
  EXPECT_EQ(worker_->received.assembled, "abd");
  // The worker replayed "ab" and stopped after the b at 53; the bytes from
  // there come to esid (offsets from the stream's start: the test worker
  // finds the same bytes in stream 1's copy).
  worker_->received.assembled.clear();
  worker_->openCached(2, kObject, 54, true, "g=x");
  worker_->body(2, page.substr(54));
  worker_->end(2);
  serve();
  EXPECT_FALSE(fatal_);
  EXPECT_EQ(worker_->received.assembled, "d");
}

TEST_F(WorkerSessionTest, AFailedPlansBaseInsideATryFailsTheStreamAndForgetsThePlan) {
  const std::string page = "<esi:try><esi:attempt>a</esi:attempt></esi:try>";
  worker_->openCached(1, kObject);
  worker_->body(1, page);
  worker_->end(1);
  serve();
  worker_->openCached(2, kObject, 23, true);
  serve();
  EXPECT_FALSE(fatal_);
  EXPECT_EQ(worker_->received.failed, "the plan stopped matching inside <esi:try>");
  EXPECT_EQ(stats_.activeStreams, 0u);
  worker_->openCached(3, kObject);
  serve();
  EXPECT_TRUE(worker_->received.plan.empty());  // forgotten: send the body
}

TEST_F(WorkerSessionTest, AnObjectIdentityOfTheWrongSizeEndsTheSession) {
  worker_->openCached(1, std::string(39, 'o'));
  serve();
  ASSERT_TRUE(fatal_);
  EXPECT_NE(fatal_->find("object identity"), std::string::npos);
}

TEST_F(WorkerSessionTest, ABaseWithoutAFailedPlanEndsTheSession) {
  worker_->openCached(1, kObject, 5);
  serve();
  ASSERT_TRUE(fatal_);
  EXPECT_NE(fatal_->find("base"), std::string::npos);
}

TEST_F(WorkerSessionTest, AReplayedHitIsCountedAsPlannedAndNeedsNoAnswer) {
  recordPlanOf(kStitchedPage, 6);
  worker_->replayed(kObject, "plans", true);
  worker_->replayed(kObject, "plans", false);
  worker_->replayed(std::string(48, 'z'), "plans", false);  // a plan gone since
  serve();
  EXPECT_FALSE(fatal_);
  EXPECT_TRUE(worker_->received.plan.empty());
  EXPECT_EQ(stats_.planned, 3u);
  EXPECT_EQ(stats_.replayed, 3u);
  EXPECT_EQ(stats_.stitched, 1u);
  EXPECT_EQ(plans_.zones()["plans"]["hits"], 2);
}

TEST_F(WorkerSessionTest, AReplayedReportWithoutAnObjectIdentityEndsTheSession) {
  worker_->replayed("short", "plans", false);
  serve();
  ASSERT_TRUE(fatal_);
  EXPECT_NE(fatal_->find("replayed"), std::string::npos);
}

TEST_F(WorkerSessionTest, AStitchedHitNamesTheSegmentsOfLongRunsAndPinsThem) {
  recordPlanOf(kStitchedPage, 6);
  worker_->openCached(2, kObject, 0, false, "", 0, true);
  serve();
  EXPECT_FALSE(fatal_);
  EXPECT_EQ(worker_->received.plan,
            "V0+300S C300:<esi:include src=\"/x\"/> I/x V323+100 "
            "C423:<esi:include src=\"/y\"/> I/y V446+200S");
  const uint32_t pin = worker_->received.pin;
  ASSERT_NE(pin, 0u);
  EXPECT_EQ(worker_->pins[pin - 1], 1u);
  EXPECT_EQ(stats_.stitched, 1u);

  ASSERT_EQ(worker_->received.segments.size(), 2u);
  for (const ReceivedSegment& segment : worker_->received.segments) {
    const std::string run = kStitchedPage.substr(segment.runOffset, segment.runLength);
    EXPECT_EQ(segment.head, run.substr(0, 32));
    EXPECT_EQ(segment.crc, crc32(0, reinterpret_cast<const Bytef*>(run.data()),
                                 static_cast<uInt>(run.size())));
    ASSERT_LE(segment.offset + segment.length, worker_->arenaSize);
    EXPECT_EQ(inflateSegment(std::string_view(static_cast<const char*>(worker_->arena) +
                                                  segment.offset,
                                              segment.length)),
              run);
  }

  // Each hit pins once more; the worker lowers each count when it is done.
  worker_->openCached(3, kObject, 0, false, "", 0, true);
  serve();
  EXPECT_EQ(worker_->received.pin, pin);
  EXPECT_EQ(worker_->pins[pin - 1], 2u);
}

TEST_F(WorkerSessionTest, AHitWithoutSegmentsGetsNeitherSegmentsNorAPin) {
  recordPlanOf(kStitchedPage, 9);
  worker_->openCached(2, kObject);
  serve();
  EXPECT_EQ(worker_->received.plan,
            "V0+300 C300:<esi:include src=\"/x\"/> I/x V323+100 "
            "C423:<esi:include src=\"/y\"/> I/y V446+200");
  EXPECT_EQ(worker_->received.pin, 0u);
  EXPECT_TRUE(std::all_of(worker_->pins, worker_->pins + ESI_PIN_SLOTS,
                          [](uint32_t count) { return count == 0; }));
  EXPECT_EQ(stats_.stitched, 0u);
}

TEST_F(WorkerSessionTest, APlanRecordedWithoutAStitchLevelHasNoSegmentsToName) {
  recordPlanOf(kStitchedPage, 0);
  worker_->openCached(2, kObject, 0, false, "", 0, true);
  serve();
  EXPECT_FALSE(fatal_);
  EXPECT_EQ(worker_->received.planLength, kStitchedPage.size());
  EXPECT_EQ(worker_->received.plan.find('S'), std::string::npos);
  EXPECT_EQ(worker_->received.pin, 0u);
}

TEST_F(WorkerSessionTest, APlanDroppedAtASegmentedRunsStartResumesInsideItsBranch) {
  // The worker found another head where the run in the when branch starts
  // (at 53): esid parses from there, inside the branch.
  const std::string page = "a<esi:choose><esi:when test=\"$(HTTP_COOKIE{g})=='x'\">" +
                           prose(200) +
                           "</esi:when><esi:otherwise>c</esi:otherwise></esi:choose>d";
  recordPlanOf(page, 6, "g=x");
  worker_->openCached(2, kObject, 0, false, "g=x", 0, true);
  serve();
  ASSERT_EQ(worker_->received.segments.size(), 1u);
  ASSERT_EQ(worker_->received.segments[0].runOffset, 53u);

  worker_->received.assembled.clear();
  worker_->openCached(3, kObject, 53, true, "g=x");
  worker_->body(3, page.substr(53));
  worker_->end(3);
  serve();
  EXPECT_FALSE(fatal_);
  EXPECT_EQ(worker_->received.assembled, prose(200) + "d");
}

}  // namespace
}  // namespace esi::session_test
