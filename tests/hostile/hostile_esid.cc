// hostile_esid: a test double for esid.  It speaks the real protocol (the
// Hello, a Welcome with SCM_RIGHTS, the sealed memfd and the rings, the
// segment arena (empty: no honest answer names a segment), Cap'n
// Proto records; proto/README.md) and then breaks it in one chosen way, so
// that the integration tests can check that an NGINX worker refuses each
// violation, applies esi_fallback and survives.
//
//   hostile_esid --socket PATH --mode MODE [--after N] [--ring-size BYTES]
//
//   verbatim             honest: every body is answered with a verbatim of
//                        itself, so pages come back as they went in
//   offset-out-of-range  a verbatim that starts beyond the bytes received
//   oversized-length     a verbatim whose length runs past them
//   unknown-stream       an answer for a stream id the worker never handed out
//   truncated-capnp      a record whose Cap'n Proto message is cut a word short
//   shrunken-memfd       a Welcome whose sealed memfd is half the rings' size
//   unsealed-memfd       a Welcome whose memfd is not sealed
//   writable-arena       a Welcome whose segment arena a worker could write
//   garbage-ring         a published ring index no ring can have
//   silent               a Welcome, then never a word: nothing is read
//   injecting-include    an include whose args hold CR LF and a header line
//   odd-forget           a Response.forget whose file names are 15 bytes, in
//                        place of an answer
//   try                  honest, each answer's verbatim inside a try whose
//                        attempt succeeds: the except part (a literal) is
//                        skipped, so pages come back as they went in
//   try-except-outside   a tryExcept with no tryStart before it
//   try-end-early        a tryStart and a tryEnd with no tryExcept between
//   last-inside-try      the last splice leaves a try open
//   giant-literal        a literal of a quarter of the ring before the verbatim
//   plan-unchecked-gap   honest, but a cache hit's open (an object) is answered
//                        by a plan whose run skips a byte no check covers
//   plan-segment-outside-arena
//                        ... by a plan whose run names a segment past the
//                        arena's end
//   plan-pin-out-of-range
//                        ... by a plan whose pin names no slot of the table
//   plan-try-unchecked   ... by a plan with a try after its run and no check
//                        before it, which the worker could not check ahead
//
// With --after N the first N answers of each connection are honest, so the
// violation comes in the middle of a stream.  Each violation is logged to
// stderr ("hostile: MODE on stream ID"), once per connection: the worker
// drops the connection and comes back, and gets the same again.

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <list>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include <capnp/message.h>
#include <capnp/serialize.h>

#include "esi.capnp.h"
#include "esi/ring.h"
#include "segments/segment_arena.h"
#include "transport/fd_passing.h"
#include "transport/shared_rings.h"
#include "base/unique_fd.h"

