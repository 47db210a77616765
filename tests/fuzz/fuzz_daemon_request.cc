// esid's request decoding, end to end: one record of any bytes written into
// a real WorkerSession's request ring, behind a valid Open of stream 1, and
// served by its libuv loop (daemon/transport/worker_session.cc).  Whatever
// the record, esid either answers or ends the session through its fatal
// handler; it never crashes, leaks or hangs, and every answer it writes is
// a message the connector's C reader accepts: a splice for a stream that
// was opened, whose verbatim ranges lie within the bytes the stream was
// sent, or the Purged answer to the record's Purge.  After an answered
// record, Cancel of every stream must be accepted.
//
// Input: the record's payload.  Its length is rounded down to whole words:
// esid refuses any other length before decoding anything, which one unit
// test covers (GarbageRecordEndsTheSession); fuzzing it would only waste
// runs.
//
// One session serves input after input, as esid's would, and is made anew
// only after a violation ended it: 5,600 inputs a second against 2,200 with
// a session per input (ESI_FUZZ_FRESH_SESSION=1) on the CI machine.  Every
// input leaves the session as it found it (the Cancels), so an input
// replays the same on its own.
//
// Zones: a Stored or Purge record is fed to a fresh Purger that knows one
// zone, "fuzz", an empty scratch directory, already scanned; the harness
// waits for any scan the record starts, then drops that Purger, so that no
// input sees another's zones.  A Zone record naming a path that exists is
// not fed at all: esid would scan the machine's real file system.

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <capnp/serialize.h>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "esi.capnp.h"
#include "esi/ring.h"
#include "esi_wire.h"
#include "fuzz_check.h"
#include "transport/fd_passing.h"
#include "transport/worker_session.h"
#include "variants/purger.h"

namespace esi {
namespace {

// esid's smallest --ring-size.
constexpr uint32_t kRingSize = 256 * 1024;
constexpr uint32_t kPageStream = 1;
constexpr int kMaxServeRounds = 1000;

// What the harness itself makes of the record, the way handleRequest does.
struct Decoded {
  wire::Request::Which which;
  uint32_t stream;
  size_t bodyBytes = 0;
  std::string zonePath;
};

std::optional<Decoded> decode(const uint8_t* payload, size_t length) {
  try {
    kj::ArrayPtr<const capnp::word> words(
        reinterpret_cast<const capnp::word*>(payload),
        length / sizeof(capnp::word));
    capnp::ReaderOptions options;
    options.traversalLimitInWords = words.size() * 2 + 64;
    options.nestingLimit = 8;
    capnp::FlatArrayMessageReader reader(words, options);
    auto request = reader.getRoot<wire::Request>();
    Decoded decoded{request.which(), request.getStream(), 0, {}};
    if (decoded.which == wire::Request::BODY) {
      decoded.bodyBytes = request.getBody().size();
    } else if (decoded.which == wire::Request::ZONE) {
      decoded.zonePath = request.getZone().getPath();
    }
    return decoded;
  } catch (const kj::Exception&) {
    return std::nullopt;
  }
}

// A WorkerSession over a socketpair, and the worker's end of its rings, as
// daemon/transport/worker_session_test_worker.h's TestWorker holds them.
class Connection {
 public:
  Connection(uv_loop_t* loop, Stats& stats, Purger& purger) : loop_(loop) {
    FUZZ_CHECK(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sockets_) ==
               0);
    // Shared, as esid's server holds it: a late Purged answer finds the
    // session through a weak pointer.
    session_ = std::make_shared<WorkerSession>(
        loop, sockets_[0], kRingSize, stats, purger, orders_, plans_, arena_,
        [this](std::string_view) { fatal_ = true; },
        [](const std::vector<Md5>&) {});
    FUZZ_CHECK(session_->start());
    receiveWelcome();
  }

  ~Connection() {
    session_.reset();
    uv_run(loop_, UV_RUN_NOWAIT);  // lets the poll handle close
    if (map_ != nullptr) munmap(map_, mapSize_);
    close(sockets_[0]);
    close(sockets_[1]);
  }

  bool fatal() const { return fatal_; }

  // Stream bytes each stream was sent, as the worker counts them.
  std::vector<std::pair<uint32_t, uint64_t>> sent;
  // The id of the record's Purge, which alone may be answered by Purged,
  // and whether it was.
  std::optional<uint32_t> purge;
  bool purged = false;

  void record(const void* payload, uint32_t length) {
    void* slot;
    for (int round = 0; (slot = esi_ring_reserve(&toDaemon_, length)) == nullptr;
         ++round) {
      FUZZ_CHECK(round < kMaxServeRounds && !fatal_);
      serve();
    }
    if (length > 0) std::memcpy(slot, payload, length);
    if (esi_ring_commit(&toDaemon_, length)) wake(fds_[2].get());
  }

