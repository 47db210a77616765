#include "control/metrics_page.h"

#include <algorithm>
#include <array>
#include <cctype>
#include <optional>
#include <string>
#include <string_view>

#include "metrics/exposition.h"
#include "variants/purger.h"

namespace esi {

namespace {

// Counters and gauges that are one number, by their key in counters.
struct Plain {
  const char* key;
  const char* name;
  bool counter;
  const char* help;
};

constexpr Plain kPlain[] = {
    {"connections", "esid_connections_total", true, "NGINX worker connections accepted."},
    {"active_connections", "esid_sessions", false, "NGINX worker connections open now."},
    {"streams", "esid_streams_total", true, "Response bodies (streams) opened for ESI processing."},
    {"active_streams", "esid_active_streams", false, "Streams being processed now."},
    {"bytes", "esid_parsed_bytes_total", true, "Body bytes parsed."},
    {"includes", "esid_includes_total", true, "esi:include elements found."},
    {"warnings", "esid_warnings_total", true, "Odd markup passed over."},
    {"ring_full", "esid_ring_full_total", true, "Answers that had to wait for ring space."},
    {"worker_waits", "esid_worker_waits_total", true,
     "Times a worker waited for room in its ring to esid, woken when esid read."},
    {"ring_capacity", "esid_ring_capacity_bytes", false,
     "Size of the workers' rings, both directions."},
    {"stitched", "esid_stitched_total", true, "Plans sent naming gzip segments (esi_stitch)."},
    {"ring_bytes_in", "esid_ring_in_bytes_total", true, "Message bytes read from workers' rings."},
    {"ring_bytes_out", "esid_ring_out_bytes_total", true,
     "Message bytes written to workers' rings."},
    {"segment_arena_bytes", "esid_segment_arena_bytes", false, "Size of the gzip segment arena."},
    {"segment_arena_used_bytes", "esid_segment_arena_used_bytes", false,
     "Arena bytes held by plans' segments."},
    {"segment_arena_quarantined_bytes", "esid_segment_arena_quarantined_bytes", false,
     "Arena bytes of forgotten plans that a worker may still be sending."},
    {"segment_extents", "esid_segment_extents", false, "Plans holding segments in the arena."},
    {"segment_quarantined_extents", "esid_segment_quarantined_extents", false,
     "Extents waiting until no worker pins them."},
    {"segment_free_slots", "esid_segment_free_slots", false, "Pin slots free for new plans."},
    {"segments_recorded", "esid_segments_recorded_total", true,
     "Verbatim runs deflated into segments."},
    {"segment_arena_full", "esid_segment_arena_full_total", true,
     "Plans recorded without segments: no room or no pin slot in the arena."},
    {"segment_pins", "esid_segment_pins", false,
     "Requests and plan copies of living workers that may send segments."},
    {"segment_retired_pin_tables", "esid_segment_retired_pin_tables", false,
     "Pin tables of closed connections whose workers still send segments."},
    {"fleet_connected", "esid_fleet_connected", false, "1 while both connections to Redis are up."},
    {"fleet_published", "esid_fleet_published_total", true,
     "Purges carried out here and appended to the fleet's stream."},
    {"fleet_pending", "esid_fleet_pending", false,
     "Purges carried out here waiting to be appended (Redis away)."},
    {"fleet_applied", "esid_fleet_applied_total", true, "Other nodes' purges carried out here."},
    {"fleet_own", "esid_fleet_own_entries_total", true, "Entries of this node's read back."},
    {"fleet_skipped", "esid_fleet_skipped_total", true,
     "Stream entries skipped: not a purge, or a zone no worker here serves."},
    {"fleet_failed", "esid_fleet_failed_total", true, "Entries whose purge failed every attempt."},
    {"fleet_refused", "esid_fleet_refused_total", true,
     "Purges not published: outside the stream's limits."},
    {"fleet_dropped", "esid_fleet_dropped_total", true,
     "Purges dropped from the full queue while Redis was away."},
    {"fleet_gaps", "esid_fleet_gaps_total", true,
     "Times this node found entries it needed trimmed from the stream."},
    {"fleet_lost", "esid_fleet_lost_entries_total", true, "Entries lost in those gaps."},
    {"fleet_lag_entries", "esid_fleet_lag_entries", false,
     "Entries on the stream this node has not applied yet."},
    {"fleet_lag_ms", "esid_fleet_lag_milliseconds", false,
     "Stream time between the newest entry and the last applied here."},
};

// Keys the labelled families below show.
constexpr std::string_view kLabelled[] = {
    "planned",           "replayed",           "plan_misses",      "plan_drops",
    "fragments_resolved", "fragments_deferred", "fragments_refused", "errors",
    "protocol_errors",   "purge_errors",       "ring_used_requests", "ring_used_responses"};

bool shown(std::string_view key) {
  return std::any_of(std::begin(kPlain), std::end(kPlain),
                     [key](const Plain& p) { return key == p.key; }) ||
         std::find(std::begin(kLabelled), std::end(kLabelled), key) != std::end(kLabelled);
}

// A count of `esictl stats` by its key; nothing when absent or not a count.
std::optional<uint64_t> count(const nlohmann::json& counters, const std::string& key) {
  const auto it = counters.find(key);
  if (it == counters.end() || !it->is_number_integer() || *it < 0) return std::nullopt;
  return it->get<uint64_t>();
}

void labelled(Exposition& out, const Stats& s, uint64_t scansFailed) {
  out.counter("esid_pages_total",
              "Pages esid served: parsed, answered with a plan, or replayed by a worker.")
      .sample(s.streams, {{"how", "parse"}})
      .sample(s.planned - s.replayed, {{"how", "plan"}})
      .sample(s.replayed, {{"how", "replay"}});
  out.counter("esid_plan_lookups_total",
              "Cache hits with esi_plan: a plan found (hit), none yet (miss), or one a worker "
              "found not to match its body (drop).")
      .sample(s.planned, {{"result", "hit"}})
      .sample(s.planMisses, {{"result", "miss"}})
      .sample(s.planDrops, {{"result", "drop"}});
  out.counter("esid_fragments_total",
              "esi:include URLs: resolved when parsed, resolved per request (they read it), or "
              "refused.")
      .sample(s.fragmentsResolved, {{"outcome", "resolved"}})
      .sample(s.fragmentsDeferred, {{"outcome", "deferred"}})
      .sample(s.fragmentsRefused, {{"outcome", "refused"}});
  out.counter("esid_errors_total", "Errors by cause.")
      .sample(s.protocolErrors, {{"cause", "protocol"}})
      .sample(s.errors - s.protocolErrors, {{"cause", "include_refused"}})
      .sample(s.purgeErrors, {{"cause", "purge"}})
      .sample(scansFailed, {{"cause", "scan"}});
  out.counter("esid_purges_total",
              "Purges answered, by kind, soft or hard, and by path: the variant index alone, or "
              "a read of the zone's directory.");
  constexpr std::array kKinds{PurgeQuery::Kind::kKey, PurgeQuery::Kind::kKeyPrefix,
                              PurgeQuery::Kind::kTag, PurgeQuery::Kind::kTagPattern};
  static_assert(kKinds.size() == Stats::kPurgeKinds);
  for (const PurgeQuery::Kind kind : kKinds) {
    for (size_t soft = 0; soft < 2; ++soft) {
      for (size_t scanned = 0; scanned < 2; ++scanned) {
        out.sample(s.purges[static_cast<size_t>(kind)][soft][scanned],
                   {{"kind", purgeKindName(kind)},
                    {"mode", soft != 0 ? "soft" : "hard"},
                    {"path", scanned != 0 ? "directory" : "index"}});
      }
    }
  }
}

}  // namespace

std::string renderMetrics(const MetricsSources& sources) {
  Exposition out;
  labelled(out, sources.stats, sources.scansFailed);
  for (const Plain& p : kPlain) {
    const std::optional<uint64_t> value = count(sources.counters, p.key);
    if (!value) continue;
    if (p.counter) {
      out.counter(p.name, p.help);
    } else {
      out.gauge(p.name, p.help);
    }
    out.sample(*value);
  }
  out.gauge("esid_ring_used_bytes", "Bytes waiting in the workers' rings, by direction.");
  for (const std::string_view ring : {"requests", "responses"}) {
    if (const auto value = count(sources.counters, "ring_used_" + std::string(ring))) {
      out.sample(*value, {{"ring", ring}});
    }
  }
  out.histogram("esid_purge_duration_seconds",
                "From a worker's purge request to esid's answer.", sources.stats.purgeSeconds);
  out.histogram("esid_scan_duration_seconds", "Reads of a zone's directory, from start to end.",
                sources.scanSeconds);
  // A counter added to stats and not here yet still shows, untyped.
  for (const auto& [key, value] : sources.counters.items()) {
    if (!value.is_number() || shown(key)) continue;
    std::string name = "esid_";
    for (char c : key) name += std::isalnum(static_cast<unsigned char>(c)) ? c : '_';
    out.gauge(name, "esid stats field \"" + key + "\".").sample(value.get<double>());
  }
  return out.text();
}

}  // namespace esi
