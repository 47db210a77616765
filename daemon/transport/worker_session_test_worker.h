// What the tests of WorkerSession (worker_session-test.cc and one file per
// message family, as worker_session*.cc) share: a worker written with the
// connector's own C ring and codec over a real socketpair and memfd, and
// the fixture that connects it to a session.

#pragma once

#include "transport/worker_session.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/types.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include <capnp/serialize.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <zlib.h>

#include "esi_wire.h"
#include "transport/fd_passing.h"

namespace esi::session_test {

// A plan step's segment, as the worker reads it.
struct ReceivedSegment {
  uint64_t runOffset = 0;  // the verbatim step's
  uint64_t runLength = 0;
  uint64_t offset = 0;
  uint32_t length = 0;
  uint32_t crc = 0;
  std::string head;
};

struct Received {
  uint64_t released = 0;
  bool last = false;
  std::string assembled;  // verbatim bytes and [include path?args] markers
  std::vector<std::string> purgedFiles;  // hex names
  bool purgeDone = false;
  bool purgeScanned = false;
  std::vector<std::vector<std::string>> forgets;  // each Response.forget's
  std::string plan;  // "V0+3 C3:<esi I[/x?] ..." as the steps came; "" none
                     // (a verbatim step with a segment ends in "S")
  std::string failed;  // the reason of a Response.fail
  uint64_t planLength = 0;
  uint32_t pin = 0;
  bool reusable = false;
  std::vector<ReceivedSegment> segments;
};

class TestWorker {
 public:
  explicit TestWorker(int socketFd) {
    alignas(capnp::word) std::byte buf[256];
    std::optional<MessageWithFds> welcome = receiveWithFds(socketFd, buf, 4);
    if (!welcome) return;
    welcomeBytes = static_cast<ssize_t>(welcome->size);
    if (welcome->fds.size() != 4) return;
    std::move(welcome->fds.begin(), welcome->fds.end(), fds);
    capnp::FlatArrayMessageReader reader(
        kj::arrayPtr(reinterpret_cast<const capnp::word*>(buf), welcomeBytes / 8));
    arenaSize = reader.getRoot<wire::Welcome>().getArenaSize();
    arenaSeals = fcntl(fds[3].get(), F_GET_SEALS);
    arena = mmap(nullptr, arenaSize, PROT_READ, MAP_SHARED, fds[3].get(), 0);
    seals = fcntl(fds[0].get(), F_GET_SEALS);
    struct stat st;
    fstat(fds[0].get(), &st);
    mapSize = static_cast<size_t>(st.st_size);
    map = mmap(nullptr, mapSize, PROT_READ | PROT_WRITE, MAP_SHARED, fds[0].get(), 0);
    auto* header = static_cast<esi_shm_header_t*>(map);
    auto* base = static_cast<uint8_t*>(map) + ESI_SHM_HEADER_SIZE;
    esi_ring_attach(&toDaemon, &header->to_daemon, base, header->ring_size);
    esi_ring_attach(&toWorker, &header->to_worker, base + header->ring_size,
                    header->ring_size);
    pins = reinterpret_cast<uint32_t*>(static_cast<uint8_t*>(map) +
                                       esi_shm_pins_offset(header->ring_size));
  }
  TestWorker(const TestWorker&) = delete;
  TestWorker& operator=(const TestWorker&) = delete;

  ~TestWorker() {
    if (map != nullptr) munmap(map, mapSize);
    if (arena != nullptr && arena != MAP_FAILED) munmap(arena, arenaSize);
  }

  void open(uint32_t stream, const std::string& uri, const std::string& authority,
            const std::string& cookies = "", uint32_t maxTagBytes = 0) {
    send(stream, ESI_WIRE_REQUEST_OPEN_WHICH, [&](esi_wire_out_t* req) {
      esi_wire_out_t o;
      esi_wire_set_struct(req, ESI_WIRE_REQUEST_OPEN_PTR, ESI_WIRE_OPEN_DATA_WORDS,
                          ESI_WIRE_OPEN_POINTERS, &o);
      esi_wire_set_text(&o, ESI_WIRE_OPEN_URI_PTR, uri.data(), uri.size());
      esi_wire_set_text(&o, ESI_WIRE_OPEN_AUTHORITY_PTR, authority.data(), authority.size());
      esi_wire_set_u32(&o, ESI_WIRE_OPEN_MAX_TAG_BYTES_OFFSET, maxTagBytes);
      setCookies(&o, cookies);
    });
  }

