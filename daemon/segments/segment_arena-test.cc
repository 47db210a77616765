// The segment arena with real zlib: segments stitched between live deflate
// output make a gzip stream that inflates to the page, and extents come back
// only once no pin table holds their slot.

#include "segments/segment_arena.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zlib.h>

#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

namespace esi {
namespace {

constexpr uint64_t kArenaBytes = uint64_t{1} << 20;

std::string text(size_t bytes, char seed) {
  std::string out;
  while (out.size() < bytes) out += std::string("<p>lorem ipsum ") + seed + " dolor sit amet</p>\n";
  out.resize(bytes);
  return out;
}

// Bytes that deflate cannot shrink: their segment is as long as they are
// (plus a few bytes), which sizes extents predictably.
std::string noise(size_t bytes, uint32_t seed) {
  std::mt19937 random(seed);
  std::string out(bytes, '\0');
  for (char& c : out) c = static_cast<char>(random());
  return out;
}

// The arena as a worker maps it: read-only.
class ArenaView {
 public:
  explicit ArenaView(const SegmentArena& arena)
      : size_(arena.size()),
        map_(mmap(nullptr, size_, PROT_READ, MAP_SHARED, arena.memfd(), 0)) {}
  ~ArenaView() {
    if (map_ != MAP_FAILED) munmap(map_, size_);
  }
  ArenaView(const ArenaView&) = delete;
  ArenaView& operator=(const ArenaView&) = delete;

  bool mapped() const { return map_ != MAP_FAILED; }
  void* map() const { return map_; }
  std::string_view bytesOf(const Segment& segment) const {
    return std::string_view(static_cast<const char*>(map_) + segment.offset, segment.length);
  }

 private:
  const size_t size_;
  void* const map_;
};

std::vector<uint32_t> pinTable() { return std::vector<uint32_t>(ESI_PIN_SLOTS, 0); }

// A plan of one run: the whole body.
std::optional<DeflatedRuns> deflateAll(SegmentArena& arena, const std::string& body) {
  return arena.deflate(body, {RunRange{0, static_cast<uint32_t>(body.size())}}, 6);
}

// What the connector's second filter does: plaintext deflated live, with a
// full flush before each segment, and the stream finished at the end.
class LiveDeflate {
 public:
  LiveDeflate() {
    EXPECT_EQ(deflateInit2(&z_, 6, Z_DEFLATED, -15, 8, Z_DEFAULT_STRATEGY), Z_OK);
  }
  ~LiveDeflate() { deflateEnd(&z_); }

  void add(std::string_view bytes, int flush, std::string& out) {
    z_.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(bytes.data()));
    z_.avail_in = static_cast<uInt>(bytes.size());
    do {
      Bytef chunk[4096];
      z_.next_out = chunk;
      z_.avail_out = sizeof(chunk);
      EXPECT_NE(::deflate(&z_, flush), Z_STREAM_ERROR);
      out.append(reinterpret_cast<char*>(chunk), sizeof(chunk) - z_.avail_out);
    } while (z_.avail_out == 0);
  }

 private:
  z_stream z_{};
};

std::string gunzip(const std::string& gzip, int& rc) {
  z_stream z{};
  EXPECT_EQ(inflateInit2(&z, 16 + 15), Z_OK);
  z.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(gzip.data()));
  z.avail_in = static_cast<uInt>(gzip.size());
  std::string out;
  do {
    Bytef chunk[4096];
    z.next_out = chunk;
    z.avail_out = sizeof(chunk);
    rc = inflate(&z, Z_NO_FLUSH);
    out.append(reinterpret_cast<char*>(chunk), sizeof(chunk) - z.avail_out);
  } while (rc == Z_OK);
  inflateEnd(&z);
  return out;
}

