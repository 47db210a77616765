#include "plans/plan_store.h"

#include <algorithm>

#include <nlohmann/json.hpp>

namespace esi {

namespace {

// What an entry costs besides its steps and strings: the plan and its
// shared_ptr control block, the hash map node, the LRU list node.
constexpr size_t kEntryOverhead = 160;

uint64_t readLittleEndian64(const char* bytes) {
  uint64_t value = 0;
  for (int i = 7; i >= 0; --i) value = value << 8 | static_cast<uint8_t>(bytes[i]);
  return value;
}

// Heap bytes a string holds beyond its own object (none while it fits the
// small-string buffer).
size_t heapBytes(const std::string& s) {
  static const size_t kInline = std::string().capacity();
  return s.capacity() > kInline ? s.capacity() + 1 : 0;
}

std::string keyToHex(const std::array<uint8_t, 16>& key) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out(2 * key.size(), '0');
  for (size_t i = 0; i < key.size(); ++i) {
    out[2 * i] = kDigits[key[i] >> 4];
    out[2 * i + 1] = kDigits[key[i] & 15];
  }
  return out;
}

// Whether step may be in a span; depth counts the constructs the span has
// opened and not closed.
bool fitsSpan(const ProgramStep& step, int& depth) {
  if (const auto* run = std::get_if<VerbatimRun>(&step)) {
    return run->length < SegmentArena::kMinRunBytes;
  }
  if (std::holds_alternative<LiteralStep>(step)) return true;
  if (const auto* open = std::get_if<BlockOpen>(&step)) {
    if (open->block != Block::CHOOSE && open->block != Block::WHEN &&
        open->block != Block::OTHERWISE) {
      return false;
    }
    ++depth;
    return true;
  }
  if (std::holds_alternative<BlockClose>(step)) return depth-- > 0;
  return false;  // an include
}

// The longest span from program[from], whose bytes start at `start` (where
// the run before it ends), if one is worth it: more than one run or value
// (else it saves no step).  The runs are those of a valid plan.
std::optional<PlanSpan> spanFrom(const std::vector<ProgramStep>& program, size_t from,
                                 uint64_t start, uint64_t bodySize) {
  const auto* first = from < program.size() ? std::get_if<VerbatimRun>(&program[from]) : nullptr;
  if (first != nullptr && first->offset == start) return std::nullopt;  // no construct
  std::optional<PlanSpan> longest;
  int depth = 0;
  size_t runs = 0, values = 0;
  uint64_t last = start;  // where its last run ends
  for (size_t i = from;; ++i) {
    const auto* run = i < program.size() ? std::get_if<VerbatimRun>(&program[i]) : nullptr;
    const bool atEnd = i == program.size();
    if (run != nullptr || atEnd) {
      const uint64_t end = atEnd ? bodySize : run->offset;
      if (end - start > PlanCheck::kMaxSpanBytes) break;
      // It may end where a run starts, or at the end of the body after a
      // construct, outside its constructs.
      if (i > from && depth == 0 && (run != nullptr || end > last) && (runs > 0 || values > 1)) {
        longest = PlanSpan{from, i, 0, std::nullopt};
      }
    }
    if (atEnd || !fitsSpan(program[i], depth)) break;
    if (run != nullptr) {
      ++runs;
      last = run->offset + run->length;
    }
    values += std::holds_alternative<LiteralStep>(program[i]);
  }
  return longest;
}

// The span's runs and values as one template, when it holds nothing else.
std::optional<Template> flatten(const std::vector<ProgramStep>& program, const PlanSpan& span,
                                const PlanCheck& check) {
  Template flat;
  for (size_t i = span.from; i < span.to; ++i) {
    if (const auto* run = std::get_if<VerbatimRun>(&program[i])) {
      flat.appendText(std::string_view(check.bytes).substr(run->offset - check.offset, run->length));
    } else if (const auto* literal = std::get_if<LiteralStep>(&program[i])) {
      flat.append(literal->value);
    } else {
      return std::nullopt;
    }
  }
  return flat;
}

// Spans, each the longest from the first construct after the last.
std::vector<PlanSpan> findSpans(const std::vector<ProgramStep>& program, uint64_t bodySize) {
  std::vector<PlanSpan> spans;
  for (size_t i = 0; i < program.size(); ++i) {
    uint64_t start = 0;
    if (i > 0) {
      const auto* before = std::get_if<VerbatimRun>(&program[i - 1]);
      if (before == nullptr || (!spans.empty() && i <= spans.back().to)) continue;
      start = before->offset + before->length;
    }
    if (std::optional<PlanSpan> span = spanFrom(program, i, start, bodySize)) {
      spans.push_back(*span);
    }
  }
  return spans;
}

}  // namespace