  // Open.vars with only cookies.
  static void setCookies(esi_wire_out_t* open, const std::string& cookies) {
    if (cookies.empty()) return;
    esi_wire_out_t vars;
    esi_wire_set_struct(open, ESI_WIRE_OPEN_VARS_PTR, ESI_WIRE_REQUEST_VARS_DATA_WORDS,
                        ESI_WIRE_REQUEST_VARS_POINTERS, &vars);
    esi_wire_set_text(&vars, ESI_WIRE_REQUEST_VARS_COOKIES_PTR, cookies.data(), cookies.size());
  }

  // An open for a cache hit in plan zone "plans".
  // With esi_stitch: segments recorded at stitchLevel, and asked for.
  // The status openCached() says NGINX answers with.
  static constexpr uint16_t kStatus = 203;

  void openCached(uint32_t stream, const std::string& object, uint64_t base = 0,
                  bool planFailed = false, const std::string& cookies = "",
                  uint8_t stitchLevel = 0, bool segments = false) {
    send(stream, ESI_WIRE_REQUEST_OPEN_WHICH, [&](esi_wire_out_t* req) {
      esi_wire_out_t o;
      esi_wire_set_struct(req, ESI_WIRE_REQUEST_OPEN_PTR, ESI_WIRE_OPEN_DATA_WORDS,
                          ESI_WIRE_OPEN_POINTERS, &o);
      esi_wire_set_text(&o, ESI_WIRE_OPEN_URI_PTR, "/p", 2);
      esi_wire_set_text(&o, ESI_WIRE_OPEN_AUTHORITY_PTR, "h", 1);
      std::memcpy(esi_wire_alloc_data(&o, ESI_WIRE_OPEN_OBJECT_PTR, object.size()),
                  object.data(), object.size());
      esi_wire_set_text(&o, ESI_WIRE_OPEN_PLAN_ZONE_PTR, "plans", 5);
      esi_wire_set_u64(&o, ESI_WIRE_OPEN_PLAN_ZONE_BYTES_OFFSET, 1 << 20);
      esi_wire_set_u64(&o, ESI_WIRE_OPEN_BASE_OFFSET, base);
      esi_wire_set_u16(&o, ESI_WIRE_OPEN_STATUS_OFFSET, kStatus);
      // The C codec writes no single bytes: the level is the high byte of
      // a u16 whose low byte (bools, maybe) is written after it.
      static_assert(ESI_WIRE_OPEN_STITCH_LEVEL_OFFSET % 2 == 1);
      esi_wire_set_u16(&o, ESI_WIRE_OPEN_STITCH_LEVEL_OFFSET - 1,
                       static_cast<uint16_t>(stitchLevel << 8));
      esi_wire_set_bool(&o, ESI_WIRE_OPEN_PLAN_FAILED_BIT, planFailed);
      esi_wire_set_bool(&o, ESI_WIRE_OPEN_SEGMENTS_BIT, segments);
      setCookies(&o, cookies);
    });
  }

  void replayed(const std::string& object, const std::string& zone, bool stitched) {
    send(0, ESI_WIRE_REQUEST_REPLAYED_WHICH, [&](esi_wire_out_t* req) {
      esi_wire_out_t r;
      esi_wire_set_struct(req, ESI_WIRE_REQUEST_REPLAYED_PTR, ESI_WIRE_REPLAYED_DATA_WORDS,
                          ESI_WIRE_REPLAYED_POINTERS, &r);
      esi_wire_set_text(&r, ESI_WIRE_REPLAYED_ZONE_PTR, zone.data(), zone.size());
      std::memcpy(esi_wire_alloc_data(&r, ESI_WIRE_REPLAYED_OBJECT_PTR, object.size()),
                  object.data(), object.size());
      esi_wire_set_bool(&r, ESI_WIRE_REPLAYED_STITCHED_BIT, stitched);
    });
  }

