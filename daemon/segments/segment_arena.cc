#include "segments/segment_arena.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <stdexcept>
#include <string>
#include <system_error>
#include <utility>

#include <nlohmann/json.hpp>

// Linux 5.1; older C libraries do not name it.
#ifndef F_SEAL_FUTURE_WRITE
#define F_SEAL_FUTURE_WRITE 0x0010
#endif

namespace esi {

namespace {

[[noreturn]] void fail(const char* what) {
  throw std::system_error(errno, std::generic_category(), what);
}

uint64_t roundUp(uint64_t bytes) {
  return (bytes + SegmentArena::kGranule - 1) & ~(SegmentArena::kGranule - 1);
}

// A raw deflate stream, reset for each run.  Failures are zlib's (memory),
// reported rather than thrown: a plan without segments is still a plan.
class Deflater {
 public:
  explicit Deflater(int level)
      : ok_(deflateInit2(&z_, level, Z_DEFLATED, -15, 8, Z_DEFAULT_STRATEGY) == Z_OK) {}
  ~Deflater() {
    if (ok_) deflateEnd(&z_);
  }
  Deflater(const Deflater&) = delete;
  Deflater& operator=(const Deflater&) = delete;

  // Appends run, deflated and ended with Z_FULL_FLUSH, to out.
  bool deflateRun(std::string_view run, std::string& out) {
    if (!ok_ || deflateReset(&z_) != Z_OK) return false;
    z_.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(run.data()));
    z_.avail_in = static_cast<uInt>(run.size());
    // deflateBound() is for a stream's end; a full flush's empty stored
    // block may need a few bytes more, and gets them in a second round.
    size_t room = deflateBound(&z_, run.size());
    do {
      const size_t at = out.size();
      out.resize(at + room);
      z_.next_out = reinterpret_cast<Bytef*>(out.data() + at);
      z_.avail_out = static_cast<uInt>(room);
      const int rc = ::deflate(&z_, Z_FULL_FLUSH);
      out.resize(out.size() - z_.avail_out);
      if (rc != Z_OK && rc != Z_BUF_ERROR) return false;
      room = 64;
    } while (z_.avail_out == 0);
    return z_.avail_in == 0;
  }

 private:
  z_stream z_{};
  const bool ok_;
};

}  // namespace

SegmentLease::SegmentLease(SegmentLease&& other) noexcept
    : arena_(std::exchange(other.arena_, nullptr)), offset_(other.offset_),
      bytes_(other.bytes_), slot_(other.slot_) {}

SegmentLease& SegmentLease::operator=(SegmentLease&& other) noexcept {
  if (this != &other) {
    reset();
    arena_ = std::exchange(other.arena_, nullptr);
    offset_ = other.offset_;
    bytes_ = other.bytes_;
    slot_ = other.slot_;
  }
  return *this;
}

void SegmentLease::reset() {
  if (arena_ == nullptr) return;
  std::exchange(arena_, nullptr)->quarantine(offset_, bytes_, slot_);
}

SegmentArena::SegmentArena(uint64_t bytes) : size_(roundUp(bytes)) {
  if (bytes < kMinBytes) {
    throw std::invalid_argument("the segment arena needs at least 1 MiB");
  }
  memfd_.reset(memfd_create("esid-segments", MFD_CLOEXEC | MFD_ALLOW_SEALING));
  if (!memfd_) fail("memfd_create");
  if (ftruncate(memfd_.get(), static_cast<off_t>(size_)) != 0) fail("ftruncate");
  // Our writable mapping comes first: F_SEAL_FUTURE_WRITE refuses every
  // later one, the workers' included.
  void* map = mmap(nullptr, size_, PROT_READ | PROT_WRITE, MAP_SHARED, memfd_.get(), 0);
  if (map == MAP_FAILED) fail("mmap");
  map_ = static_cast<uint8_t*>(map);
  if (fcntl(memfd_.get(), F_ADD_SEALS,
            F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_FUTURE_WRITE | F_SEAL_SEAL) != 0) {
    const int err = errno;
    munmap(map_, size_);
    errno = err;
    fail("F_ADD_SEALS (F_SEAL_FUTURE_WRITE needs Linux 5.1)");
  }
  free_.emplace(0, size_);
  freeSlots_.reserve(ESI_PIN_SLOTS);
  for (uint32_t slot = ESI_PIN_SLOTS; slot > 0; --slot) freeSlots_.push_back(slot - 1);
}

