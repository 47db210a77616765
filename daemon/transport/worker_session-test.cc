// esid's side of a worker connection, driven by a worker written with the
// connector's own C ring and codec over a real socketpair and memfd.

#include "transport/worker_session.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/types.h>

#include <cstring>
#include <algorithm>
#include <cstdio>
#include <cstdlib>
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

namespace esi {
namespace {

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

const std::string kObject(48, 'o');

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
    uv_timer_t guard;  // a hang guard, not a synchronisation
    uv_timer_init(&loop_, &guard);
    bool expired = false;
    guard.data = &expired;
    uv_timer_start(&guard, [](uv_timer_t* t) { *static_cast<bool*>(t->data) = true; }, 10000, 0);
    while (!worker_->received.purgeDone && !expired) {
      uv_run(&loop_, UV_RUN_ONCE);
      worker_->drain();
    }
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

TEST_F(WorkerSessionTest, WelcomeCarriesSealedRingsOfTheAnnouncedSize) {
  ASSERT_GT(worker_->welcomeBytes, 0);
  EXPECT_TRUE(worker_->seals & F_SEAL_SHRINK);
  EXPECT_TRUE(worker_->seals & F_SEAL_GROW);
  EXPECT_EQ(worker_->mapSize, esi_shm_size(256 * 1024));
  EXPECT_EQ(static_cast<esi_shm_header_t*>(worker_->map)->magic, ESI_SHM_MAGIC);
}

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

TEST_F(WorkerSessionTest, GarbageRecordEndsTheSession) {
  const uint64_t garbage[4] = {0x0000000500000000ull, ~0ull, ~0ull, ~0ull};
  worker_->raw(garbage, sizeof(garbage));
  serve();
  EXPECT_TRUE(fatal_);
}

TEST_F(WorkerSessionTest, StreamOpenedTwiceEndsTheSession) {
  worker_->open(4, "/", "h");
  worker_->open(4, "/", "h");
  serve();
  EXPECT_TRUE(fatal_);
}

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

TEST_F(WorkerSessionTest, VarsLiteralsAndTryMarkersTravelInSplices) {
  worker_->open(1, "/", "example.com", "id=<7>; other=x");
  worker_->body(1, "<esi:vars>[$(HTTP_COOKIE{id})]</esi:vars><esi:try><esi:attempt>a"
                   "</esi:attempt><esi:except>e</esi:except></esi:try>");
  worker_->end(1);
  serve();
  EXPECT_FALSE(fatal_);
  EXPECT_EQ(worker_->received.assembled, "[&lt;7&gt;]{a|e}");
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

TEST_F(WorkerSessionTest, ARequestVariableLongerThan64KiBEndsTheSession) {
  worker_->open(1, "/", "h", "a=" + std::string(64 * 1024, 'x'));
  serve();
  ASSERT_TRUE(fatal_);
  EXPECT_NE(fatal_->find("request variable"), std::string::npos);
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

// --- Stitching: segments in plans ---------------------------------------------

std::string prose(size_t bytes, char tag = 'p') {
  std::string out;
  while (out.size() < bytes) out += std::string("Text of the page, paragraph ") + tag + ". ";
  out.resize(bytes);
  return out;
}

// Runs of 300, 100 and 200 bytes: the first and the last get segments.
const std::string kStitchedPage = prose(300, 'a') + "<esi:include src=\"/x\"/>" +
                                  prose(100, 'b') + "<esi:include src=\"/y\"/>" +
                                  prose(200, 'c');

// A segment's bytes, raw-inflated: they end with a full flush, not a final
// block, so inflate stops with Z_OK and no input left.
std::string inflateSegment(std::string_view deflated) {
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

TEST_F(WorkerSessionTest, AReplayedReportWithoutAnObjectIdentityEndsTheSession) {
  worker_->replayed("short", "plans", false);
  serve();
  ASSERT_TRUE(fatal_);
  EXPECT_NE(fatal_->find("replayed"), std::string::npos);
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

TEST_F(WorkerSessionTest, AStitchLevelAbove9EndsTheSession) {
  worker_->openCached(1, kObject, 0, false, "", 10);
  serve();
  ASSERT_TRUE(fatal_);
  EXPECT_NE(fatal_->find("stitch level"), std::string::npos);
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

TEST_F(WorkerSessionTest, BusyRingYieldsTheLoopAfterATurn) {
  for (uint32_t id = 1; id <= 100; ++id) worker_->open(id, "/", "h");
  uv_run(&loop_, UV_RUN_NOWAIT);
  EXPECT_EQ(stats_.streams, 64u);  // one turn, then the loop goes round
  uv_run(&loop_, UV_RUN_NOWAIT);
  EXPECT_EQ(stats_.streams, 100u);
  EXPECT_FALSE(fatal_);
}

TEST_F(WorkerSessionTest, ZoneWithARelativeOrClimbingPathEndsTheSession) {
  worker_->zone("pages", "/var/cache/../../etc");
  serve();
  EXPECT_TRUE(fatal_);
}

}  // namespace
}  // namespace esi