  void body(uint32_t stream, const std::string& bytes) {
    sent_ += bytes;
    send(stream, ESI_WIRE_REQUEST_BODY_WHICH, [&](esi_wire_out_t* req) {
      uint8_t* dst = esi_wire_alloc_data(req, ESI_WIRE_REQUEST_BODY_PTR, bytes.size());
      std::memcpy(dst, bytes.data(), bytes.size());
    });
  }

  void zone(const std::string& name, const std::string& path) {
    send(0, ESI_WIRE_REQUEST_ZONE_WHICH, [&](esi_wire_out_t* req) {
      esi_wire_out_t z;
      esi_wire_set_struct(req, ESI_WIRE_REQUEST_ZONE_PTR, ESI_WIRE_ZONE_DATA_WORDS,
                          ESI_WIRE_ZONE_POINTERS, &z);
      esi_wire_set_text(&z, ESI_WIRE_ZONE_NAME_PTR, name.data(), name.size());
      esi_wire_set_text(&z, ESI_WIRE_ZONE_PATH_PTR, path.data(), path.size());
      esi_wire_set_u64(&z, ESI_WIRE_ZONE_INDEX_BYTES_OFFSET, 1 << 20);
    });
  }

  void stored(const std::string& zone, const std::string& key, const Md5& file) {
    send(0, ESI_WIRE_REQUEST_STORED_WHICH, [&](esi_wire_out_t* req) {
      esi_wire_out_t st;
      esi_wire_set_struct(req, ESI_WIRE_REQUEST_STORED_PTR, ESI_WIRE_STORED_DATA_WORDS,
                          ESI_WIRE_STORED_POINTERS, &st);
      esi_wire_set_text(&st, ESI_WIRE_STORED_ZONE_PTR, zone.data(), zone.size());
      esi_wire_set_text(&st, ESI_WIRE_STORED_KEY_PTR, key.data(), key.size());
      std::memcpy(esi_wire_alloc_data(&st, ESI_WIRE_STORED_FILE_PTR, 16), file.data(), 16);
    });
  }

  void purgeKey(uint32_t id, const std::string& zone, const std::string& key,
                bool soft = false) {
    received.purgedFiles.clear();
    received.purgeDone = false;
    send(id, ESI_WIRE_REQUEST_PURGE_WHICH, [&](esi_wire_out_t* req) {
      esi_wire_out_t p;
      esi_wire_set_struct(req, ESI_WIRE_REQUEST_PURGE_PTR, ESI_WIRE_PURGE_DATA_WORDS,
                          ESI_WIRE_PURGE_POINTERS, &p);
      esi_wire_set_text(&p, ESI_WIRE_PURGE_ZONE_PTR, zone.data(), zone.size());
      esi_wire_set_u16(&p, ESI_WIRE_PURGE_WHICH_OFFSET, ESI_WIRE_PURGE_KEY_WHICH);
      esi_wire_set_text(&p, ESI_WIRE_PURGE_KEY_PTR, key.data(), key.size());
      esi_wire_set_bool(&p, ESI_WIRE_PURGE_SOFT_BIT, soft);
    });
  }

  void end(uint32_t stream) {
    send(stream, ESI_WIRE_REQUEST_END_WHICH, [](esi_wire_out_t*) {});
  }

  void cancel(uint32_t stream) {
    send(stream, ESI_WIRE_REQUEST_CANCEL_WHICH, [](esi_wire_out_t*) {});
  }

  void raw(const void* payload, uint32_t len) {
    void* slot = esi_ring_reserve(&toDaemon, len);
    ASSERT_NE(slot, nullptr);
    std::memcpy(slot, payload, len);
    if (quiet) {
      esi_ring_commit_quiet(&toDaemon, len);
    } else if (esi_ring_commit(&toDaemon, len)) {
      wakeDaemon();
    }
  }

  // Records are published without waking esid, as the worker's replayed
  // hits' reports are.
  bool quiet = false;