TEST(SegmentArena, SegmentsBetweenLiveDeflateInflateToThePageWithItsCrc) {
  SegmentArena arena(kArenaBytes);
  // Runs of the page that get segments, a short one that does not, and
  // the constructs between them, replaced by fragments' output.
  const std::string page = text(300, 'a') + "<esi:include src=\"/f\"/>" + text(5000, 'b') +
                           text(200, 'c') + "<esi:include src=\"/g\"/>" + text(100, 'd');
  const uint32_t second = 300 + 23;
  const std::vector<RunRange> runs{{0, 300}, {second, 5000}, {second + 5000, 200}};
  auto deflated = arena.deflate(page, runs, 6);
  ASSERT_TRUE(deflated);
  ASSERT_EQ(deflated->segments.size(), 3u);
  const ArenaView view(arena);
  ASSERT_TRUE(view.mapped());
  const Segment& last = deflated->segments[2];
  EXPECT_EQ(last.runOffset, second + 5000u);
  EXPECT_EQ(last.runLength, 200u);
  EXPECT_EQ(std::string(last.head.begin(), last.head.end()), page.substr(second + 5000, 32));
  EXPECT_LT(deflated->segments[1].length, 5000u / 4);  // text compresses

  // segment, fragment, segment, segment (no live bytes between), fragment,
  // the short run, end.
  const std::string fragmentF = "[fragment f]", fragmentG = "[g]";
  const std::string expected =
      page.substr(0, 300) + fragmentF + page.substr(second, 5200) + fragmentG + text(100, 'd');
  std::string gzip("\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\xff", 10);
  LiveDeflate live;
  uLong crc = crc32(0, nullptr, 0);
  auto segment = [&](const Segment& s) {
    gzip += view.bytesOf(s);
    crc = crc32_combine(crc, s.crc, s.runLength);
  };
  auto plain = [&](const std::string& bytes, int flush) {
    live.add(bytes, flush, gzip);
    crc = crc32(crc, reinterpret_cast<const Bytef*>(bytes.data()), static_cast<uInt>(bytes.size()));
  };
  segment(deflated->segments[0]);
  plain(fragmentF, Z_FULL_FLUSH);
  segment(deflated->segments[1]);
  segment(deflated->segments[2]);
  plain(fragmentG + text(100, 'd'), Z_FINISH);
  for (uint32_t value : {static_cast<uint32_t>(crc), static_cast<uint32_t>(expected.size())}) {
    for (int i = 0; i < 4; ++i) gzip += static_cast<char>(value >> (8 * i));
  }

  int rc = Z_OK;
  const std::string inflated = gunzip(gzip, rc);
  EXPECT_EQ(rc, Z_STREAM_END);  // the trailer's CRC and length were checked
  EXPECT_EQ(inflated, expected);
}