std::optional<ObjectId> ObjectId::fromWire(std::string_view bytes) {
  if (bytes.size() != kWireBytes) return std::nullopt;
  ObjectId id;
  std::copy_n(bytes.begin(), id.key.size(), id.key.begin());
  id.length = readLittleEndian64(bytes.data() + 16);
  id.headerSize = readLittleEndian64(bytes.data() + 24);
  id.inode = readLittleEndian64(bytes.data() + 32);
  id.modified = readLittleEndian64(bytes.data() + 40);
  return id;
}

size_t ObjectIdHash::operator()(const ObjectId& id) const noexcept {
  // The key is an MD5 already; the other fields tell apart the versions of
  // one cache file.
  uint64_t h;
  static_assert(sizeof(h) <= sizeof(id.key));
  __builtin_memcpy(&h, id.key.data(), sizeof(h));
  h ^= id.modified * 0x9e3779b97f4a7c15ULL;
  h ^= id.inode * 0xc2b2ae3d27d4eb4fULL;
  h ^= id.length * 0x165667b19e3779f9ULL;
  return static_cast<size_t>(h);
}

size_t Plan::bytes() const {
  size_t total = kEntryOverhead + program.capacity() * sizeof(ProgramStep) +
                 checks.capacity() * sizeof(PlanCheck) +
                 checkBefore.capacity() * sizeof(size_t) +
                 spans.capacity() * sizeof(PlanSpan) +
                 segments.capacity() * sizeof(Segment) + lease.bytes();
  for (const ProgramStep& step : program) {
    if (const auto* literal = std::get_if<LiteralStep>(&step)) {
      total += literal->value.bytes();
    } else if (const auto* include = std::get_if<IncludeStep>(&step)) {
      total += include->src.bytes() + (include->alt ? include->alt->bytes() : 0);
      if (include->resolved) {
        const IncludeCall& call = *include->resolved;
        total += heapBytes(call.path) + heapBytes(call.args) +
                 heapBytes(call.altPath) + heapBytes(call.altArgs);
      }
    } else if (const auto* open = std::get_if<BlockOpen>(&step)) {
      total += open->test.bytes();
    }
  }
  for (const PlanCheck& check : checks) total += heapBytes(check.bytes);
  for (const PlanSpan& span : spans) total += span.flat ? span.flat->bytes() : 0;
  return total;
}

void Plan::deflateRuns(std::string_view body, int level, SegmentArena& arena) {
  std::vector<RunRange> runs;
  for (const ProgramStep& step : program) {
    const auto* run = std::get_if<VerbatimRun>(&step);
    if (run != nullptr && run->length >= SegmentArena::kMinRunBytes) {
      runs.push_back(RunRange{run->offset, run->length});
    }
  }
  std::optional<DeflatedRuns> deflated = arena.deflate(body, runs, level);
  if (!deflated) return;
  segments = std::move(deflated->segments);
  lease = std::move(deflated->lease);
}

std::optional<Plan::Resumption> Plan::resumeAt(uint64_t base) const {
  if (base == 0) return Resumption{};
  for (auto step = program.begin(); step != program.end(); ++step) {
    const auto* run = std::get_if<VerbatimRun>(&*step);
    if (run == nullptr) continue;
    if (run->offset == base) {
      return Resumption{std::vector<ProgramStep>(program.begin(), step), run->context};
    }
    if (run->offset + run->length == base) {
      return Resumption{std::vector<ProgramStep>(program.begin(), step + 1), run->context};
    }
  }
  return std::nullopt;
}

void Plan::evaluate(const PageAddress& page, const RequestValues& values,
                    PlanEvaluation& out) const {
  Evaluator evaluator(page, values);
  std::vector<Instruction>& instructions = out.instructions_;
  instructions.clear();
  out.checks_.clear();
  uint64_t covered = 0;  // end of the last verbatim run emitted
  size_t next = 0;       // of checks
  auto keepChecksBefore = [&](size_t step) {
    for (; next < checks.size() && checkBefore[next] == step; ++next) {
      if (checks[next].offset == covered) {
        out.checks_.emplace_back(instructions.size(), &checks[next]);
      }
    }
  };
  auto span = spans.begin();
  for (size_t i = 0; i < program.size(); ++i) {
    keepChecksBefore(i);
    if (span == spans.end() || span->from != i) {
      evaluator.step(program[i], instructions);
      if (!instructions.empty()) {
        if (const auto* run = std::get_if<VerbatimRun>(&instructions.back())) {
          covered = run->offset + run->length;
        }
      }
      continue;
    }
    // One text: its runs are its check's bytes.
    const PlanCheck& check = checks[span->check];
    std::string text;
    text.reserve(check.bytes.size());  // about its size: values replace references
    if (span->flat) {
      evaluator.renderInto(*span->flat, text);
      i = span->to;
    } else {
      for (; i < span->to; ++i) evaluator.stepInto(program[i], text, check.bytes, check.offset);
    }
    --i;
    if (!text.empty()) instructions.emplace_back(LiteralText{std::move(text)});
    ++span;
  }
  keepChecksBefore(program.size());
}