  // Reads every answer waiting in the ring into received.
  void drain() {
    const uint8_t* payload;
    uint32_t len;
    while (esi_ring_peek(&toWorker, &payload, &len) == ESI_RING_OK) {
      esi_wire_msg_t msg;
      esi_wire_struct_t root, splice, item, include;
      esi_wire_list_t list;
      ASSERT_EQ(esi_wire_open(&msg, payload, len, &root), 0);
      if (esi_wire_u16(&root, ESI_WIRE_RESPONSE_WHICH_OFFSET) == ESI_WIRE_RESPONSE_PURGED_WHICH) {
        esi_wire_struct_t purged;
        const uint8_t* files;
        size_t n;
        ASSERT_EQ(esi_wire_get_struct(&root, ESI_WIRE_RESPONSE_PURGED_PTR, &purged), 0);
        ASSERT_EQ(esi_wire_get_data(&purged, ESI_WIRE_PURGED_FILES_PTR, &files, &n), 0);
        ASSERT_EQ(n % 16, 0u);
        for (size_t i = 0; i < n; i += 16) {
          Md5 md5;
          std::memcpy(md5.data(), files + i, 16);
          received.purgedFiles.push_back(md5ToHex(md5));
        }
        received.purgeScanned = esi_wire_bool(&purged, ESI_WIRE_PURGED_SCANNED_BIT);
        received.purgeDone = !esi_wire_bool(&purged, ESI_WIRE_PURGED_MORE_BIT);
        esi_ring_release(&toWorker);
        continue;
      }
      if (esi_wire_u16(&root, ESI_WIRE_RESPONSE_WHICH_OFFSET) == ESI_WIRE_RESPONSE_FORGET_WHICH) {
        const uint8_t* files;
        size_t n;
        ASSERT_EQ(esi_wire_u32(&root, ESI_WIRE_RESPONSE_STREAM_OFFSET), 0u);
        ASSERT_EQ(esi_wire_get_data(&root, ESI_WIRE_RESPONSE_FORGET_PTR, &files, &n), 0);
        ASSERT_EQ(n % 16, 0u);
        received.forgets.emplace_back();
        for (size_t i = 0; i < n; i += 16) {
          Md5 md5;
          std::memcpy(md5.data(), files + i, 16);
          received.forgets.back().push_back(md5ToHex(md5));
        }
        esi_ring_release(&toWorker);
        continue;
      }
      if (esi_wire_u16(&root, ESI_WIRE_RESPONSE_WHICH_OFFSET) == ESI_WIRE_RESPONSE_FAIL_WHICH) {
        const char* reason;
        size_t n;
        ASSERT_EQ(esi_wire_get_text(&root, ESI_WIRE_RESPONSE_FAIL_PTR, &reason, &n), 0);
        received.failed.assign(reason, n);
        esi_ring_release(&toWorker);
        continue;
      }
      if (esi_wire_u16(&root, ESI_WIRE_RESPONSE_WHICH_OFFSET) == ESI_WIRE_RESPONSE_PLAN_WHICH) {
        drainPlan(&root);
        esi_ring_release(&toWorker);
        continue;
      }
      ASSERT_EQ(esi_wire_u16(&root, ESI_WIRE_RESPONSE_WHICH_OFFSET), ESI_WIRE_RESPONSE_SPLICE_WHICH);
      ASSERT_EQ(esi_wire_get_struct(&root, ESI_WIRE_RESPONSE_SPLICE_PTR, &splice), 0);
      received.released = esi_wire_u64(&splice, ESI_WIRE_SPLICE_RELEASED_OFFSET);
      received.last = esi_wire_bool(&splice, ESI_WIRE_SPLICE_LAST_BIT);
      ASSERT_EQ(esi_wire_get_list(&splice, ESI_WIRE_SPLICE_INSTRUCTIONS_PTR, &list), 0);
      for (uint32_t i = 0; i < list.count; ++i) {
        esi_wire_list_at(&list, i, &item);
        if (esi_wire_u16(&item, ESI_WIRE_INSTRUCTION_WHICH_OFFSET) == ESI_WIRE_INSTRUCTION_VERBATIM_WHICH) {
          const uint64_t off = esi_wire_u64(&item, ESI_WIRE_INSTRUCTION_VERBATIM_OFFSET_OFFSET);
          const uint32_t n = esi_wire_u32(&item, ESI_WIRE_INSTRUCTION_VERBATIM_LENGTH_OFFSET);
          ASSERT_LE(off + n, sent_.size());
          received.assembled += sent_.substr(off, n);
        } else if (esi_wire_u16(&item, ESI_WIRE_INSTRUCTION_WHICH_OFFSET) ==
                   ESI_WIRE_INSTRUCTION_LITERAL_WHICH) {
          const uint8_t* bytes;
          size_t n;
          ASSERT_EQ(esi_wire_get_data(&item, ESI_WIRE_INSTRUCTION_LITERAL_PTR, &bytes, &n), 0);
          received.assembled += std::string(reinterpret_cast<const char*>(bytes), n);
        } else if (esi_wire_u16(&item, ESI_WIRE_INSTRUCTION_WHICH_OFFSET) >=
                   ESI_WIRE_INSTRUCTION_TRY_START_WHICH) {
          received.assembled += "{}|"[esi_wire_u16(&item, ESI_WIRE_INSTRUCTION_WHICH_OFFSET) -
                                      ESI_WIRE_INSTRUCTION_TRY_START_WHICH == 0   ? 0
                                  : esi_wire_u16(&item, ESI_WIRE_INSTRUCTION_WHICH_OFFSET) ==
                                          ESI_WIRE_INSTRUCTION_TRY_EXCEPT_WHICH ? 2
                                                                               : 1];
        } else {
          ASSERT_EQ(esi_wire_get_struct(&item, ESI_WIRE_INSTRUCTION_INCLUDE_PTR, &include), 0);
          const char *path, *args;
          size_t plen, alen;
          ASSERT_EQ(esi_wire_get_text(&include, ESI_WIRE_INCLUDE_PATH_PTR, &path, &plen), 0);
          ASSERT_EQ(esi_wire_get_text(&include, ESI_WIRE_INCLUDE_ARGS_PTR, &args, &alen), 0);
          received.assembled += "[" + std::string(path, plen) + "?" + std::string(args, alen) + "]";
        }
      }
      esi_ring_release(&toWorker);
    }
  }

