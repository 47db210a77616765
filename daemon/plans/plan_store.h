// Parse plans: where a cached object's ESI constructs are, recorded on the
// first cache hit that esid parses and replayed by the worker on later hits
// without sending esid a byte of the page.
//
// A plan keeps the page's program (engine/program.h: verbatim runs,
// templates, includes, constructs, in stream order), not one request's
// evaluation of it, so every hit is evaluated afresh with its own request
// variables.  A check goes before each construct: its first bytes, which
// the worker compares with the bytes that actually arrive before it trusts
// the plan any further.  Evaluated, a plan skips what the request does not
// choose; each such gap starts at a construct, so it starts with a check
// (evaluate() keeps the checks that start a gap and drops the others).
// Where constructs without includes or tries (<esi:vars> blocks, chooses)
// and the short runs between them fit one check whole, the plan goes out
// as one literal there (PlanSpan): the check then covers every byte that
// literal stands for.  The
// store is keyed on the object's identity (ObjectId: one stored cache
// file); a purge forgets every plan of the files it removes.  The checks
// stay: a cache file rewritten in place keeps its identity.  Each zone (esi_plan_zone) has a byte budget; the
// least recently used plans make room, and a plan larger than the budget is
// not recorded.
//
// With esi_stitch a plan also holds the gzip segments of its long verbatim
// runs (segments/segment_arena.h): a second payload of the same entry,
// counted against the same budget and gone with it.

#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <list>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <variant>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "engine/program.h"
#include "segments/segment_arena.h"

namespace esi {

// What the worker knows of a cached object before reading its body: its
// cache file as it is on disk.  NGINX writes every store to a new file and
// renames it into place, so a store gets an inode and a modification time
// of its own (an inode alone is reused, a Date is only the second).
struct ObjectId {
  static constexpr size_t kWireBytes = 48;  // key, then five u64

  std::array<uint8_t, 16> key{};  // the cache file's name (a variant's hash)
  uint64_t length = 0;            // the cache file's size
  uint64_t headerSize = 0;        // where its body starts
  uint64_t inode = 0;
  uint64_t modified = 0;          // st_mtim in nanoseconds

  // From the 48 bytes the connector sends (little endian); nullopt when the
  // size is wrong.
  static std::optional<ObjectId> fromWire(std::string_view bytes);
  bool operator==(const ObjectId&) const = default;
};

struct ObjectIdHash {
  size_t operator()(const ObjectId& id) const noexcept;
};

// The first bytes of a construct, as recorded (at most kMaxBytes), or the
// whole of a span (at most kMaxSpanBytes).
struct PlanCheck {
  static constexpr size_t kMaxBytes = 256;
  static constexpr size_t kMaxSpanBytes = 1024;
  uint64_t offset = 0;
  std::string bytes;
};

// Program steps that a plan evaluates to one literal: from a construct's
// start to the start of a verbatim run, only values, runs shorter than a
// segment's (SegmentArena::kMinRunBytes) and choose, when and otherwise
// constructs, balanced; at most PlanCheck::kMaxSpanBytes of the body, all
// of them in its check.  Its runs go out as the check's bytes, copied with
// the values between them.
struct PlanSpan {
  size_t from = 0;  // program[from, to)
  size_t to = 0;
  size_t check = 0;  // checks[check] is the span's bytes
  // A span of runs and values only (no choose): all of them as one
  // template, rendered at once rather than step by step.
  std::optional<Template> flat;
};

// One request's evaluation of a plan: what the worker replays
// (proto/esi.capnp PlanStep), the instructions with the plan's checks
// between them.  The checks are the plan's own, not copies: an evaluation
// lives no longer than its plan.  Kept from one hit to the next, it reuses
// its memory.
class PlanEvaluation {
 public:
  size_t size() const { return instructions_.size() + checks_.size(); }

  // Calls visit(step) for each step in stream order, step being a
  // VerbatimRun, IncludeCall, LiteralText, TryMark or PlanCheck.
  template <typename Visit>
  void forEach(Visit&& visit) const {
    auto check = checks_.begin();
    for (size_t i = 0; i <= instructions_.size(); ++i) {
      for (; check != checks_.end() && check->first == i; ++check) visit(*check->second);
      if (i == instructions_.size()) break;
      std::visit(visit, instructions_[i]);
    }
  }

 private:
  friend struct Plan;
  std::vector<Instruction> instructions_;
  // Each check that starts a gap: before instructions_[first].
  std::vector<std::pair<size_t, const PlanCheck*>> checks_;
};

struct Plan {
  std::vector<ProgramStep> program;
  // checks[i] goes before program[checkBefore[i]] (or at the end); both
  // ascending.
  std::vector<PlanCheck> checks;
  std::vector<size_t> checkBefore;
  // Ascending, apart; no check lies inside one.
  std::vector<PlanSpan> spans;
  uint64_t length = 0;  // body bytes the plan describes
  // Some step reads the request: a value, an include with a variable, a
  // `when` test naming one.  A plan that reads nothing evaluates the same
  // for every request, and a worker may replay it without asking.
  bool readsRequest = false;
  // esi_stitch: the segments of the verbatim runs of at least
  // SegmentArena::kMinRunBytes, ascending, in the extent the lease holds.
  // None when the stream did not ask for them or the arena had no room.
  std::vector<Segment> segments;
  SegmentLease lease;