std::optional<Plan> buildPlan(std::vector<ProgramStep> program,
                              std::string_view body) {
  // The gaps between verbatim runs: bytes [start, end), program[from] the
  // first step after the run that ends at start.
  struct Gap {
    uint64_t start, end;
    size_t from;
  };
  std::vector<Gap> gaps;
  uint64_t pos = 0;  // end of the previous verbatim run
  // The gap after `pos`, whose end is the next verbatim run at or after
  // program[from] (or the end of the body).  False when that run starts
  // before `pos`.
  auto gapAfter = [&](size_t from) {
    uint64_t end = body.size();
    for (size_t i = from; i < program.size(); ++i) {
      if (const auto* run = std::get_if<VerbatimRun>(&program[i])) {
        end = run->offset;
        break;
      }
    }
    if (end < pos || end > body.size()) return false;
    if (end > pos) gaps.push_back(Gap{pos, end, from});
    return true;
  };

  if (!gapAfter(0)) return std::nullopt;
  for (size_t i = 0; i < program.size(); ++i) {
    if (const auto* run = std::get_if<VerbatimRun>(&program[i])) {
      // gapAfter() already saw that the run starts within the body, not
      // before `pos`.
      if (run->length > body.size() - run->offset) return std::nullopt;
      pos = run->offset + run->length;
      if (!gapAfter(i + 1)) return std::nullopt;
    }
  }

  Plan plan;
  plan.spans = findSpans(program, body.size());
  auto span = plan.spans.begin();
  for (const Gap& gap : gaps) {
    while (span != plan.spans.end() && span->to < gap.from) ++span;
    uint64_t end = gap.start + std::min<uint64_t>(gap.end - gap.start, PlanCheck::kMaxBytes);
    if (span != plan.spans.end() && span->from == gap.from) {
      // Its first gap: the check holds all of it.
      const auto* after = span->to < program.size()
                              ? std::get_if<VerbatimRun>(&program[span->to])
                              : nullptr;
      end = after != nullptr ? after->offset : body.size();
      span->check = plan.checks.size();
    } else if (span != plan.spans.end() && span->from < gap.from) {
      continue;  // inside it
    }
    plan.checks.push_back(PlanCheck{gap.start, std::string(body.substr(gap.start, end - gap.start))});
    plan.checkBefore.push_back(gap.from);
  }
  for (PlanSpan& s : plan.spans) s.flat = flatten(program, s, plan.checks[s.check]);
  plan.readsRequest = std::ranges::any_of(program, [](const ProgramStep& step) {
    if (std::holds_alternative<LiteralStep>(step)) return true;
    if (const auto* include = std::get_if<IncludeStep>(&step)) return !include->resolved;
    const auto* open = std::get_if<BlockOpen>(&step);
    return open != nullptr && open->testReadsRequest;
  });
  plan.program = std::move(program);
  plan.length = body.size();
  return plan;
}

void PlanStore::configureZone(std::string_view name, uint64_t maxBytes) {
  auto it = zones_.find(name);
  if (it == zones_.end()) it = zones_.emplace(std::string(name), Zone{}).first;
  if (maxBytes == 0) maxBytes = defaultZoneBytes_;
  it->second.maxBytes = maxBytes;
  evictUntil(it->second, maxBytes);
}

void PlanStore::setDefaultZoneBytes(uint64_t maxBytes) {
  defaultZoneBytes_ = maxBytes;
  auto it = zones_.find(kDefaultZone);
  if (it == zones_.end()) return;
  it->second.maxBytes = maxBytes;
  evictUntil(it->second, maxBytes);
}

std::shared_ptr<const Plan> PlanStore::find(std::string_view name, const ObjectId& id) {
  auto z = zones_.find(name);
  if (z == zones_.end()) return nullptr;
  const Entry* entry = use(z->second, id);
  if (entry == nullptr) {
    ++z->second.misses;
    return nullptr;
  }
  return entry->plan;
}

bool PlanStore::replayed(std::string_view name, const ObjectId& id) {
  auto z = zones_.find(name);
  return z != zones_.end() && use(z->second, id) != nullptr;
}

PlanStore::Entry* PlanStore::use(Zone& zone, const ObjectId& id) {
  auto it = zone.entries.find(id);
  if (it == zone.entries.end()) return nullptr;
  ++zone.hits;
  ++it->second.hits;
  zone.lru.splice(zone.lru.begin(), zone.lru, it->second.lru);
  return &it->second;
}