  void cancel(uint32_t stream) { request(stream, ESI_WIRE_REQUEST_CANCEL_WHICH); }

  void open(uint32_t stream) {
    request(stream, ESI_WIRE_REQUEST_OPEN_WHICH, [](esi_wire_out_t* req) {
      esi_wire_out_t open;
      FUZZ_CHECK(esi_wire_set_struct(req, ESI_WIRE_REQUEST_OPEN_PTR,
                                     ESI_WIRE_OPEN_DATA_WORDS,
                                     ESI_WIRE_OPEN_POINTERS, &open) == 0);
      FUZZ_CHECK(esi_wire_set_text(&open, ESI_WIRE_OPEN_URI_PTR,
                                   "/shop/index.html", 16) == 0);
      FUZZ_CHECK(esi_wire_set_text(&open, ESI_WIRE_OPEN_AUTHORITY_PTR,
                                   "example.com", 11) == 0);
    });
  }

  // Runs esid's loop until it has taken every record, reading its answers
  // as the worker would.
  void serve() {
    for (int round = 0; round < kMaxServeRounds; ++round) {
      uv_run(loop_, UV_RUN_NOWAIT);
      const bool answered = drainAnswers();
      if (fatal_) return;
      // Answers esid queued in memory go out on its next round.
      const uint32_t head =
          __atomic_load_n(&toDaemon_.ctl->head, __ATOMIC_ACQUIRE);
      if (head == toDaemon_.tail && !answered) return;
    }
    FUZZ_CHECK(!"esid stopped serving a ring with records in it");
  }

 private:
  template <typename Fill = void (*)(esi_wire_out_t*)>
  void request(uint32_t stream, uint16_t which,
               Fill fill = [](esi_wire_out_t*) {}) {
    // An Open and its two texts, with room for what the schema adds (proto
    // 3's Open no longer fitted in 16 words).
    uint64_t buf[64];
    esi_wire_builder_t b;
    esi_wire_out_t req;
    esi_wire_builder_init(&b, buf, sizeof(buf));
    FUZZ_CHECK(esi_wire_root(&b, ESI_WIRE_REQUEST_DATA_WORDS,
                             ESI_WIRE_REQUEST_POINTERS, &req) == 0);
    esi_wire_set_u32(&req, ESI_WIRE_REQUEST_STREAM_OFFSET, stream);
    esi_wire_set_u16(&req, ESI_WIRE_REQUEST_WHICH_OFFSET, which);
    fill(&req);
    const size_t length = esi_wire_finish(&b);
    FUZZ_CHECK(length > 0);
    record(buf, static_cast<uint32_t>(length));
  }

  void receiveWelcome() {
    std::byte buf[256];
    std::optional<MessageWithFds> welcome =
        receiveWithFds(sockets_[1], buf, std::size(fds_));
    FUZZ_CHECK(welcome && welcome->size > 0 &&
               welcome->fds.size() == std::size(fds_));
    std::move(welcome->fds.begin(), welcome->fds.end(), fds_);
    mapSize_ = esi_shm_size(kRingSize);
    map_ = mmap(nullptr, mapSize_, PROT_READ | PROT_WRITE, MAP_SHARED,
                fds_[0].get(), 0);
    FUZZ_CHECK(map_ != MAP_FAILED);
    auto* header = static_cast<esi_shm_header_t*>(map_);
    auto* base = static_cast<uint8_t*>(map_) + ESI_SHM_HEADER_SIZE;
    esi_ring_attach(&toDaemon_, &header->to_daemon, base, kRingSize);
    esi_ring_attach(&toWorker_, &header->to_worker, base + kRingSize,
                    kRingSize);
  }

  uint64_t* sentTo(uint32_t stream) {
    for (auto& [id, bytes] : sent) {
      if (id == stream) return &bytes;
    }
    return nullptr;
  }

