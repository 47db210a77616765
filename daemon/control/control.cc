#include "control/control.h"

#include <algorithm>
#include <charconv>
#include <string>

#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "control/metrics_page.h"

namespace esi {

namespace {

// Splits "WORD REST" at the first space; REST keeps its spaces.
std::pair<std::string_view, std::string_view> firstWord(std::string_view line) {
  const size_t space = line.find(' ');
  if (space == std::string_view::npos) return {line, {}};
  return {line.substr(0, space), line.substr(space + 1)};
}

}  // namespace

bool Control::allowed(const PeerCredentials& peer) const {
  if (peer.uid == 0 || peer.uid == owner_) return true;
  return group_ && (peer.gid == *group_ || std::find(peer.groups.begin(), peer.groups.end(),
                                                     *group_) != peer.groups.end());
}

void Control::handle(std::string_view command, const PeerCredentials& peer,
                     const ControlAnswerFn& answer) {
  if (!allowed(peer)) {
    spdlog::warn("control: uid {} gid {} (pid {}) refused", peer.uid, peer.gid, peer.pid);
    answer({false, "permission denied: uid " + std::to_string(peer.uid) +
                       " may not control esid"});
    return;
  }
  if (server_ != nullptr) server_->catchUp();
  if (command.substr(0, 6) == "purge ") {
    spdlog::info("control: uid {} (pid {}) asks: {}", peer.uid, peer.pid, command);
    purge(command.substr(6), false, answer);
    return;
  }
  if (command == "fleet" || command.substr(0, 6) == "fleet ") {
    fleet(command.substr(std::min<size_t>(command.size(), 6)), answer);
    return;
  }
  answer(query(command));
}

nlohmann::json Control::counters() const {
  nlohmann::json stats = stats_.toJson();
  stats.update(arena_.stats());
  if (fleet_ != nullptr) stats.update(fleet_->stats());
  const WorkerSession::RingUse rings =
      server_ != nullptr ? server_->ringUse() : WorkerSession::RingUse{};
  stats["ring_used_requests"] = rings.requests;
  stats["ring_used_responses"] = rings.responses;
  stats["ring_capacity"] = rings.capacity;
  return stats;
}

std::string Control::metrics() {
  if (server_ != nullptr) server_->catchUp();
  return metricsPage();
}

std::string Control::metricsPage() const {
  const nlohmann::json counted = counters();
  return renderMetrics({stats_, counted, purger_.scanSeconds(), purger_.scansFailed()});
}

ControlAnswer Control::query(std::string_view command) const {
  if (command == "stats") return {true, counters().dump()};
  if (command == "metrics") return {true, nlohmann::json{{"text", metricsPage()}}.dump()};
  if (command == "log" || command.substr(0, 4) == "log ") {
    return log(command.substr(std::min<size_t>(command.size(), 4)));
  }
  if (command == "zones") {
    return {true, purger_.zones().dump()};
  }
  // "variants ZONE KEY": the key is the rest of the line, spaces and all.
  if (command.substr(0, 9) == "variants ") {
    const auto [zone, key] = firstWord(command.substr(9));
    if (key.empty()) return {false, "usage: variants ZONE KEY"};
    const nlohmann::json answer = purger_.variants(zone, key);
    if (answer.is_null()) {
      return {false, "no zone \"" + std::string(zone) + "\""};
    }
    return {true, answer.dump()};
  }
  if (command == "plans") return plans({});
  if (command.substr(0, 6) == "plans ") return plans(command.substr(6));
  return {false, "unknown command \"" + std::string(command) + "\""};
}

// "plans": every plan zone's counters; "plans ZONE": one zone's counters and
// its most recently used entries.
ControlAnswer Control::plans(std::string_view zone) const {
  constexpr size_t kMaxEntries = 100;
  nlohmann::json zones = plans_.zones();
  if (zone.empty()) return {true, zones.dump()};
  nlohmann::json entries = plans_.entries(zone, kMaxEntries);
  if (entries.is_null()) {
    return {false, "no plan zone \"" + std::string(zone) + "\""};
  }
  const nlohmann::json answer = {{"zone", std::move(zones[std::string(zone)])},
                                 {"entries", std::move(entries)}};
  return {true, answer.dump()};
}

// "log now": where the trace is; "log AFTER [STATUS [PREFIX]]": its entries
// after AFTER, those of STATUS (0: any) whose URL starts with PREFIX (the
// rest of the line).
ControlAnswer Control::log(std::string_view args) const {
  constexpr std::string_view kUsage = "usage: log now | log AFTER [STATUS [PREFIX]]";
  if (trace_ == nullptr) return {false, "esid keeps no trace"};
  const auto [after, rest] = firstWord(args);
  if (after == "now") {
    return {true, nlohmann::json{{"last", trace_->last()}, {"missed", 0},
                                 {"entries", nlohmann::json::array()}}.dump()};
  }
  const auto [status, prefix] = firstWord(rest);
  uint64_t from = 0;
  TraceFilter filter;
  const auto number = [](std::string_view text, auto& value) {
    const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
    return error == std::errc() && end == text.data() + text.size();
  };
  if (!number(after, from) || (!status.empty() && !number(status, filter.status))) {
    return {false, std::string(kUsage)};
  }
  filter.prefix = prefix;
  const TraceSlice slice = trace_->since(from, filter);
  nlohmann::json entries = nlohmann::json::array();
  for (const TraceEntry& entry : slice.entries) entries.push_back(entry.toJson());
  return {true, nlohmann::json{{"last", slice.last}, {"missed", slice.missed},
                               {"entries", std::move(entries)}}.dump()};
}

// "fleet": this node and the fleet's; "fleet acks UID": who applied a
// purge; "fleet purge ZONE KIND VALUE": a purge every node acknowledges.
void Control::fleet(std::string_view args, const ControlAnswerFn& answer) {
  if (fleet_ == nullptr) {
    answer({false, "esid has no fleet (see fleet in esid(8))"});
    return;
  }
  const auto [word, rest] = firstWord(args);
  if (word.empty()) {
    fleet_->describe([answer](const nlohmann::json& out) { answer({true, out.dump()}); });
  } else if (word == "acks" && !rest.empty()) {
    fleet_->acks(std::string(rest), [answer](const nlohmann::json& out) {
      if (out.contains("error")) {
        answer({false, out["error"].get<std::string>()});
      } else {
        answer({true, out.dump()});
      }
    });
  } else if (word == "purge") {
    spdlog::info("control: fleet purge {}", rest);
    purge(rest, true, answer);
  } else {
    answer({false, "usage: fleet | fleet acks UID | fleet purge ZONE key|prefix|tag|pattern VALUE"});
  }
}

// "purge ZONE key|prefix|tag|pattern VALUE": VALUE is the rest of the line.
void Control::purge(std::string_view args, bool askAcks, const ControlAnswerFn& answer) {
  const auto [zone, rest] = firstWord(args);
  const auto [kind, value] = firstWord(rest);
  PurgeQuery query;
  if (kind == "key") {
    query.kind = PurgeQuery::Kind::kKey;
  } else if (kind == "prefix") {
    query.kind = PurgeQuery::Kind::kKeyPrefix;
  } else if (kind == "tag") {
    query.kind = PurgeQuery::Kind::kTag;
  } else if (kind == "pattern") {
    query.kind = PurgeQuery::Kind::kTagPattern;
  } else {
    answer({false, "usage: purge ZONE key|prefix|tag|pattern VALUE"});
    return;
  }
  if (zone.empty() || (value.empty() && query.kind != PurgeQuery::Kind::kKeyPrefix)) {
    answer({false, "usage: purge ZONE key|prefix|tag|pattern VALUE"});
    return;
  }
  query.zone = zone;
  query.value = value;
  nlohmann::json result = {{"zone", query.zone}, {"kind", std::string(kind)}, {"value", query.value}};
  orders_.order(std::move(query), [answer, result](const PurgeOrderOutcome& outcome) mutable {
    if (!outcome.error.empty()) {
      answer({false, outcome.error});
      return;
    }
    result["count"] = outcome.count;
    result["scanned"] = outcome.scanned;
    result["fleet"] = outcome.fleet.status;
    result["fleet_uid"] = outcome.fleet.uid;
    answer({true, result.dump()});
  }, PurgeOrderOptions{false, askAcks});
}

}  // namespace esi
