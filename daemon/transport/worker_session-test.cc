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
#include <vector>

#include <gtest/gtest.h>

#include "esi_wire.h"

namespace esi {
namespace {

struct Received {
  uint64_t released = 0;
  bool last = false;
  std::string assembled;  // verbatim bytes and [include path?args] markers
  std::vector<std::string> purgedFiles;  // hex names
  bool purgeDone = false;
  bool purgeScanned = false;
  std::string plan;  // "V0+3 C3:<esi I[/x?] ..." as the steps came; "" none
  std::string failed;  // the reason of a Response.fail
  uint64_t planLength = 0;
};

class TestWorker {
 public:
  explicit TestWorker(int socketFd) {
    char buf[256];
    alignas(cmsghdr) char control[CMSG_SPACE(3 * sizeof(int))];
    iovec iov{buf, sizeof(buf)};
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control;
    msg.msg_controllen = sizeof(control);
    welcomeBytes = recvmsg(socketFd, &msg, 0);
    cmsghdr* cmsg = CMSG_FIRSTHDR(&msg);
    if (cmsg == nullptr || cmsg->cmsg_type != SCM_RIGHTS) return;
    std::memcpy(fds, CMSG_DATA(cmsg), sizeof(fds));
    seals = fcntl(fds[0], F_GET_SEALS);
    struct stat st;
    fstat(fds[0], &st);
    mapSize = static_cast<size_t>(st.st_size);
    map = mmap(nullptr, mapSize, PROT_READ | PROT_WRITE, MAP_SHARED, fds[0], 0);
    auto* header = static_cast<esi_shm_header_t*>(map);
    auto* base = static_cast<uint8_t*>(map) + ESI_SHM_HEADER_SIZE;
    esi_ring_attach(&toDaemon, &header->to_daemon, base, header->ring_size);
    esi_ring_attach(&toWorker, &header->to_worker, base + header->ring_size,
                    header->ring_size);
  }
  TestWorker(const TestWorker&) = delete;
  TestWorker& operator=(const TestWorker&) = delete;

  ~TestWorker() {
    if (map != nullptr) munmap(map, mapSize);
    for (int fd : fds) if (fd >= 0) close(fd);
  }

  void open(uint32_t stream, const std::string& uri, const std::string& authority,
            const std::string& cookies = "") {
    send(stream, ESI_WIRE_REQUEST_OPEN_WHICH, [&](esi_wire_out_t* req) {
      esi_wire_out_t o;
      esi_wire_set_struct(req, ESI_WIRE_REQUEST_OPEN_PTR, ESI_WIRE_OPEN_DATA_WORDS,
                          ESI_WIRE_OPEN_POINTERS, &o);
      esi_wire_set_text(&o, ESI_WIRE_OPEN_URI_PTR, uri.data(), uri.size());
      esi_wire_set_text(&o, ESI_WIRE_OPEN_AUTHORITY_PTR, authority.data(), authority.size());
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
  void openCached(uint32_t stream, const std::string& object, uint64_t base = 0,
                  bool planFailed = false, const std::string& cookies = "") {
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
      esi_wire_set_bool(&o, ESI_WIRE_OPEN_PLAN_FAILED_BIT, planFailed);
      setCookies(&o, cookies);
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

  void purgeKey(uint32_t id, const std::string& zone, const std::string& key) {
    received.purgedFiles.clear();
    received.purgeDone = false;
    send(id, ESI_WIRE_REQUEST_PURGE_WHICH, [&](esi_wire_out_t* req) {
      esi_wire_out_t p;
      esi_wire_set_struct(req, ESI_WIRE_REQUEST_PURGE_PTR, ESI_WIRE_PURGE_DATA_WORDS,
                          ESI_WIRE_PURGE_POINTERS, &p);
      esi_wire_set_text(&p, ESI_WIRE_PURGE_ZONE_PTR, zone.data(), zone.size());
      esi_wire_set_u16(&p, ESI_WIRE_PURGE_WHICH_OFFSET, ESI_WIRE_PURGE_KEY_WHICH);
      esi_wire_set_text(&p, ESI_WIRE_PURGE_KEY_PTR, key.data(), key.size());
    });
  }

  void end(uint32_t stream) {
    send(stream, ESI_WIRE_REQUEST_END_WHICH, [](esi_wire_out_t*) {});
  }

  void raw(const void* payload, uint32_t len) {
    void* slot = esi_ring_reserve(&toDaemon, len);
    ASSERT_NE(slot, nullptr);
    std::memcpy(slot, payload, len);
    if (esi_ring_commit(&toDaemon, len)) wakeDaemon();
  }

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
    for (uint32_t i = 0; i < steps.count; ++i) {
      esi_wire_list_at(&steps, i, &step);
      if (!received.plan.empty()) received.plan += ' ';
      switch (esi_wire_u16(&step, ESI_WIRE_PLAN_STEP_WHICH_OFFSET)) {
        case ESI_WIRE_PLAN_STEP_VERBATIM_WHICH:
          received.plan +=
              "V" + std::to_string(esi_wire_u64(&step, ESI_WIRE_PLAN_STEP_VERBATIM_OFFSET_OFFSET)) +
              "+" + std::to_string(esi_wire_u64(&step, ESI_WIRE_PLAN_STEP_VERBATIM_LENGTH_OFFSET));
          break;
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
  int fds[3] = {-1, -1, -1};
  int seals = 0;
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
    ASSERT_EQ(write(fds[2], &one, sizeof(one)), 8);
  }

  std::string sent_;
};

class WorkerSessionTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_EQ(uv_loop_init(&loop_), 0);
    ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sockets_), 0);
    session_ = std::make_shared<WorkerSession>(
        &loop_, sockets_[0], 256 * 1024, stats_, purger_, orders_, plans_,
        [this](std::string_view reason) { fatal_ = std::string(reason); });
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
  PlanStore plans_;
  std::optional<std::string> fatal_;
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

const std::string kObject(40, 'o');

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