  // Every answer must be a splice the connector accepts
  // (ngx_http_esi_splice): for a stream it sent, released and verbatim
  // ranges within what it sent, ascending.  True when there was any.
  bool drainAnswers() {
    bool any = false;
    const uint8_t* payload;
    uint32_t length;
    esi_ring_rc_e rc;
    while ((rc = esi_ring_peek(&toWorker_, &payload, &length)) ==
           ESI_RING_OK) {
      esi_wire_msg_t msg;
      esi_wire_struct_t root, splice, instruction, include;
      esi_wire_list_t list;
      FUZZ_CHECK(esi_wire_open(&msg, payload, length, &root) == 0);
      const uint32_t stream =
          esi_wire_u32(&root, ESI_WIRE_RESPONSE_STREAM_OFFSET);
      const uint16_t which =
          esi_wire_u16(&root, ESI_WIRE_RESPONSE_WHICH_OFFSET);
      if (which == ESI_WIRE_RESPONSE_PURGED_WHICH) {
        FUZZ_CHECK(purge && stream == *purge);
        checkPurged(root);
        purged = true;
        if (esi_ring_release(&toWorker_)) wake(fds_[2].get());
        any = true;
        continue;
      }
      FUZZ_CHECK(which == ESI_WIRE_RESPONSE_SPLICE_WHICH);
      const uint64_t* sentBytes = sentTo(stream);
      FUZZ_CHECK(sentBytes != nullptr);
      FUZZ_CHECK(esi_wire_get_struct(&root, ESI_WIRE_RESPONSE_SPLICE_PTR,
                                     &splice) == 0);
      FUZZ_CHECK(esi_wire_get_list(&splice, ESI_WIRE_SPLICE_INSTRUCTIONS_PTR,
                                   &list) == 0);
      const uint64_t released =
          esi_wire_u64(&splice, ESI_WIRE_SPLICE_RELEASED_OFFSET);
      FUZZ_CHECK(released <= *sentBytes);
      uint64_t end = 0;
      for (uint32_t i = 0; i < list.count; ++i) {
        esi_wire_list_at(&list, i, &instruction);
        const uint16_t kind =
            esi_wire_u16(&instruction, ESI_WIRE_INSTRUCTION_WHICH_OFFSET);
        if (kind == ESI_WIRE_INSTRUCTION_VERBATIM_WHICH) {
          const uint64_t offset = esi_wire_u64(
              &instruction, ESI_WIRE_INSTRUCTION_VERBATIM_OFFSET_OFFSET);
          const uint32_t n = esi_wire_u32(
              &instruction, ESI_WIRE_INSTRUCTION_VERBATIM_LENGTH_OFFSET);
          FUZZ_CHECK(offset >= end && offset <= *sentBytes &&
                     n <= *sentBytes - offset);
          end = offset + n;
        } else if (kind == ESI_WIRE_INSTRUCTION_INCLUDE_WHICH) {
          const char* path;
          size_t pathLength;
          FUZZ_CHECK(esi_wire_get_struct(&instruction,
                                         ESI_WIRE_INSTRUCTION_INCLUDE_PTR,
                                         &include) == 0);
          FUZZ_CHECK(esi_wire_get_text(&include, ESI_WIRE_INCLUDE_PATH_PTR,
                                       &path, &pathLength) == 0);
          FUZZ_CHECK(pathLength == 0 || path[0] == '/');
        } else if (kind == ESI_WIRE_INSTRUCTION_LITERAL_WHICH) {
          // proto/README.md: a literal is never empty.
          const uint8_t* bytes;
          size_t n;
          FUZZ_CHECK(esi_wire_get_data(&instruction,
                                       ESI_WIRE_INSTRUCTION_LITERAL_PTR,
                                       &bytes, &n) == 0 && n > 0);
        } else {
          FUZZ_CHECK(kind == ESI_WIRE_INSTRUCTION_TRY_START_WHICH ||
                     kind == ESI_WIRE_INSTRUCTION_TRY_EXCEPT_WHICH ||
                     kind == ESI_WIRE_INSTRUCTION_TRY_END_WHICH);
        }
      }
      if (esi_ring_release(&toWorker_)) wake(fds_[2].get());
      any = true;
    }
    FUZZ_CHECK(rc == ESI_RING_EMPTY);
    return any;
  }

  // Purged (ngx_http_esi_purge.c): 16 bytes a file, a Text error.
  static void checkPurged(const esi_wire_struct_t& root) {
    esi_wire_struct_t purged;
    const uint8_t* files;
    size_t filesLength;
    const char* error;
    size_t errorLength;
    FUZZ_CHECK(esi_wire_get_struct(&root, ESI_WIRE_RESPONSE_PURGED_PTR,
                                   &purged) == 0);
    FUZZ_CHECK(esi_wire_get_data(&purged, ESI_WIRE_PURGED_FILES_PTR, &files,
                                 &filesLength) == 0);
    FUZZ_CHECK(filesLength % 16 == 0);
    FUZZ_CHECK(esi_wire_get_text(&purged, ESI_WIRE_PURGED_ERROR_PTR, &error,
                                 &errorLength) == 0);
  }

  static void wake(int eventFd) {
    const uint64_t one = 1;
    FUZZ_CHECK(write(eventFd, &one, sizeof(one)) == sizeof(one));
  }