TEST(SegmentArena, TheArenaIsSealedAgainstWritesGrowthAndShrinking) {
  SegmentArena arena(kArenaBytes);
  const int fd = arena.memfd();
  const int seals = fcntl(fd, F_GET_SEALS);
  EXPECT_TRUE(seals & F_SEAL_SHRINK);
  EXPECT_TRUE(seals & F_SEAL_GROW);
  EXPECT_TRUE(seals & F_SEAL_SEAL);
  EXPECT_TRUE(seals & 0x0010);  // F_SEAL_FUTURE_WRITE
  struct stat st;
  ASSERT_EQ(fstat(fd, &st), 0);
  EXPECT_EQ(static_cast<uint64_t>(st.st_size), arena.size());

  void* writable = mmap(nullptr, arena.size(), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  EXPECT_EQ(writable, MAP_FAILED);
  if (writable != MAP_FAILED) munmap(writable, arena.size());
  EXPECT_NE(ftruncate(fd, 4096), 0);
  EXPECT_NE(ftruncate(fd, static_cast<off_t>(arena.size() * 2)), 0);
  EXPECT_NE(pwrite(fd, "x", 1, 0), 1);

  // A worker's read-only mapping sees what esid writes after it, and
  // cannot be made writable.
  const ArenaView view(arena);
  ASSERT_TRUE(view.mapped());
  const std::string run = text(1000, 'x');
  auto deflated = deflateAll(arena, run);
  ASSERT_TRUE(deflated);
  const Segment& segment = deflated->segments[0];
  EXPECT_GT(segment.length, 0u);
  EXPECT_EQ(std::string_view(reinterpret_cast<const char*>(segment.head.data()), 32),
            run.substr(0, 32));
  EXPECT_NE(view.bytesOf(segment).find_first_not_of('\0'), std::string_view::npos);
  EXPECT_NE(mprotect(view.map(), arena.size(), PROT_READ | PROT_WRITE), 0);
}

TEST(SegmentArena, FreedNeighboursCoalesceAndTheFirstFitIsTaken) {
  SegmentArena arena(kArenaBytes);
  auto a = deflateAll(arena, noise(200 << 10, 1));
  auto b = deflateAll(arena, noise(200 << 10, 2));
  auto c = deflateAll(arena, noise(200 << 10, 3));
  ASSERT_TRUE(a && b && c);
  EXPECT_EQ(a->lease.offset(), 0u);
  EXPECT_EQ(b->lease.offset(), a->lease.bytes());
  EXPECT_EQ(c->lease.offset(), a->lease.bytes() + b->lease.bytes());
  EXPECT_EQ(a->lease.bytes() % SegmentArena::kGranule, 0u);

  const uint64_t freed = a->lease.bytes() + b->lease.bytes();
  a.reset();
  b.reset();
  EXPECT_EQ(arena.stats()["segment_arena_quarantined_bytes"], freed);
  // Neither freed extent alone holds 350 KiB; the two together come first.
  auto d = deflateAll(arena, noise(350 << 10, 4));
  ASSERT_TRUE(d);
  EXPECT_EQ(d->lease.offset(), 0u);

  // What is left (about 50 KiB between d and c, 424 KiB after c) does not
  // hold 600 KiB: recorded without segments, and counted.
  EXPECT_FALSE(deflateAll(arena, noise(600 << 10, 5)));
  const nlohmann::json stats = arena.stats();
  EXPECT_EQ(stats["segment_arena_full"], 1);
  EXPECT_EQ(stats["segment_extents"], 2);
  EXPECT_EQ(stats["segment_quarantined_extents"], 0);
  EXPECT_EQ(stats["segment_arena_used_bytes"], c->lease.bytes() + d->lease.bytes());
  EXPECT_EQ(stats["segments_recorded"], 4);
}

TEST(SegmentArena, AQuarantinedExtentWaitsUntilNoTablePinsItsSlot) {
  SegmentArena arena(kArenaBytes);
  std::vector<uint32_t> first = pinTable(), second = pinTable();
  PinTable firstPins(arena, first.data());
  PinTable secondPins(arena, second.data());

  auto a = deflateAll(arena, noise(4096, 1));
  ASSERT_TRUE(a);
  const uint32_t slot = a->lease.slot();
  const uint64_t offset = a->lease.offset();
  firstPins.pin(slot);
  secondPins.pin(slot);
  EXPECT_EQ(first[slot], 1u);
  a.reset();  // the plan is evicted while two workers send its segments

  auto b = deflateAll(arena, noise(4096, 2));
  ASSERT_TRUE(b);
  EXPECT_NE(b->lease.offset(), offset);
  EXPECT_NE(b->lease.slot(), slot);

  __atomic_fetch_sub(&first[slot], 1, __ATOMIC_RELEASE);  // one worker is done
  auto c = deflateAll(arena, noise(4096, 3));
  ASSERT_TRUE(c);
  EXPECT_NE(c->lease.offset(), offset);

  __atomic_fetch_sub(&second[slot], 1, __ATOMIC_RELEASE);  // and the other
  auto d = deflateAll(arena, noise(4096, 4));
  ASSERT_TRUE(d);
  EXPECT_EQ(d->lease.offset(), offset);
  EXPECT_EQ(d->lease.slot(), slot);
}

TEST(SegmentArena, ATableUnregisteredWithItsSessionNoLongerHoldsAnything) {
  SegmentArena arena(kArenaBytes);
  auto a = deflateAll(arena, noise(4096, 1));
  ASSERT_TRUE(a);
  const uint64_t offset = a->lease.offset();
  {
    std::vector<uint32_t> counts = pinTable();
    PinTable pins(arena, counts.data());
    pins.pin(a->lease.slot());
    a.reset();
    auto b = deflateAll(arena, noise(4096, 2));
    ASSERT_TRUE(b);
    EXPECT_NE(b->lease.offset(), offset);
  }  // the worker's connection closes, its pins with it
  auto c = deflateAll(arena, noise(4096, 3));
  ASSERT_TRUE(c);
  EXPECT_EQ(c->lease.offset(), offset);
}

TEST(SegmentArena, ARetiredTableHoldsItsPinsUntilTheWorkerLowersThem) {
  SegmentArena arena(kArenaBytes);
  std::vector<uint32_t> counts = pinTable();
  auto a = deflateAll(arena, noise(4096, 1));
  ASSERT_TRUE(a);
  const uint64_t offset = a->lease.offset();
  const uint32_t slot = a->lease.slot();
  auto pins = std::make_unique<PinTable>(arena, counts.data());
  pins->pin(slot);
  a.reset();
  arena.retire(std::move(pins));  // the connection closed mid-send
  EXPECT_EQ(arena.stats()["segment_retired_pin_tables"], 1);

  auto b = deflateAll(arena, noise(4096, 2));
  ASSERT_TRUE(b);
  EXPECT_NE(b->lease.offset(), offset);

  counts[slot] = 0;  // the worker's request is over: it lowers its count
  auto c = deflateAll(arena, noise(4096, 3));
  ASSERT_TRUE(c);
  EXPECT_EQ(c->lease.offset(), offset);
  EXPECT_EQ(arena.stats()["segment_retired_pin_tables"], 0);
}

TEST(SegmentArena, ARetiredTableOfAWorkerThatExitedHoldsNothing) {
  SegmentArena arena(kArenaBytes);
  std::vector<uint32_t> counts = pinTable();
  const pid_t worker = fork();
  ASSERT_GE(worker, 0);
  if (worker == 0) {
    pause();  // until killed
    _exit(0);
  }
  UniqueFd pidfd(static_cast<int>(syscall(SYS_pidfd_open, worker, 0)));
  ASSERT_TRUE(pidfd);
  auto a = deflateAll(arena, noise(4096, 1));
  ASSERT_TRUE(a);
  const uint64_t offset = a->lease.offset();
  const uint32_t slot = a->lease.slot();
  auto pins = std::make_unique<PinTable>(arena, counts.data(), std::move(pidfd));
  pins->pin(slot);
  a.reset();
  arena.retire(std::move(pins));

  auto b = deflateAll(arena, noise(4096, 2));
  ASSERT_TRUE(b);
  EXPECT_NE(b->lease.offset(), offset);  // the worker lives: still pinned

  kill(worker, SIGKILL);  // dies mid-send, its count still raised
  ASSERT_EQ(waitpid(worker, nullptr, 0), worker);
  auto c = deflateAll(arena, noise(4096, 3));
  ASSERT_TRUE(c);
  EXPECT_EQ(c->lease.offset(), offset);
  EXPECT_EQ(counts[slot], 1u);
}

TEST(SegmentArena, WithoutAFreePinSlotAPlanGetsNoSegments) {
  SegmentArena arena(kArenaBytes);
  const std::string run = text(SegmentArena::kMinRunBytes, 's');
  std::vector<DeflatedRuns> plans;
  for (uint32_t i = 0; i < ESI_PIN_SLOTS; ++i) {
    auto deflated = deflateAll(arena, run);
    ASSERT_TRUE(deflated) << i;
    plans.push_back(std::move(*deflated));
  }
  EXPECT_EQ(arena.stats()["segment_free_slots"], 0);
  EXPECT_FALSE(deflateAll(arena, run));
  EXPECT_EQ(arena.stats()["segment_arena_full"], 1);
  plans.pop_back();
  EXPECT_TRUE(deflateAll(arena, run));
}

TEST(SegmentArena, NoRunsOrARunTooShortOrOutsideTheBodyGiveNoSegments) {
  SegmentArena arena(kArenaBytes);
  const std::string body = text(1000, 'r');
  EXPECT_FALSE(arena.deflate(body, {}, 6));
  EXPECT_FALSE(arena.deflate(body, {{0, SegmentArena::kMinRunBytes - 1}}, 6));
  EXPECT_FALSE(arena.deflate(body, {{900, 200}}, 6));
  EXPECT_EQ(arena.stats()["segment_arena_full"], 0);
}

TEST(SegmentArena, ASizeBelowOneMebibyteIsRefused) {
  EXPECT_THROW(SegmentArena(SegmentArena::kMinBytes - 1), std::invalid_argument);
}

}  // namespace
}  // namespace esi