  // Memory the plan holds, its segments' arena bytes included, for the
  // zone's budget.
  size_t bytes() const;

  // Deflates the long verbatim runs of body (the body the plan was built
  // from) at level 1..9 into the arena: segments and lease.  Without room
  // in the arena the plan keeps none.
  void deflateRuns(std::string_view body, int level, SegmentArena& arena);

  // Where a parse of the body from base on starts: the program's steps
  // before base, and the text context there (that of the run at base).
  // base is where one of its verbatim runs ends (where a worker stops
  // replaying) or starts (where a segment's head differed): nullopt
  // otherwise.
  struct Resumption {
    std::vector<ProgramStep> before;
    TextContext context;
  };
  std::optional<Resumption> resumeAt(uint64_t base) const;

  // The steps the worker replays for one request, into out (what it held
  // before is dropped).
  void evaluate(const PageAddress& page, const RequestValues& values,
                PlanEvaluation& out) const;
};

// The plan of a whole body from the program its parse produced and the body
// itself: a check goes before each gap between the program's verbatim runs
// (a construct, or several), holding its first bytes (at most
// PlanCheck::kMaxBytes), and before each span (see PlanSpan, the longest
// from each construct on), holding all of it; the gaps inside a span have
// none.  Nullopt when the program does not fit the body (a verbatim run
// going backwards or past its end): nothing to record.
std::optional<Plan> buildPlan(std::vector<ProgramStep> program,
                              std::string_view body);

class PlanStore {
 public:
  // The zone a location plans in without esi_plan_zone: sized by esid
  // (its plan_store setting), not by NGINX.
  static constexpr std::string_view kDefaultZone = "default";
  static constexpr uint64_t kDefaultZoneBytes = uint64_t{64} << 20;

  explicit PlanStore(uint64_t defaultZoneBytes = kDefaultZoneBytes)
      : defaultZoneBytes_(defaultZoneBytes) {}

  // Creates the zone, or sets the budget of an existing one (evicting what
  // no longer fits).  maxBytes 0: the default zone's budget.
  void configureZone(std::string_view zone, uint64_t maxBytes);
  // The default zone's budget from now on (evicting what no longer fits).
  void setDefaultZoneBytes(uint64_t maxBytes);

  // The plan of the object, or null; counts a hit or a miss and makes the
  // entry the most recently used.  Null also for a zone never configured.
  std::shared_ptr<const Plan> find(std::string_view zone, const ObjectId& id);

  // A worker replayed its own copy of the object's plan: counts a hit and
  // makes the entry the most recently used.  False when the store no longer
  // has the plan (nothing is counted).
  bool replayed(std::string_view zone, const ObjectId& id);

  // Keeps the plan, evicting least recently used ones to make room.  False
  // (and nothing changes) when the zone is unknown or the plan alone is
  // larger than its budget.
  bool record(std::string_view zone, const ObjectId& id, Plan plan);

  // The worker found that the plan does not match the body: forget it.
  // Returns the plan forgotten, or null.
  std::shared_ptr<const Plan> drop(std::string_view zone, const ObjectId& id);

  // A purge removed these cache files: forgets their plans, every identity
  // of each, in every zone.  Returns how many.
  size_t purged(const std::vector<std::array<uint8_t, 16>>& keys);

  // Per zone: entries, bytes, max_bytes, hits, misses, drops, recorded,
  // evictions, too_large, purged, segment_bytes (of bytes, those of
  // segments).
  nlohmann::json zones() const;
  // One zone's entries, most recently used first, at most `limit`: key
  // (hex), length, header_size, inode, modified (ns), steps (program steps
  // and checks),
  // bytes, segments, segment_bytes, hits.  Null when there is no such zone.
  nlohmann::json entries(std::string_view zone, size_t limit) const;

 private:
  struct Entry {
    std::shared_ptr<const Plan> plan;
    size_t bytes = 0;
    uint64_t hits = 0;
    std::list<ObjectId>::iterator lru;
  };
  struct Zone {
    uint64_t maxBytes = 0;
    uint64_t bytes = 0;
    uint64_t segmentBytes = 0;  // part of bytes
    std::unordered_map<ObjectId, Entry, ObjectIdHash> entries;
    std::list<ObjectId> lru;  // front: most recently used
    // The identities recorded for each cache file: what a purge forgets.
    std::multimap<std::array<uint8_t, 16>, ObjectId> byKey;
    uint64_t hits = 0, misses = 0, drops = 0, recorded = 0, evictions = 0, tooLarge = 0,
             purged = 0;
  };

  // The object's entry, counted as a hit and made the most recently used;
  // null when there is none.
  static Entry* use(Zone& zone, const ObjectId& id);
  void evictUntil(Zone& zone, uint64_t maxBytes);
  // Takes the entry's bytes off the zone's counts.
  static void forget(Zone& zone, const Entry& entry);
  // Takes the identity off its key's list.
  static void eraseKey(Zone& zone, const ObjectId& id);

  std::map<std::string, Zone, std::less<>> zones_;
  uint64_t defaultZoneBytes_;
};

}  // namespace esi