SegmentArena::~SegmentArena() { munmap(map_, size_); }

std::optional<DeflatedRuns> SegmentArena::deflate(std::string_view body,
                                                  const std::vector<RunRange>& runs,
                                                  int level) {
  if (runs.empty()) return std::nullopt;
  reclaim();
  if (freeSlots_.empty()) {
    ++full_;
    return std::nullopt;
  }

  DeflatedRuns out;
  out.segments.reserve(runs.size());
  std::string deflated;
  Deflater deflater(level);
  for (const RunRange& range : runs) {
    if (range.length < kMinRunBytes || range.offset > body.size() ||
        range.length > body.size() - range.offset) {
      return std::nullopt;
    }
    const std::string_view run = body.substr(range.offset, range.length);
    Segment segment;
    segment.runOffset = range.offset;
    segment.runLength = range.length;
    segment.offset = deflated.size();  // within the extent, for now
    if (!deflater.deflateRun(run, deflated)) return std::nullopt;
    segment.length = static_cast<uint32_t>(deflated.size() - segment.offset);
    segment.crc = static_cast<uint32_t>(
        crc32(0, reinterpret_cast<const Bytef*>(run.data()), static_cast<uInt>(run.size())));
    std::copy_n(run.begin(), Segment::kHeadBytes, segment.head.begin());
    out.segments.push_back(segment);
  }

  const uint64_t bytes = roundUp(deflated.size());
  std::optional<uint64_t> offset = allocate(bytes);
  if (!offset) {
    ++full_;
    return std::nullopt;
  }
  std::memcpy(map_ + *offset, deflated.data(), deflated.size());
  for (Segment& segment : out.segments) segment.offset += *offset;
  const uint32_t slot = freeSlots_.back();
  freeSlots_.pop_back();
  out.lease = SegmentLease(*this, *offset, bytes, slot);
  used_ += bytes;
  ++extents_;
  segmentsRecorded_ += out.segments.size();
  return out;
}

// First fit: plans come and go in no particular order, and coalescing keeps
// the free list short.
std::optional<uint64_t> SegmentArena::allocate(uint64_t bytes) {
  auto it = std::find_if(free_.begin(), free_.end(),
                         [bytes](const auto& extent) { return extent.second >= bytes; });
  if (it == free_.end()) return std::nullopt;
  const uint64_t offset = it->first;
  const uint64_t left = it->second - bytes;
  free_.erase(it);
  if (left > 0) free_.emplace(offset + bytes, left);
  return offset;
}

void SegmentArena::free(uint64_t offset, uint64_t bytes) {
  auto next = free_.lower_bound(offset);
  if (next != free_.end() && offset + bytes == next->first) {
    bytes += next->second;
    next = free_.erase(next);
  }
  if (next != free_.begin()) {
    auto previous = std::prev(next);
    if (previous->first + previous->second == offset) {
      previous->second += bytes;
      return;
    }
  }
  free_.emplace_hint(next, offset, bytes);
}

void SegmentArena::quarantine(uint64_t offset, uint64_t bytes, uint32_t slot) {
  quarantine_.push_back(Quarantined{offset, bytes, slot});
  used_ -= bytes;
  quarantinedBytes_ += bytes;
  --extents_;
}

void SegmentArena::retire(std::unique_ptr<PinTable> table) {
  if (!table->idle()) retired_.push_back(std::move(table));
}