  void drainPlan(esi_wire_struct_t* root) {
    esi_wire_struct_t plan, step, include;
    esi_wire_list_t steps;
    ASSERT_EQ(esi_wire_get_struct(root, ESI_WIRE_RESPONSE_PLAN_PTR, &plan), 0);
    ASSERT_EQ(esi_wire_get_list(&plan, ESI_WIRE_PLAN_STEPS_PTR, &steps), 0);
    received.planLength = esi_wire_u64(&plan, ESI_WIRE_PLAN_LENGTH_OFFSET);
    received.pin = esi_wire_u32(&plan, ESI_WIRE_PLAN_PIN_OFFSET);
    received.reusable = esi_wire_bool(&plan, ESI_WIRE_PLAN_REUSABLE_BIT);
    for (uint32_t i = 0; i < steps.count; ++i) {
      esi_wire_list_at(&steps, i, &step);
      if (!received.plan.empty()) received.plan += ' ';
      switch (esi_wire_u16(&step, ESI_WIRE_PLAN_STEP_WHICH_OFFSET)) {
        case ESI_WIRE_PLAN_STEP_VERBATIM_WHICH: {
          ReceivedSegment s;
          s.runOffset = esi_wire_u64(&step, ESI_WIRE_PLAN_STEP_VERBATIM_OFFSET_OFFSET);
          s.runLength = esi_wire_u64(&step, ESI_WIRE_PLAN_STEP_VERBATIM_LENGTH_OFFSET);
          received.plan += "V" + std::to_string(s.runOffset) + "+" + std::to_string(s.runLength);
          esi_wire_struct_t segment;
          const uint8_t* head;
          size_t n;
          ASSERT_EQ(esi_wire_get_struct(&step, ESI_WIRE_PLAN_STEP_VERBATIM_SEGMENT_PTR, &segment), 0);
          ASSERT_EQ(esi_wire_get_data(&segment, ESI_WIRE_SEGMENT_HEAD_PTR, &head, &n), 0);
          s.offset = esi_wire_u64(&segment, ESI_WIRE_SEGMENT_OFFSET_OFFSET);
          s.length = esi_wire_u32(&segment, ESI_WIRE_SEGMENT_LENGTH_OFFSET);
          s.crc = esi_wire_u32(&segment, ESI_WIRE_SEGMENT_CRC_OFFSET);
          s.head.assign(reinterpret_cast<const char*>(head), n);
          if (s.length != 0) {
            received.plan += "S";
            received.segments.push_back(std::move(s));
          }
          break;
        }
        case ESI_WIRE_PLAN_STEP_CHECK_WHICH: {
          const uint8_t* bytes;
          size_t n;
          ASSERT_EQ(esi_wire_get_data(&step, ESI_WIRE_PLAN_STEP_CHECK_BYTES_PTR, &bytes, &n), 0);
          received.plan += "C" +
              std::to_string(esi_wire_u64(&step, ESI_WIRE_PLAN_STEP_CHECK_OFFSET_OFFSET)) + ":" +
              std::string(reinterpret_cast<const char*>(bytes), n);
          break;
        }
        case ESI_WIRE_PLAN_STEP_LITERAL_WHICH: {
          const uint8_t* bytes;
          size_t n;
          ASSERT_EQ(esi_wire_get_data(&step, ESI_WIRE_PLAN_STEP_LITERAL_PTR, &bytes, &n), 0);
          received.plan += "L" + std::string(reinterpret_cast<const char*>(bytes), n);
          break;
        }
        case ESI_WIRE_PLAN_STEP_TRY_START_WHICH: received.plan += "T+"; break;
        case ESI_WIRE_PLAN_STEP_TRY_EXCEPT_WHICH: received.plan += "T!"; break;
        case ESI_WIRE_PLAN_STEP_TRY_END_WHICH: received.plan += "T."; break;
        default: {
          const char* path;
          size_t n;
          ASSERT_EQ(esi_wire_get_struct(&step, ESI_WIRE_PLAN_STEP_INCLUDE_PTR, &include), 0);
          ASSERT_EQ(esi_wire_get_text(&include, ESI_WIRE_INCLUDE_PATH_PTR, &path, &n), 0);
          received.plan += "I" + std::string(path, n);
        }
      }
    }
  }