bool PlanStore::record(std::string_view name, const ObjectId& id, Plan plan) {
  auto z = zones_.find(name);
  if (z == zones_.end()) return false;
  Zone& zone = z->second;
  plan.program.shrink_to_fit();
  const size_t bytes = plan.bytes() + sizeof(ObjectId);
  if (bytes > zone.maxBytes) {
    ++zone.tooLarge;
    return false;
  }

  auto [it, fresh] = zone.entries.try_emplace(id);
  Entry& entry = it->second;
  if (fresh) {
    zone.lru.push_front(id);
    entry.lru = zone.lru.begin();
    zone.byKey.emplace(id.key, id);
  } else {
    forget(zone, entry);
    zone.lru.splice(zone.lru.begin(), zone.lru, entry.lru);
  }
  entry.plan = std::make_shared<const Plan>(std::move(plan));
  entry.bytes = bytes;
  entry.hits = 0;
  zone.bytes += bytes;
  zone.segmentBytes += entry.plan->lease.bytes();
  ++zone.recorded;
  // The new entry is the most recently used and fits alone: it stays.
  evictUntil(zone, zone.maxBytes);
  return true;
}

// Counts only plans actually forgotten: a plan evicted before the worker's
// report came in was not wrong for long.
std::shared_ptr<const Plan> PlanStore::drop(std::string_view name, const ObjectId& id) {
  auto z = zones_.find(name);
  if (z == zones_.end()) return nullptr;
  Zone& zone = z->second;
  auto it = zone.entries.find(id);
  if (it == zone.entries.end()) return nullptr;
  forget(zone, it->second);
  std::shared_ptr<const Plan> plan = std::move(it->second.plan);
  zone.lru.erase(it->second.lru);
  eraseKey(zone, id);
  zone.entries.erase(it);
  ++zone.drops;
  return plan;
}

size_t PlanStore::purged(const std::vector<std::array<uint8_t, 16>>& keys) {
  size_t count = 0;
  for (auto& [name, zone] : zones_) {
    for (const auto& key : keys) {
      auto [first, last] = zone.byKey.equal_range(key);
      for (auto k = first; k != last; ++k) {
        auto it = zone.entries.find(k->second);
        forget(zone, it->second);
        zone.lru.erase(it->second.lru);
        zone.entries.erase(it);
        ++zone.purged;
        ++count;
      }
      zone.byKey.erase(first, last);
    }
  }
  return count;
}

void PlanStore::evictUntil(Zone& zone, uint64_t maxBytes) {
  while (zone.bytes > maxBytes && !zone.lru.empty()) {
    auto it = zone.entries.find(zone.lru.back());
    forget(zone, it->second);
    eraseKey(zone, it->first);
    zone.entries.erase(it);
    zone.lru.pop_back();
    ++zone.evictions;
  }
}

void PlanStore::eraseKey(Zone& zone, const ObjectId& id) {
  auto [first, last] = zone.byKey.equal_range(id.key);
  for (auto k = first; k != last; ++k) {
    if (k->second == id) {
      zone.byKey.erase(k);
      return;
    }
  }
}

void PlanStore::forget(Zone& zone, const Entry& entry) {
  zone.bytes -= entry.bytes;
  zone.segmentBytes -= entry.plan->lease.bytes();
}

nlohmann::json PlanStore::zones() const {
  nlohmann::json out = nlohmann::json::object();
  for (const auto& [name, zone] : zones_) {
    out[name] = {{"entries", zone.entries.size()},
                 {"bytes", zone.bytes},
                 {"max_bytes", zone.maxBytes},
                 {"hits", zone.hits},
                 {"misses", zone.misses},
                 {"drops", zone.drops},
                 {"recorded", zone.recorded},
                 {"evictions", zone.evictions},
                 {"too_large", zone.tooLarge},
                 {"purged", zone.purged},
                 {"segment_bytes", zone.segmentBytes}};
  }
  return out;
}

nlohmann::json PlanStore::entries(std::string_view name, size_t limit) const {
  auto z = zones_.find(name);
  if (z == zones_.end()) return nullptr;
  const Zone& zone = z->second;
  nlohmann::json out = nlohmann::json::array();
  for (const ObjectId& id : zone.lru) {
    if (out.size() == limit) break;
    const Entry& entry = zone.entries.at(id);
    out.push_back({{"key", keyToHex(id.key)},
                   {"length", id.length},
                   {"header_size", id.headerSize},
                   {"inode", id.inode},
                   {"modified", id.modified},
                   {"steps", entry.plan->program.size() + entry.plan->checks.size()},
                   {"bytes", entry.bytes},
                   {"segments", entry.plan->segments.size()},
                   {"segment_bytes", entry.plan->lease.bytes()},
                   {"hits", entry.hits}});
  }
  return out;
}

}  // namespace esi