namespace {

using esi::SegmentArena;
using esi::SharedRings;
using esi::UniqueFd;

enum class Mode {
  kVerbatim,
  kOffsetOutOfRange,
  kOversizedLength,
  kUnknownStream,
  kTruncatedCapnp,
  kShrunkenMemfd,
  kUnsealedMemfd,
  kWritableArena,
  kGarbageRing,
  kSilent,
  kInjectingInclude,
  kOddForget,
  kTry,
  kTryExceptOutside,
  kTryEndEarly,
  kLastInsideTry,
  kGiantLiteral,
  kPlanUncheckedGap,
  kPlanSegmentOutsideArena,
  kPlanPinOutOfRange,
  kPlanTryUnchecked,
};

// What wraps the one verbatim of a splice.
enum class Shape {
  kPlain,
  kTry,              // tryStart, verbatim, tryExcept, literal, tryEnd
  kExceptOutside,    // tryExcept, verbatim
  kEndEarly,         // tryStart, verbatim, tryEnd
  kOpenTry,          // tryStart, verbatim
  kGiantLiteral,     // a literal of a quarter of the ring, verbatim
};

struct ModeName {
  std::string_view name;
  Mode mode;
};

constexpr ModeName kModes[] = {
    {"verbatim", Mode::kVerbatim},
    {"offset-out-of-range", Mode::kOffsetOutOfRange},
    {"oversized-length", Mode::kOversizedLength},
    {"unknown-stream", Mode::kUnknownStream},
    {"truncated-capnp", Mode::kTruncatedCapnp},
    {"shrunken-memfd", Mode::kShrunkenMemfd},
    {"unsealed-memfd", Mode::kUnsealedMemfd},
    {"writable-arena", Mode::kWritableArena},
    {"garbage-ring", Mode::kGarbageRing},
    {"silent", Mode::kSilent},
    {"injecting-include", Mode::kInjectingInclude},
    {"odd-forget", Mode::kOddForget},
    {"try", Mode::kTry},
    {"try-except-outside", Mode::kTryExceptOutside},
    {"try-end-early", Mode::kTryEndEarly},
    {"last-inside-try", Mode::kLastInsideTry},
    {"giant-literal", Mode::kGiantLiteral},
    {"plan-unchecked-gap", Mode::kPlanUncheckedGap},
    {"plan-segment-outside-arena", Mode::kPlanSegmentOutsideArena},
    {"plan-pin-out-of-range", Mode::kPlanPinOutOfRange},
    {"plan-try-unchecked", Mode::kPlanTryUnchecked},
};

// What the honest try shape's except part would emit: never seen.
constexpr char kExceptText[] = "<!-- the attempt failed -->";

// A stream id no worker hands out: ids count up from 1 per connection.
constexpr uint32_t kUnknownStream = 0x7fffffff;
// An offset no page reaches.
constexpr uint64_t kBeyond = uint64_t{1} << 40;
constexpr size_t kMaxHelloBytes = 64 * 1024;
constexpr int kHelloTimeoutSeconds = 2;

struct Options {
  std::string socketPath;
  Mode mode = Mode::kVerbatim;
  std::string_view modeName = "verbatim";
  uint32_t after = 0;
  uint32_t ringSize = 1 << 20;
};

[[noreturn]] void die(const char* what) {
  std::fprintf(stderr, "hostile: %s: %s\n", what, std::strerror(errno));
  std::exit(1);
}

bool memfdMode(Mode mode) {
  return mode == Mode::kShrunkenMemfd || mode == Mode::kUnsealedMemfd;
}

// Honest with bodies; only the plans lie.
bool planMode(Mode mode) {
  return mode == Mode::kPlanUncheckedGap || mode == Mode::kPlanSegmentOutsideArena ||
         mode == Mode::kPlanPinOutOfRange || mode == Mode::kPlanTryUnchecked;
}

// The fds of a Welcome the worker must refuse: a memfd with a valid header
// but the wrong size or no seals, and two eventfds.
struct BadRings {
  BadRings(Mode mode, uint32_t ringSize) {
    const size_t size = esi_shm_size(ringSize) / (mode == Mode::kShrunkenMemfd ? 2 : 1);
    memfd.reset(memfd_create("hostile-rings", MFD_CLOEXEC | MFD_ALLOW_SEALING));
    if (!memfd || ftruncate(memfd.get(), static_cast<off_t>(size)) != 0) die("memfd");
    esi_shm_header_t header{};
    header.magic = ESI_SHM_MAGIC;
    header.version = esi::wire::PROTOCOL_VERSION;
    header.ring_size = ringSize;
    if (pwrite(memfd.get(), &header, sizeof(header), 0) != sizeof(header)) die("pwrite");
    if (mode == Mode::kShrunkenMemfd &&
        fcntl(memfd.get(), F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) {
      die("F_ADD_SEALS");
    }
    workerEvent.reset(eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
    daemonEvent.reset(eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
    if (!workerEvent || !daemonEvent) die("eventfd");
  }

  UniqueFd memfd;
  UniqueFd workerEvent;
  UniqueFd daemonEvent;
};

// One worker's connection, from its Hello to its EOF.
class Connection {
 public:
  Connection(UniqueFd socket, const Options& options, const SegmentArena& arena,
             unsigned number)
      : socket_(std::move(socket)), options_(options), arena_(arena), number_(number) {}

  // Reads the Hello and sends the Welcome.  False: drop the connection.
  bool handshake();

  int socketFd() const { return socket_.get(); }
  // The eventfd to watch for the worker's records, or -1.
  int eventFd() const {
    return rings_ && options_.mode != Mode::kSilent ? rings_->daemonEventfd() : -1;
  }

  // The worker wrote or made room: read its records and answer them.
  void serve();

 private:
  struct Stream {
    uint64_t received = 0;
    uint64_t emitted = 0;
  };
  // A record to write; `length` may be shorter than `words` (truncated).
  struct Record {
    kj::Array<capnp::word> words;
    uint32_t length;
  };

  bool readHello();
  // The rings' memfd and eventfds; the arena goes fourth.
  bool sendWelcome(const int (&rings)[3]);
  void handle(const uint8_t* payload, uint32_t length);
  void answer(uint32_t id, Stream& stream, bool last);
  void misbehave(uint32_t id, Stream& stream, bool last);
  void lieInAPlan(uint32_t id, capnp::Data::Reader object);
  Record splice(uint32_t id, uint64_t released, bool last, uint64_t offset, uint32_t length,
                Shape shape = Shape::kPlain);
  static Record record(capnp::MessageBuilder& message);
  void flush();

  UniqueFd socket_;
  const Options& options_;
  const SegmentArena& arena_;
  const unsigned number_;
  std::unique_ptr<SharedRings> rings_;
  std::unique_ptr<BadRings> badRings_;
  std::unordered_map<uint32_t, Stream> streams_;
  std::deque<Record> pending_;
  uint32_t answers_ = 0;
  bool misbehaved_ = false;
};

bool Connection::handshake() {
  if (!readHello()) return false;
  if (memfdMode(options_.mode)) {
    badRings_ = std::make_unique<BadRings>(options_.mode, options_.ringSize);
    std::fprintf(stderr, "hostile: %s welcome to connection %u\n",
                 options_.modeName.data(), number_);
    return sendWelcome({badRings_->memfd.get(), badRings_->workerEvent.get(),
                        badRings_->daemonEvent.get()});
  }
  rings_ = std::make_unique<SharedRings>(options_.ringSize);
  if (options_.mode == Mode::kSilent) {
    std::fprintf(stderr, "hostile: silent welcome to connection %u\n", number_);
  } else {
    std::fprintf(stderr, "hostile: connection %u attached\n", number_);
  }
  return sendWelcome({rings_->memfd(), rings_->workerEventfd(), rings_->daemonEventfd()});
}

bool Connection::readHello() {
  // The worker sends its Hello right after connect(): read it in one go.
  const timeval timeout{kHelloTimeoutSeconds, 0};
  setsockopt(socket_.get(), SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
  std::vector<uint8_t> bytes(8);
  size_t have = 0;
  for (;;) {
    const ssize_t n = recv(socket_.get(), bytes.data() + have, bytes.size() - have, 0);
    if (n <= 0) return false;  // a probe that only connects, or a timeout
    have += static_cast<size_t>(n);
    if (have < bytes.size()) continue;
    if (bytes.size() > 8) break;
    uint32_t table[2];
    std::memcpy(table, bytes.data(), sizeof(table));
    const size_t total = 8 + size_t{table[1]} * sizeof(capnp::word);
    if (table[0] != 0 || total > kMaxHelloBytes || total == 8) return false;
    bytes.resize(total);
  }
  kj::Array<capnp::word> words = kj::heapArray<capnp::word>(bytes.size() / sizeof(capnp::word));
  std::memcpy(words.begin(), bytes.data(), bytes.size());
  try {
    capnp::FlatArrayMessageReader reader(words);
    auto hello = reader.getRoot<esi::wire::Hello>();
    return hello.which() == esi::wire::Hello::ATTACH;
  } catch (const kj::Exception&) {
    return false;
  }
}

bool Connection::sendWelcome(const int (&rings)[3]) {
  capnp::MallocMessageBuilder message;
  auto welcome = message.initRoot<esi::wire::Welcome>();
  welcome.setVersion(esi::wire::PROTOCOL_VERSION);
  welcome.setRingSize(options_.ringSize);
  welcome.setDaemonPid(static_cast<uint32_t>(getpid()));
  welcome.setArenaSize(arena_.size());
  kj::Array<capnp::word> bytes = capnp::messageToFlatArray(message);

  // The arena's size, but not sealed against writes.
  UniqueFd writable;
  if (options_.mode == Mode::kWritableArena) {
    writable.reset(memfd_create("hostile-arena", MFD_CLOEXEC));
    if (!writable || ftruncate(writable.get(), static_cast<off_t>(arena_.size())) != 0) {
      return false;
    }
  }
  const int fds[4] = {rings[0], rings[1], rings[2],
                      writable ? writable.get() : arena_.memfd()};
  return esi::sendWithFds(socket_.get(),
                          std::as_bytes(std::span(bytes.begin(), bytes.end())), fds);
}

void Connection::serve() {
  rings_->clearWakeups();
  esi_ring_t& requests = rings_->requests();
  for (;;) {
    flush();
    if (!pending_.empty()) {
      // Ask to be woken when the worker frees room for the oldest record.
      if (esi_ring_wait_space(&rings_->responses(), pending_.front().length)) return;
      continue;
    }
    if (misbehaved_) return;  // the worker must drop us: nothing more to say
    const uint8_t* payload;
    uint32_t length;
    switch (esi_ring_peek(&requests, &payload, &length)) {
      case ESI_RING_EMPTY:
        if (esi_ring_wait_data(&requests)) return;
        continue;
      case ESI_RING_CORRUPT:
        std::fprintf(stderr, "hostile: the worker's ring is corrupt\n");
        misbehaved_ = true;
        return;
      case ESI_RING_OK:
        break;
    }
    handle(payload, length);
    if (esi_ring_release(&requests)) rings_->wakeWorker();
  }
}

void Connection::handle(const uint8_t* payload, uint32_t length) {
  using esi::wire::Request;
  try {
    capnp::FlatArrayMessageReader reader(kj::ArrayPtr<const capnp::word>(
        reinterpret_cast<const capnp::word*>(payload), length / sizeof(capnp::word)));
    auto request = reader.getRoot<Request>();
    const uint32_t id = request.getStream();
    switch (request.which()) {
      case Request::OPEN:
        streams_[id] = Stream{};
        if (request.getOpen().hasObject()) {
          if (planMode(options_.mode)) {
            lieInAPlan(id, request.getOpen().getObject());
          } else {
            // a cache hit: as esid without a plan, "send the body"
            pending_.push_back(splice(id, 0, false, 0, 0));
          }
        }
        return;
      case Request::BODY: {
        auto it = streams_.find(id);
        if (it == streams_.end()) return;
        it->second.received += request.getBody().size();
        answer(id, it->second, false);
        return;
      }
      case Request::END: {
        auto it = streams_.find(id);
        if (it == streams_.end()) return;
        answer(id, it->second, true);
        streams_.erase(id);
        return;
      }
      case Request::CANCEL:
        streams_.erase(id);
        return;
      default:
        return;  // cache reports and purges: not this double's business
    }
  } catch (const kj::Exception& e) {
    std::fprintf(stderr, "hostile: malformed request: %s\n", e.getDescription().cStr());
  }
}

void Connection::answer(uint32_t id, Stream& stream, bool last) {
  const bool honest = options_.mode == Mode::kVerbatim || options_.mode == Mode::kTry ||
                      planMode(options_.mode);
  // last-inside-try can only break the last splice
  if (!honest && answers_ >= options_.after &&
      (last || options_.mode != Mode::kLastInsideTry)) {
    misbehave(id, stream, last);
    return;
  }
  ++answers_;
  const uint64_t from = stream.emitted;
  stream.emitted = stream.received;
  pending_.push_back(splice(id, stream.received, last, from,
                            static_cast<uint32_t>(stream.received - from),
                            options_.mode == Mode::kTry ? Shape::kTry : Shape::kPlain));
}

void Connection::misbehave(uint32_t id, Stream& stream, bool last) {
  misbehaved_ = true;
  std::fprintf(stderr, "hostile: %s on stream %u of connection %u\n",
               options_.modeName.data(), id, number_);
  switch (options_.mode) {
    case Mode::kOffsetOutOfRange:
      // Far beyond what we received, so beyond what the worker has sent
      // by the time it reads this, too.
      pending_.push_back(splice(id, stream.emitted, false, stream.received + kBeyond, 1));
      return;
    case Mode::kOversizedLength:
      pending_.push_back(splice(id, stream.emitted, false, stream.emitted, UINT32_MAX));
      return;
    case Mode::kUnknownStream:
      pending_.push_back(splice(kUnknownStream, 0, false, 0, 0));
      return;
    case Mode::kTruncatedCapnp: {
      Record record = splice(id, stream.received, false, stream.emitted,
                             static_cast<uint32_t>(stream.received - stream.emitted));
      record.length -= sizeof(capnp::word);
      pending_.push_back(std::move(record));
      return;
    }
    case Mode::kGarbageRing: {
      // More bytes published than the ring holds.
      esi_ring_t& ring = rings_->responses();
      const uint32_t head = __atomic_load_n(&ring.ctl->head, __ATOMIC_ACQUIRE);
      __atomic_store_n(&ring.ctl->tail, head + ring.size + 8, __ATOMIC_RELEASE);
      rings_->wakeWorker();
      return;
    }
    case Mode::kInjectingInclude: {
      // Args the proxy module would copy into the request line upstream.
      capnp::MallocMessageBuilder message;
      auto response = message.initRoot<esi::wire::Response>();
      response.setStream(id);
      auto splice = response.initSplice();
      splice.setReleased(stream.emitted);
      splice.setAnswered(true);
      auto include = splice.initInstructions(1)[0].initInclude();
      include.setPath("/injected");
      include.setArgs("a=1 HTTP/1.0\r\nX-Injected: 1\r\nX-Pad: ");
      pending_.push_back(record(message));
      return;
    }
    case Mode::kOddForget: {
      capnp::MallocMessageBuilder message;
      auto response = message.initRoot<esi::wire::Response>();
      response.setStream(0);
      response.initForget(15);
      pending_.push_back(record(message));
      return;
    }
    case Mode::kTryExceptOutside:
    case Mode::kTryEndEarly:
    case Mode::kLastInsideTry:
    case Mode::kGiantLiteral: {
      const Shape shape = options_.mode == Mode::kTryExceptOutside ? Shape::kExceptOutside
                          : options_.mode == Mode::kTryEndEarly    ? Shape::kEndEarly
                          : options_.mode == Mode::kLastInsideTry  ? Shape::kOpenTry
                                                                   : Shape::kGiantLiteral;
      const uint64_t from = stream.emitted;
      stream.emitted = stream.received;
      pending_.push_back(splice(id, stream.received, last, from,
                                static_cast<uint32_t>(stream.received - from), shape));
      return;
    }
    case Mode::kVerbatim:
    case Mode::kTry:
    case Mode::kPlanUncheckedGap:
    case Mode::kPlanSegmentOutsideArena:
    case Mode::kPlanPinOutOfRange:
    case Mode::kPlanTryUnchecked:
    case Mode::kShrunkenMemfd:
    case Mode::kUnsealedMemfd:
    case Mode::kWritableArena:
    case Mode::kSilent:
      return;
  }
}

// The object is key (16 bytes), file size, header size, inode and
// modification time (u64 LE): the plan covers the body, file size minus
// header size.
void Connection::lieInAPlan(uint32_t id, capnp::Data::Reader object) {
  if (object.size() != 48) return;
  auto u64At = [&](size_t at) {
    uint64_t v = 0;
    for (size_t k = 0; k < 8; ++k) v |= uint64_t{object[at + k]} << (8 * k);
    return v;
  };
  const uint64_t length = u64At(16) - u64At(24);
  misbehaved_ = true;
  std::fprintf(stderr, "hostile: %s on stream %u of connection %u\n",
               options_.modeName.data(), id, number_);

  capnp::MallocMessageBuilder message;
  auto response = message.initRoot<esi::wire::Response>();
  response.setStream(id);
  auto plan = response.initPlan();
  plan.setLength(length);
  const bool tries = options_.mode == Mode::kPlanTryUnchecked;
  auto steps = plan.initSteps(tries ? 4 : 1);
  auto verbatim = steps[0].initVerbatim();
  verbatim.setOffset(options_.mode == Mode::kPlanUncheckedGap ? 1 : 0);
  verbatim.setLength(options_.mode == Mode::kPlanUncheckedGap ? length - 1 : length);
  if (options_.mode == Mode::kPlanSegmentOutsideArena) {
    plan.setPin(1);
    auto segment = verbatim.initSegment();
    segment.setOffset(arena_.size());
    segment.setLength(64);
    const kj::byte head[] = {'<'};
    segment.setHead(kj::arrayPtr(head, sizeof(head)));
  } else if (options_.mode == Mode::kPlanPinOutOfRange) {
    plan.setPin(ESI_PIN_SLOTS + 1);
  } else if (tries) {
    steps[1].setTryStart();
    steps[2].setTryExcept();
    steps[3].setTryEnd();
  }
  pending_.push_back(record(message));
}

Connection::Record Connection::splice(uint32_t id, uint64_t released, bool last,
                                      uint64_t offset, uint32_t length, Shape shape) {
  enum Kind { kVerbatimAt, kStart, kExcept, kEnd, kExceptLiteral, kGiant };
  std::vector<Kind> kinds;
  switch (shape) {
    case Shape::kPlain: break;
    case Shape::kTry: kinds = {kStart, kVerbatimAt, kExcept, kExceptLiteral, kEnd}; break;
    case Shape::kExceptOutside: kinds = {kExcept, kVerbatimAt}; break;
    case Shape::kEndEarly: kinds = {kStart, kVerbatimAt, kEnd}; break;
    case Shape::kOpenTry: kinds = {kStart, kVerbatimAt}; break;
    case Shape::kGiantLiteral: kinds = {kGiant, kVerbatimAt}; break;
  }
  if (shape == Shape::kPlain && length != 0) kinds = {kVerbatimAt};
  if (length == 0) std::erase(kinds, kVerbatimAt);

  // one segment, as the worker accepts: room for the giant literal
  capnp::MallocMessageBuilder message(
      shape == Shape::kGiantLiteral ? options_.ringSize / sizeof(capnp::word) / 2 : 1024);
  auto response = message.initRoot<esi::wire::Response>();
  response.setStream(id);
  auto splice = response.initSplice();
  splice.setReleased(released);
  splice.setLast(last);
  splice.setAnswered(true);
  auto instructions = splice.initInstructions(static_cast<unsigned>(kinds.size()));
  for (unsigned i = 0; i < kinds.size(); ++i) {
    switch (kinds[i]) {
      case kVerbatimAt: {
        auto verbatim = instructions[i].initVerbatim();
        verbatim.setOffset(offset);
        verbatim.setLength(length);
        break;
      }
      case kStart: instructions[i].setTryStart(); break;
      case kExcept: instructions[i].setTryExcept(); break;
      case kEnd: instructions[i].setTryEnd(); break;
      case kExceptLiteral:
        instructions[i].setLiteral(kj::arrayPtr(
            reinterpret_cast<const kj::byte*>(kExceptText), sizeof(kExceptText) - 1));
        break;
      case kGiant:
        kj::ArrayPtr<kj::byte> bytes = instructions[i].initLiteral(options_.ringSize / 4);
        std::memset(bytes.begin(), 'L', bytes.size());
        break;
    }
  }
  return record(message);
}

Connection::Record Connection::record(capnp::MessageBuilder& message) {
  kj::Array<capnp::word> words = capnp::messageToFlatArray(message);
  const auto bytes = static_cast<uint32_t>(words.size() * sizeof(capnp::word));
  return Record{std::move(words), bytes};
}

void Connection::flush() {
  esi_ring_t& ring = rings_->responses();
  while (!pending_.empty()) {
    const Record& record = pending_.front();
    void* slot = esi_ring_reserve(&ring, record.length);
    if (slot == nullptr) return;
    std::memcpy(slot, record.words.begin(), record.length);
    if (esi_ring_commit(&ring, record.length)) rings_->wakeWorker();
    pending_.pop_front();
  }
}

uint32_t parseSize(const char* text) {
  char* end = nullptr;
  unsigned long long value = std::strtoull(text, &end, 10);
  if (*end == 'K' || *end == 'k') {
    value <<= 10;
    ++end;
  } else if (*end == 'M' || *end == 'm') {
    value <<= 20;
    ++end;
  }
  if (*end != '\0' || value > UINT32_MAX) return 0;
  return static_cast<uint32_t>(value);
}

[[noreturn]] void usage() {
  std::fprintf(stderr,
               "usage: hostile_esid --socket PATH --mode MODE [--after N] "
               "[--ring-size BYTES]\nmodes:");
  for (const ModeName& m : kModes) std::fprintf(stderr, " %s", m.name.data());
  std::fprintf(stderr, "\n");
  std::exit(2);
}

Options parseOptions(int argc, char** argv) {
  Options options;
  bool haveMode = false;
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    if (i + 1 >= argc) usage();
    const char* value = argv[++i];
    if (arg == "--socket") {
      options.socketPath = value;
    } else if (arg == "--mode") {
      for (const ModeName& m : kModes) {
        if (m.name == value) {
          options.mode = m.mode;
          options.modeName = m.name;
          haveMode = true;
        }
      }
      if (!haveMode) usage();
    } else if (arg == "--after") {
      options.after = static_cast<uint32_t>(std::strtoul(value, nullptr, 10));
    } else if (arg == "--ring-size") {
      options.ringSize = parseSize(value);
      if (!esi_ring_size_valid(options.ringSize)) usage();
    } else {
      usage();
    }
  }
  if (options.socketPath.empty() || !haveMode) usage();
  return options;
}

UniqueFd listenOn(const std::string& path) {
  UniqueFd fd(socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!fd) die("socket");
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (path.size() >= sizeof(addr.sun_path)) {
    errno = ENAMETOOLONG;
    die("socket path");
  }
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  unlink(path.c_str());
  if (bind(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) die("bind");
  if (listen(fd.get(), SOMAXCONN) != 0) die("listen");
  return fd;
}

}  // namespace

int main(int argc, char** argv) {
  const Options options = parseOptions(argc, argv);
  signal(SIGPIPE, SIG_IGN);
  const UniqueFd listener = listenOn(options.socketPath);
  const SegmentArena arena(SegmentArena::kMinBytes);
  std::fprintf(stderr, "hostile: listening on %s, mode %s\n", options.socketPath.c_str(),
               options.modeName.data());

  std::list<std::unique_ptr<Connection>> connections;
  unsigned accepted = 0;
  for (;;) {
    // pollfd i watches connection watched[i] (nullptr: the listener); the
    // socket of each connection only for its EOF.
    std::vector<pollfd> fds{{listener.get(), POLLIN, 0}};
    std::vector<Connection*> watched{nullptr};
    for (const auto& c : connections) {
      fds.push_back({c->socketFd(), POLLIN, 0});
      watched.push_back(c.get());
      if (c->eventFd() >= 0) {
        fds.push_back({c->eventFd(), POLLIN, 0});
        watched.push_back(c.get());
      }
    }
    if (poll(fds.data(), fds.size(), -1) < 0) {
      if (errno == EINTR) continue;
      die("poll");
    }

    std::vector<Connection*> gone;
    for (size_t i = 1; i < fds.size(); ++i) {
      if (fds[i].revents == 0) continue;
      Connection* c = watched[i];
      if (fds[i].fd == c->socketFd()) {
        gone.push_back(c);  // EOF, or bytes after the Hello: either way over
      } else {
        c->serve();
      }
    }
    connections.remove_if([&gone](const auto& c) {
      for (Connection* g : gone) {
        if (g == c.get()) return true;
      }
      return false;
    });

    if (fds[0].revents & POLLIN) {
      UniqueFd fd(accept4(listener.get(), nullptr, nullptr, SOCK_CLOEXEC));
      if (!fd) continue;
      auto c = std::make_unique<Connection>(std::move(fd), options, arena, ++accepted);
      if (c->handshake()) connections.push_back(std::move(c));
    }
  }
}