  ssize_t welcomeBytes = -1;
  UniqueFd fds[4];  // rings, worker and daemon eventfds, arena
  int seals = 0;
  int arenaSeals = 0;
  uint64_t arenaSize = 0;
  void* arena = nullptr;  // read-only
  uint32_t* pins = nullptr;
  size_t mapSize = 0;
  void* map = nullptr;
  esi_ring_t toDaemon{};
  esi_ring_t toWorker{};
  Received received;

 private:
  template <typename Fill>
  void send(uint32_t stream, uint16_t which, Fill fill) {
    // Room for the body so far and for request variables up to 72 KiB.
    std::vector<uint64_t> buf(64 + sent_.size() / 8 + 9 * 1024);
    esi_wire_builder_t b;
    esi_wire_builder_init(&b, buf.data(), buf.size() * 8);
    esi_wire_out_t req;
    esi_wire_root(&b, ESI_WIRE_REQUEST_DATA_WORDS, ESI_WIRE_REQUEST_POINTERS, &req);
    esi_wire_set_u32(&req, ESI_WIRE_REQUEST_STREAM_OFFSET, stream);
    esi_wire_set_u16(&req, ESI_WIRE_REQUEST_WHICH_OFFSET, which);
    fill(&req);
    const size_t len = esi_wire_finish(&b);
    ASSERT_GT(len, 0u);
    raw(buf.data(), static_cast<uint32_t>(len));
  }

  void wakeDaemon() {
    const uint64_t one = 1;
    ASSERT_EQ(write(fds[2].get(), &one, sizeof(one)), 8);
  }

