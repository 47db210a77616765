#include "fleet/entry.h"

#include <charconv>

namespace esi {

namespace {

constexpr std::string_view kVersion = "1";

std::optional<uint64_t> parseNumber(std::string_view text) {
  uint64_t value = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || end != text.data() + text.size() || text.empty()) return std::nullopt;
  return value;
}

// Printable ASCII without spaces: what NGINX takes as a zone name.
bool plainName(std::string_view name, size_t limit) {
  if (name.empty() || name.size() > limit) return false;
  for (const char c : name) {
    if (c <= ' ' || c > '~') return false;
  }
  return true;
}

}  // namespace

std::optional<StreamId> StreamId::parse(std::string_view text) {
  const size_t dash = text.find('-');
  if (dash == std::string_view::npos) return std::nullopt;
  const auto ms = parseNumber(text.substr(0, dash));
  const auto seq = parseNumber(text.substr(dash + 1));
  if (!ms || !seq) return std::nullopt;
  return StreamId{*ms, *seq};
}

std::string_view entryKindName(PurgeQuery::Kind kind) {
  switch (kind) {
    case PurgeQuery::Kind::kKey:
      return "key";
    case PurgeQuery::Kind::kKeyPrefix:
      return "prefix";
    case PurgeQuery::Kind::kTag:
      return "tag";
    case PurgeQuery::Kind::kTagPattern:
      return "pattern";
  }
  return "key";
}

std::string StreamId::text() const { return std::to_string(ms) + "-" + std::to_string(seq); }

bool validNodeName(std::string_view name) {
  if (name.empty() || name.size() > kMaxNodeNameBytes) return false;
  for (const char c : name) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '.' || c == '-' || c == '_' || c == ':';
    if (!ok) return false;
  }
  return true;
}

std::vector<std::pair<std::string, std::string>> encodeEntry(const FleetEntry& entry) {
  std::vector<std::pair<std::string, std::string>> fields = {
      {"v", std::string(kVersion)},
      {"node", entry.node},
      {"zone", entry.query.zone},
      {"kind", std::string(entryKindName(entry.query.kind))},
      {"value", entry.query.value},
      {"uid", entry.uid}};
  if (entry.askAcks) fields.emplace_back("ack", "1");
  if (entry.query.soft) fields.emplace_back("soft", "1");
  return fields;
}

std::string checkEntry(const FleetEntry& entry) {
  if (!validNodeName(entry.node)) return "bad node name";
  if (!plainName(entry.query.zone, kMaxZoneNameBytes)) return "bad zone name";
  if (entry.query.value.size() > kMaxEntryValueBytes) return "value over 64 KiB";
  if (entry.query.value.find('\0') != std::string::npos) return "value holds a NUL byte";
  if (entry.query.value.empty() && entry.query.kind != PurgeQuery::Kind::kKeyPrefix) {
    return "empty key, tag or pattern";
  }
  if (entry.uid.size() > kMaxUidBytes || !plainName(entry.uid, kMaxUidBytes)) return "bad uid";
  return {};
}

std::optional<FleetEntry> decodeEntry(
    const std::vector<std::pair<std::string_view, std::string_view>>& fields, std::string* why) {
  std::optional<std::string_view> version, node, zone, kind, value, uid, ack, soft;
  for (const auto& [name, text] : fields) {
    std::optional<std::string_view>* slot = nullptr;
    if (name == "v") slot = &version;
    else if (name == "node") slot = &node;
    else if (name == "zone") slot = &zone;
    else if (name == "kind") slot = &kind;
    else if (name == "value") slot = &value;
    else if (name == "uid") slot = &uid;
    else if (name == "ack") slot = &ack;
    else if (name == "soft") slot = &soft;
    if (slot == nullptr) {
      *why = "unknown field \"" + std::string(name.substr(0, 64)) + "\"";
      return std::nullopt;
    }
    if (*slot) {
      *why = "field \"" + std::string(name) + "\" repeated";
      return std::nullopt;
    }
    *slot = text;
  }
  if (!version || *version != kVersion) {
    *why = "not a version 1 entry";
    return std::nullopt;
  }
  if (!node || !zone || !kind || !value || !uid) {
    *why = "a field is missing (node, zone, kind, value and uid are needed)";
    return std::nullopt;
  }
  FleetEntry entry;
  if (*kind == "key") {
    entry.query.kind = PurgeQuery::Kind::kKey;
  } else if (*kind == "prefix") {
    entry.query.kind = PurgeQuery::Kind::kKeyPrefix;
  } else if (*kind == "tag") {
    entry.query.kind = PurgeQuery::Kind::kTag;
  } else if (*kind == "pattern") {
    entry.query.kind = PurgeQuery::Kind::kTagPattern;
  } else {
    *why = "unknown kind \"" + std::string(kind->substr(0, 64)) + "\"";
    return std::nullopt;
  }
  if (ack && *ack != "1") {
    *why = "ack is not \"1\"";
    return std::nullopt;
  }
  if (soft && *soft != "1") {
    *why = "soft is not \"1\"";
    return std::nullopt;
  }
  entry.node = *node;
  entry.query.zone = *zone;
  entry.query.value = *value;
  entry.uid = *uid;
  entry.askAcks = ack.has_value();
  entry.query.soft = soft.has_value();
  if (std::string problem = checkEntry(entry); !problem.empty()) {
    *why = std::move(problem);
    return std::nullopt;
  }
  return entry;
}

uint64_t lostEntries(uint64_t appliedOrdinal, uint64_t entriesAdded, uint64_t length) {
  if (length > entriesAdded) return 0;  // no stream says so; nothing to conclude
  const uint64_t trimmed = entriesAdded - length;  // ordinals 1..trimmed are gone
  return trimmed > appliedOrdinal ? trimmed - appliedOrdinal : 0;
}

}  // namespace esi
