// The segment arena: gzip segments of plans (esi_stitch), shared read-only
// with every NGINX worker (proto/README.md, Stitching).
//
// A segment is one verbatim run of a page deflated on its own: raw deflate
// ended with Z_FULL_FLUSH, so that it ends on a byte boundary, refers to
// nothing before itself, and concatenates with live deflate output.  A plan
// keeps all its segments back to back in one extent of the arena, held by a
// SegmentLease together with a pin slot.  Workers map the arena read-only
// (it is sealed against writes, growth and shrinking), so the bytes of an
// extent must not change while a worker may still send them: before naming
// a plan's segments to a worker esid raises the slot's count in that
// connection's PinTable, and the worker lowers it when done.  An extent whose
// lease is gone waits in quarantine until its slot's count is zero in every
// table; only then is it reused.  A connection that closes retires its
// table: the worker may still be sending what it pinned (it keeps its own
// mapping of the table until its last such request is over), so the table
// counts until it holds nothing or the worker process has exited.  A worker
// that never lowers a count keeps only those extents, and only while it
// lives.

#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include <sys/types.h>

#include "esi/ring.h"
#include "base/unique_fd.h"

namespace esi {

class PinTable;
class SegmentArena;

// One verbatim run's segment.
struct Segment {
  static constexpr size_t kHeadBytes = 32;

  uint64_t runOffset = 0;  // the run, in stream offsets
  uint32_t runLength = 0;
  uint64_t offset = 0;     // its deflated bytes, in the arena
  uint32_t length = 0;
  uint32_t crc = 0;        // CRC-32 of the run
  // The run's first bytes: a worker sends the segment only after finding
  // them where the run starts.
  std::array<uint8_t, kHeadBytes> head{};
};

// A verbatim run to deflate, in stream offsets.
struct RunRange {
  uint64_t offset = 0;
  uint32_t length = 0;
};

// An arena extent and a pin slot, owned by one plan.  Destroyed, it hands
// both to the arena's quarantine.  The arena must outlive it.
class SegmentLease {
 public:
  SegmentLease() = default;
  SegmentLease(SegmentLease&& other) noexcept;
  SegmentLease& operator=(SegmentLease&& other) noexcept;
  SegmentLease(const SegmentLease&) = delete;
  SegmentLease& operator=(const SegmentLease&) = delete;
  ~SegmentLease() { reset(); }

  explicit operator bool() const { return arena_ != nullptr; }
  uint32_t slot() const { return slot_; }
  uint64_t offset() const { return offset_; }
  uint64_t bytes() const { return bytes_; }  // the extent, granule-rounded

  void reset();

 private:
  friend class SegmentArena;
  SegmentLease(SegmentArena& arena, uint64_t offset, uint64_t bytes, uint32_t slot)
      : arena_(&arena), offset_(offset), bytes_(bytes), slot_(slot) {}

  SegmentArena* arena_ = nullptr;
  uint64_t offset_ = 0;
  uint64_t bytes_ = 0;
  uint32_t slot_ = 0;
};

// What deflating a plan's runs produced: its segments, ascending, in the
// extent the lease holds.
struct DeflatedRuns {
  std::vector<Segment> segments;
  SegmentLease lease;
};

class SegmentArena {
 public:
  static constexpr uint64_t kGranule = 64;       // allocation unit, bytes
  static constexpr uint32_t kMinRunBytes = 128;  // shorter runs deflate live
  static constexpr uint64_t kMinBytes = uint64_t{1} << 20;

  // Creates, maps and seals the memfd.  Throws std::system_error when the
  // kernel refuses (F_SEAL_FUTURE_WRITE needs Linux 5.1), and
  // std::invalid_argument for a size below kMinBytes.
  explicit SegmentArena(uint64_t bytes);
  ~SegmentArena();
  SegmentArena(const SegmentArena&) = delete;
  SegmentArena& operator=(const SegmentArena&) = delete;

  int memfd() const { return memfd_.get(); }
  uint64_t size() const { return size_; }

  // Deflates each run of body (ascending, inside body, each at least
  // kMinRunBytes long) at level 1..9 into one extent.  Nullopt when there
  // are no runs, or no room or no pin slot even after reclaiming the
  // quarantine (counted as arena full): the plan goes without segments.
  std::optional<DeflatedRuns> deflate(std::string_view body, const std::vector<RunRange>& runs,
                                      int level);

  // A worker connection closed: its table counts on while the worker may
  // still send what it pinned.
  void retire(std::unique_ptr<PinTable> table);

  // arena_bytes, arena_used_bytes, arena_quarantined_bytes, extents,
  // quarantined_extents, free_slots, segments_recorded, arena_full, pins,
  // retired_pin_tables: flat, each key prefixed "segment_" for esictl stats.
  nlohmann::json stats() const;

 private:
  friend class SegmentLease;
  friend class PinTable;
  struct Quarantined {
    uint64_t offset;
    uint64_t bytes;
    uint32_t slot;
  };

  std::optional<uint64_t> allocate(uint64_t bytes);
  void free(uint64_t offset, uint64_t bytes);
  void quarantine(uint64_t offset, uint64_t bytes, uint32_t slot);
  // Forgets retired tables that pin nothing or whose worker is gone, then
  // gives back every quarantined extent whose slot no table pins.
  void reclaim();
  bool pinned(uint32_t slot) const;
  // Requests of living workers that may be sending segments, and their
  // copies of reusable plans.
  uint64_t pins() const;

  const uint64_t size_;
  UniqueFd memfd_;
  uint8_t* map_ = nullptr;
  std::map<uint64_t, uint64_t> free_;  // offset -> bytes, coalesced
  std::vector<uint32_t> freeSlots_;    // a stack: the lowest slot on top
  std::vector<Quarantined> quarantine_;
  std::vector<const uint32_t*> tables_;  // ESI_PIN_SLOTS counts each
  std::vector<std::unique_ptr<PinTable>> retired_;  // after tables_: unregisters
  uint64_t used_ = 0;                    // by live leases
  uint64_t quarantinedBytes_ = 0;
  uint64_t extents_ = 0;
  uint64_t segmentsRecorded_ = 0;
  uint64_t full_ = 0;
};

// One worker connection's pin counts, in the shared memory of its rings:
// esid raises them, the worker lowers them.  Registered with the arena for
// as long as it lives.
class PinTable {
 public:
  // The ESI_PIN_SLOTS counts at `offset` of a connection's memfd, in a
  // mapping of the table's own, so that it may outlive the rings; worker is
  // the peer's pid (0: unknown, the table then counts until it is idle).
  // Throws std::system_error when the kernel refuses the mapping.
  static std::unique_ptr<PinTable> map(SegmentArena& arena, int memfd, uint64_t offset,
                                       pid_t worker);

  // counts: ESI_PIN_SLOTS of them, outliving this object.
  PinTable(SegmentArena& arena, uint32_t* counts, UniqueFd workerPidfd = {});
  ~PinTable();
  PinTable(const PinTable&) = delete;
  PinTable& operator=(const PinTable&) = delete;

  // A request of this connection may send the slot's segments from now on.
  void pin(uint32_t slot);

  // No count is raised: nothing of the worker's pins a segment.
  bool idle() const;
  // The sum of its counts.
  uint64_t raised() const;
  // The worker process has exited; false when its pid was not known.
  bool workerGone() const;

 private:
  SegmentArena& arena_;
  uint32_t* const counts_;
  UniqueFd workerPidfd_;
  void* mapping_ = nullptr;  // what map() mapped, unmapped with the table
};

}  // namespace esi