  std::string sent_;
};

inline const std::string kObject(48, 'o');

class WorkerSessionTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_EQ(uv_loop_init(&loop_), 0);
    ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sockets_), 0);
    session_ = std::make_shared<WorkerSession>(
        &loop_, sockets_[0], 256 * 1024, stats_, purger_, orders_, plans_, arena_,
        [this](std::string_view reason) { fatal_ = std::string(reason); },
        [this](const std::vector<Md5>& files) {
          purgedCalls_.push_back(files);
          session_->sendForget(files);  // as the server does, for each session
        });
    ASSERT_TRUE(session_->start());
    worker_ = std::make_unique<TestWorker>(sockets_[1]);
  }

  void TearDown() override {
    worker_.reset();
    session_.reset();
    uv_run(&loop_, UV_RUN_NOWAIT);
    EXPECT_EQ(uv_loop_close(&loop_), 0);
    close(sockets_[0]);
    close(sockets_[1]);
  }

  // Runs the loop (scans finish on the thread pool) until a purge answer
  // has arrived; bounded, so a missing answer fails instead of hanging.
  void awaitPurged() {
    runUntil([this] {
      worker_->drain();
      return worker_->received.purgeDone;
    });
  }

  // Runs the loop until done() holds, or a hang guard's 10 s have passed.
  void runUntil(const std::function<bool()>& done) {
    uv_timer_t guard;  // a hang guard, not a synchronisation
    uv_timer_init(&loop_, &guard);
    bool expired = false;
    guard.data = &expired;
    uv_timer_start(&guard, [](uv_timer_t* t) { *static_cast<bool*>(t->data) = true; }, 10000, 0);
    while (!done() && !expired) uv_run(&loop_, UV_RUN_ONCE);
    uv_close(reinterpret_cast<uv_handle_t*>(&guard), nullptr);
    uv_run(&loop_, UV_RUN_NOWAIT);
  }

  // A first hit of kObject (stream 1) sends the page, whose plan esid
  // records with segments at stitchLevel (0: none).
  void recordPlanOf(const std::string& page, uint8_t stitchLevel, const std::string& cookies = "") {
    worker_->openCached(1, kObject, 0, false, cookies, stitchLevel);
    worker_->body(1, page);
    worker_->end(1);
    serve();
  }

  // Lets esid handle what the worker wrote: the loop runs until the
  // eventfd wake-up has been served.
  void serve() {
    for (int i = 0; i < 100 && uv_run(&loop_, UV_RUN_NOWAIT) != 0; ++i) {
      if (esi_ring_wait_data(&worker_->toWorker) == 0) break;
    }
    worker_->drain();
  }

  uv_loop_t loop_;
  int sockets_[2];
  Stats stats_;
  Purger purger_{&loop_};
  PurgeOrders orders_;
  SegmentArena arena_{SegmentArena::kMinBytes};  // before the plans it holds
  PlanStore plans_;
  std::optional<std::string> fatal_;
  std::vector<std::vector<Md5>> purgedCalls_;
  std::shared_ptr<WorkerSession> session_;
  std::unique_ptr<TestWorker> worker_;
};

// --- Stitching: segments in plans ---------------------------------------------

inline std::string prose(size_t bytes, char tag = 'p') {
  std::string out;
  while (out.size() < bytes) out += std::string("Text of the page, paragraph ") + tag + ". ";
  out.resize(bytes);
  return out;
}

// Runs of 300, 100 and 200 bytes: the first and the last get segments.
inline const std::string kStitchedPage = prose(300, 'a') + "<esi:include src=\"/x\"/>" +
                                  prose(100, 'b') + "<esi:include src=\"/y\"/>" +
                                  prose(200, 'c');

// A segment's bytes, raw-inflated: they end with a full flush, not a final
// block, so inflate stops with Z_OK and no input left.
inline std::string inflateSegment(std::string_view deflated) {
  z_stream z{};
  if (inflateInit2(&z, -15) != Z_OK) return "inflateInit2 failed";
  z.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(deflated.data()));
  z.avail_in = static_cast<uInt>(deflated.size());
  std::string out(1 << 16, '\0');
  z.next_out = reinterpret_cast<Bytef*>(out.data());
  z.avail_out = static_cast<uInt>(out.size());
  const int rc = inflate(&z, Z_SYNC_FLUSH);
  out.resize(out.size() - z.avail_out);
  if (rc != Z_OK || z.avail_in != 0) out = "inflate failed";
  inflateEnd(&z);
  return out;
}

}  // namespace esi::session_test