  uv_loop_t* const loop_;
  int sockets_[2] = {-1, -1};
  PurgeOrders orders_;  // before the session, which withdraws from it
  SegmentArena arena_{SegmentArena::kMinBytes};  // before the plans it holds
  PlanStore plans_;
  std::shared_ptr<WorkerSession> session_;
  bool fatal_ = false;
  // memfd, worker eventfd, daemon eventfd, segment arena
  UniqueFd fds_[4];
  void* map_ = nullptr;
  size_t mapSize_ = 0;
  esi_ring_t toDaemon_{};
  esi_ring_t toWorker_{};
};

// Whether a Purger still scans a zone or matches a pattern on the thread
// pool: a purge waiting for either is answered when it ends.
bool busy(const Purger& purger) {
  const nlohmann::json zones = purger.zones();
  for (const auto& zone : zones) {
    if (zone.value("scanning", false) || zone.value("matching", false)) return true;
  }
  return false;
}

uv_loop_t loop;
Stats stats;
std::string scratchZone;  // an empty directory
std::unique_ptr<Purger> purger;
std::unique_ptr<Connection> connection;

// Drops the session and the Purger once the loop has run what they left.
void tearDown() {
  connection.reset();
  if (purger != nullptr) {
    purger->close();
    uv_run(&loop, UV_RUN_DEFAULT);  // until every scan's callback ran
    purger.reset();
  }
}

void removeScratchZone() { rmdir(scratchZone.c_str()); }

}  // namespace
}  // namespace esi

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  using namespace esi;
  // esid logs every violation and refused include, and a fuzzer makes
  // millions; ESI_FUZZ_VERBOSE=1 keeps the log, to see what one input does.
  if (std::getenv("ESI_FUZZ_VERBOSE") == nullptr) {
    spdlog::set_level(spdlog::level::off);
  }
  FUZZ_CHECK(uv_loop_init(&loop) == 0);
  char dir[] = "/tmp/esi-fuzz-zone.XXXXXX";
  FUZZ_CHECK(mkdtemp(dir) != nullptr);
  scratchZone = dir;
  std::atexit(removeScratchZone);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace esi;
  const uint32_t length =
      static_cast<uint32_t>(std::min<size_t>(size, kRingSize / 2 - 8) & ~7u);
  // The ring hands esid 8-byte aligned payloads, and so does this copy.
  std::vector<capnp::word> payload(length / sizeof(capnp::word));
  if (length > 0) std::memcpy(payload.data(), data, length);
  const auto* bytes = reinterpret_cast<const uint8_t*>(payload.data());
  const std::optional<Decoded> decoded = decode(bytes, length);

  struct stat st;
  if (decoded && decoded->which == wire::Request::ZONE &&
      stat(decoded->zonePath.c_str(), &st) == 0) {
    return 0;  // esid would scan what is there
  }
  const bool zones =
      decoded && (decoded->which == wire::Request::ZONE ||
                  decoded->which == wire::Request::STORED ||
                  decoded->which == wire::Request::PURGE);

  static const bool freshSession =
      std::getenv("ESI_FUZZ_FRESH_SESSION") != nullptr;
  if (freshSession || zones) tearDown();
  if (purger == nullptr) purger = std::make_unique<Purger>(&loop);
  if (zones) {
    purger->announce("fuzz", scratchZone, 1 << 20, false);
    while (busy(*purger)) uv_run(&loop, UV_RUN_ONCE);
  }
  if (connection == nullptr) {
    connection = std::make_unique<Connection>(&loop, stats, *purger);
  }
  Connection& c = *connection;
  c.sent = {{kPageStream, 0}};
  c.purge.reset();
  c.purged = false;
  c.open(kPageStream);

  if (decoded) {
    if (decoded->which == wire::Request::OPEN &&
        decoded->stream != kPageStream) {
      c.sent.emplace_back(decoded->stream, 0);
    } else if (decoded->which == wire::Request::BODY &&
               decoded->stream == kPageStream) {
      c.sent[0].second = decoded->bodyBytes;
    } else if (decoded->which == wire::Request::PURGE) {
      c.purge = decoded->stream;
    }
  }
  c.record(bytes, length);
  c.serve();
  // A purge waits for the scan or the match its record started, if any.
  while (!c.fatal() && busy(*purger)) {
    uv_run(&loop, UV_RUN_ONCE);
    c.serve();
  }

  if (c.fatal()) {
    connection.reset();  // esid closes a connection after a violation
  } else {
    FUZZ_CHECK(!c.purge || c.purged);  // every purge is answered
    // The record was answered: cancelling what is open must be too.
    for (const auto& [id, bytes] : c.sent) c.cancel(id);
    c.serve();
    FUZZ_CHECK(!c.fatal());
    FUZZ_CHECK(stats.activeStreams == 0);
  }
  if (zones) tearDown();
  return 0;
}