void SegmentArena::reclaim() {
  std::erase_if(retired_, [](const std::unique_ptr<PinTable>& table) {
    return table->idle() || table->workerGone();
  });
  auto kept = std::remove_if(quarantine_.begin(), quarantine_.end(),
                             [this](const Quarantined& q) {
                               if (pinned(q.slot)) return false;
                               free(q.offset, q.bytes);
                               freeSlots_.push_back(q.slot);
                               quarantinedBytes_ -= q.bytes;
                               return true;
                             });
  quarantine_.erase(kept, quarantine_.end());
}

uint64_t SegmentArena::pins() const {
  uint64_t total = 0;
  for (const uint32_t* counts : tables_) {
    for (uint32_t slot = 0; slot < ESI_PIN_SLOTS; ++slot) {
      total += __atomic_load_n(&counts[slot], __ATOMIC_ACQUIRE);
    }
  }
  // A worker that exited sends nothing, whatever its table says.
  for (const auto& table : retired_) {
    if (table->workerGone()) total -= table->raised();
  }
  return total;
}

// Only a count esid raised can be non-zero, unless the worker is broken;
// either way the slot stays busy.
bool SegmentArena::pinned(uint32_t slot) const {
  return std::any_of(tables_.begin(), tables_.end(), [slot](const uint32_t* counts) {
    return __atomic_load_n(&counts[slot], __ATOMIC_ACQUIRE) != 0;
  });
}

nlohmann::json SegmentArena::stats() const {
  return {{"segment_arena_bytes", size_},
          {"segment_arena_used_bytes", used_},
          {"segment_arena_quarantined_bytes", quarantinedBytes_},
          {"segment_extents", extents_},
          {"segment_quarantined_extents", quarantine_.size()},
          {"segment_free_slots", freeSlots_.size()},
          {"segments_recorded", segmentsRecorded_},
          {"segment_arena_full", full_},
          {"segment_pins", pins()},
          {"segment_retired_pin_tables", std::count_if(retired_.begin(), retired_.end(),
                                                       [](const auto& table) {
                                                         return !table->workerGone();
                                                       })}};
}

std::unique_ptr<PinTable> PinTable::map(SegmentArena& arena, int memfd, uint64_t offset,
                                        pid_t worker) {
  const size_t bytes = ESI_PIN_SLOTS * sizeof(uint32_t);
  void* mapping = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, memfd,
                       static_cast<off_t>(offset));
  if (mapping == MAP_FAILED) fail("mmap of a pin table");
  // Without a pidfd (a pid that is already gone, an old kernel) the table
  // counts until it is idle.
  UniqueFd pidfd(worker > 0 ? static_cast<int>(syscall(SYS_pidfd_open, worker, 0)) : -1);
  auto table = std::make_unique<PinTable>(arena, static_cast<uint32_t*>(mapping),
                                          std::move(pidfd));
  table->mapping_ = mapping;
  return table;
}

PinTable::PinTable(SegmentArena& arena, uint32_t* counts, UniqueFd workerPidfd)
    : arena_(arena), counts_(counts), workerPidfd_(std::move(workerPidfd)) {
  arena_.tables_.push_back(counts_);
}

PinTable::~PinTable() {
  auto& tables = arena_.tables_;
  tables.erase(std::find(tables.begin(), tables.end(), counts_));
  if (mapping_ != nullptr) munmap(mapping_, ESI_PIN_SLOTS * sizeof(uint32_t));
}

void PinTable::pin(uint32_t slot) { __atomic_fetch_add(&counts_[slot], 1, __ATOMIC_RELEASE); }

bool PinTable::idle() const { return raised() == 0; }

uint64_t PinTable::raised() const {
  uint64_t total = 0;
  for (uint32_t slot = 0; slot < ESI_PIN_SLOTS; ++slot) {
    total += __atomic_load_n(&counts_[slot], __ATOMIC_ACQUIRE);
  }
  return total;
}

// A pidfd polls readable once its process has exited.
bool PinTable::workerGone() const {
  if (!workerPidfd_) return false;
  pollfd p{workerPidfd_.get(), POLLIN, 0};
  return poll(&p, 1, 0) == 1 && (p.revents & POLLIN) != 0;
}

}  // namespace esi
