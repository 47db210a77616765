#include "esid/settings.h"

#include <grp.h>
#include <sys/stat.h>

#include <cerrno>
#include <charconv>
#include <cstring>
#include <fstream>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <vector>

#include "base/text.h"
#include "http/metrics_endpoint.h"

namespace esi {

namespace {

// The gid of the group that lookup (getgrnam_r or getgrgid_r: a reload may
// run while esid's thread pool works) finds, with room for any member list.
template <typename Lookup>
std::optional<gid_t> findGroup(const Lookup& lookup) {
  std::vector<char> buffer(1024);
  group g{};
  group* found = nullptr;
  int err = 0;
  while ((err = lookup(&g, buffer.data(), buffer.size(), &found)) == ERANGE) {
    buffer.resize(buffer.size() * 2);
  }
  if (err != 0 || found == nullptr) return std::nullopt;
  return g.gr_gid;
}

// "4096", "256K", "1M", "1G": what sizes `what` ("ring size") in messages.
uint64_t parseBytes(std::string_view text, std::string_view what) {
  text = trim(text);
  uint64_t value = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || end == text.data()) {
    throw std::invalid_argument(std::string(what) + " \"" + std::string(text) +
                                "\" is not a number");
  }
  const std::string_view suffix(end, text.data() + text.size() - end);
  int shift = 0;
  if (suffix == "K" || suffix == "k") {
    shift = 10;
  } else if (suffix == "M" || suffix == "m") {
    shift = 20;
  } else if (suffix == "G" || suffix == "g") {
    shift = 30;
  } else if (!suffix.empty()) {
    throw std::invalid_argument(std::string(what) + " \"" + std::string(text) +
                                "\": the only suffixes are K, M and G");
  }
  if (value > (UINT64_MAX >> shift)) {
    throw std::invalid_argument(std::string(what) + " \"" + std::string(text) + "\" is too large");
  }
  return value << shift;
}

}  // namespace

std::string logLevelName(spdlog::level::level_enum level) {
  // spdlog calls it "warning"; esid's flag and file say "warn".
  if (level == spdlog::level::warn) return "warn";
  const auto name = spdlog::level::to_string_view(level);
  return std::string(name.data(), name.size());
}

Settings Settings::resolve(const SettingsLayer& file, const SettingsLayer& commandLine) {
  Settings s;
  for (const SettingsLayer* layer : {&file, &commandLine}) {
    if (layer->socketPath) s.socketPath = *layer->socketPath;
    if (layer->socketGroup) s.socketGroup = *layer->socketGroup;
    if (layer->socketMode) s.socketMode = *layer->socketMode;
    if (layer->ringSize) s.ringSize = *layer->ringSize;
    if (layer->segmentArena) s.segmentArena = *layer->segmentArena;
    if (layer->planStore) s.planStore = *layer->planStore;
    if (layer->logLevel) s.logLevel = *layer->logLevel;
    if (layer->controlGroup) s.controlGroup = *layer->controlGroup;
    FleetSettings& f = s.fleet;
    if (layer->fleet) f.url = *layer->fleet;
    if (layer->fleetNode) f.node = *layer->fleetNode;
    if (layer->fleetStream) f.stream = *layer->fleetStream;
    if (layer->fleetUser) f.user = *layer->fleetUser;
    if (layer->fleetPassword) f.password = *layer->fleetPassword;
    if (layer->fleetTlsCaFile) f.tlsCaFile = *layer->fleetTlsCaFile;
    if (layer->fleetTlsCertFile) f.tlsCertFile = *layer->fleetTlsCertFile;
    if (layer->fleetTlsKeyFile) f.tlsKeyFile = *layer->fleetTlsKeyFile;
    if (layer->fleetTlsServerName) f.tlsServerName = *layer->fleetTlsServerName;
    if (layer->fleetOnGap) f.onGap = *layer->fleetOnGap;
    if (layer->fleetMaxEntries) f.maxEntries = *layer->fleetMaxEntries;
    if (layer->fleetQueue) f.queue = *layer->fleetQueue;
    if (layer->stateDir) f.stateDir = *layer->stateDir;
    if (layer->metrics) s.metrics = *layer->metrics;
  }
  return s;
}

std::string parseMetricsAddress(std::string_view text) {
  return parseListenAddress(text).text;
}

uint32_t parseRingSize(std::string_view text) {
  const uint64_t value = parseBytes(text, "ring size");
  if (value < kMinRingSize || value > kMaxRingSize) {
    throw std::invalid_argument("ring size " + std::to_string(value) +
                                " is outside [256K, 64M]");
  }
  if ((value & (value - 1)) != 0) {
    throw std::invalid_argument("ring size " + std::to_string(value) +
                                " is not a power of two");
  }
  return static_cast<uint32_t>(value);
}

uint64_t parseSegmentArena(std::string_view text) {
  const uint64_t value = parseBytes(text, "segment arena");
  if (value < kMinSegmentArena || value > kMaxSegmentArena) {
    throw std::invalid_argument("segment arena " + std::to_string(value) +
                                " is outside [1M, 64G]");
  }
  return value;
}

uint64_t parsePlanStore(std::string_view text) {
  const uint64_t value = parseBytes(text, "plan store");
  if (value < kMinPlanStore || value > kMaxPlanStore) {
    throw std::invalid_argument("plan store " + std::to_string(value) +
                                " is outside [64K, 64G]");
  }
  return value;
}

mode_t parseSocketMode(std::string_view text) {
  text = trim(text);
  unsigned value = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value, 8);
  if (ec != std::errc() || end != text.data() + text.size() || text.empty() ||
      text.size() > 4) {
    throw std::invalid_argument("socket mode \"" + std::string(text) +
                                "\" is not an octal mode such as 0660");
  }
  if (value > 0777) {
    throw std::invalid_argument("socket mode " + std::string(text) +
                                ": only permission bits (at most 0777)");
  }
  const auto mode = static_cast<mode_t>(value);
  if ((mode & S_IWOTH) != 0) {
    throw std::invalid_argument("socket mode " + socketModeName(mode) +
                                " is world-writable: any local user could speak to esid; "
                                "give NGINX's user the socket's group (socket_group, "
                                "--socket-group) instead");
  }
  return mode;
}

std::string socketModeName(mode_t mode) {
  std::string name(4, '0');
  for (int i = 3; i >= 0; --i, mode >>= 3) name[i] = static_cast<char>('0' + (mode & 7));
  return name;
}

spdlog::level::level_enum parseLogLevel(std::string_view text) {
  text = trim(text);
  for (int i = spdlog::level::trace; i < spdlog::level::n_levels; ++i) {
    const auto level = static_cast<spdlog::level::level_enum>(i);
    if (text == logLevelName(level)) return level;
  }
  throw std::invalid_argument("log level \"" + std::string(text) +
                              "\" is not one of trace, debug, info, warn, error, "
                              "critical, off");
}

std::string parseGapAction(std::string_view text) {
  text = trim(text);
  if (text != "purge_all" && text != "log") {
    throw std::invalid_argument("fleet_on_gap \"" + std::string(text) +
                                "\" is not purge_all or log");
  }
  return std::string(text);
}

uint64_t parseCount(std::string_view text, std::string_view what, uint64_t low, uint64_t high) {
  text = trim(text);
  uint64_t value = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || end != text.data() + text.size() || text.empty() || value < low ||
      value > high) {
    throw std::invalid_argument(std::string(what) + " \"" + std::string(text) +
                                "\" is not a number from " + std::to_string(low) + " to " +
                                std::to_string(high));
  }
  return value;
}

gid_t parseGroup(std::string_view text) {
  const std::string name(trim(text));
  const auto named = findGroup([&](group* g, char* buf, size_t size, group** found) {
    return getgrnam_r(name.c_str(), g, buf, size, found);
  });
  if (named) return *named;
  unsigned long gid = 0;
  const auto [end, ec] = std::from_chars(name.data(), name.data() + name.size(), gid);
  if (ec == std::errc() && end == name.data() + name.size() && !name.empty()) {
    const auto numbered = findGroup([&](group* g, char* buf, size_t size, group** found) {
      return getgrgid_r(static_cast<gid_t>(gid), g, buf, size, found);
    });
    if (numbered) return *numbered;
  }
  throw std::invalid_argument("no group \"" + name + "\"");
}

SettingsLayer parseSettingsFile(std::string_view text, std::string_view name) {
  SettingsLayer layer;
  size_t lineNumber = 0;
  while (!text.empty()) {
    ++lineNumber;
    const size_t eol = text.find('\n');
    std::string_view line = text.substr(0, eol);
    text = eol == std::string_view::npos ? std::string_view() : text.substr(eol + 1);

    if (const size_t hash = line.find('#'); hash != std::string_view::npos) {
      line = line.substr(0, hash);
    }
    line = trim(line);
    if (line.empty()) continue;

    const auto where = [&] { return std::string(name) + ":" + std::to_string(lineNumber) + ": "; };
    const size_t equals = line.find('=');
    if (equals == std::string_view::npos) {
      throw std::invalid_argument(where() + "expected \"key = value\"");
    }
    const std::string_view key = trim(line.substr(0, equals));
    const std::string_view value = trim(line.substr(equals + 1));
    if (value.empty()) throw std::invalid_argument(where() + "\"" + std::string(key) + "\" has no value");
    try {
      if (key == "socket") {
        layer.socketPath = std::string(value);
      } else if (key == "socket_group") {
        parseGroup(value);
        layer.socketGroup = std::string(value);
      } else if (key == "socket_mode") {
        layer.socketMode = parseSocketMode(value);
      } else if (key == "ring_size") {
        layer.ringSize = parseRingSize(value);
      } else if (key == "segment_arena") {
        layer.segmentArena = parseSegmentArena(value);
      } else if (key == "plan_store") {
        layer.planStore = parsePlanStore(value);
      } else if (key == "log_level") {
        layer.logLevel = parseLogLevel(value);
      } else if (key == "control_group") {
        parseGroup(value);
        layer.controlGroup = std::string(value);
      } else if (key == "fleet") {
        layer.fleet = std::string(value);
      } else if (key == "fleet_node") {
        layer.fleetNode = std::string(value);
      } else if (key == "fleet_stream") {
        layer.fleetStream = std::string(value);
      } else if (key == "fleet_user") {
        layer.fleetUser = std::string(value);
      } else if (key == "fleet_password") {
        layer.fleetPassword = std::string(value);
      } else if (key == "fleet_tls_ca_file" || key == "fleet_tls_cert_file" ||
                 key == "fleet_tls_key_file") {
        if (value.front() != '/') throw std::invalid_argument(std::string(key) + " must be an absolute path");
        (key == "fleet_tls_ca_file"     ? layer.fleetTlsCaFile
         : key == "fleet_tls_cert_file" ? layer.fleetTlsCertFile
                                        : layer.fleetTlsKeyFile) = std::string(value);
      } else if (key == "fleet_tls_server_name") {
        layer.fleetTlsServerName = std::string(value);
      } else if (key == "fleet_on_gap") {
        layer.fleetOnGap = parseGapAction(value);
      } else if (key == "fleet_max_entries") {
        layer.fleetMaxEntries = parseCount(value, "fleet_max_entries", 100, uint64_t{1} << 32);
      } else if (key == "fleet_queue") {
        layer.fleetQueue = parseCount(value, "fleet_queue", 1, uint64_t{1} << 24);
      } else if (key == "state_dir") {
        if (value.front() != '/') throw std::invalid_argument("state_dir must be an absolute path");
        layer.stateDir = std::string(value);
      } else if (key == "metrics") {
        layer.metrics = parseMetricsAddress(value);
      } else {
        throw std::invalid_argument("unknown key \"" + std::string(key) +
                                    "\" (known: socket, socket_group, socket_mode, ring_size, "
                                    "segment_arena, plan_store, log_level, control_group, fleet, "
                                    "fleet_node, fleet_stream, fleet_user, fleet_password, "
                                    "fleet_tls_ca_file, fleet_tls_cert_file, fleet_tls_key_file, "
                                    "fleet_tls_server_name, fleet_on_gap, fleet_max_entries, fleet_queue, state_dir, "
                                    "metrics)");
      }
    } catch (const std::invalid_argument& e) {
      throw std::invalid_argument(where() + e.what());
    }
  }
  return layer;
}

SettingsLayer readSettingsFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot read " + path + ": " + std::strerror(errno));
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) throw std::runtime_error("cannot read " + path + ": " + std::strerror(errno));
  return parseSettingsFile(text.str(), path);
}

std::vector<std::string> describeChanges(const Settings& before, const Settings& after) {
  std::vector<std::string> changes;
  if (before.socketPath != after.socketPath) {
    changes.push_back("socket: " + before.socketPath + " -> " + after.socketPath);
  }
  if (before.socketGroup != after.socketGroup) {
    changes.push_back("socket_group: " + (before.socketGroup.empty() ? "(none)" : before.socketGroup) +
                      " -> " + (after.socketGroup.empty() ? "(none)" : after.socketGroup));
  }
  const mode_t modeBefore = before.socketMode.value_or(kDefaultSocketMode);
  const mode_t modeAfter = after.socketMode.value_or(kDefaultSocketMode);
  if (modeBefore != modeAfter) {
    changes.push_back("socket_mode: " + socketModeName(modeBefore) + " -> " +
                      socketModeName(modeAfter));
  }
  if (before.ringSize != after.ringSize) {
    changes.push_back("ring_size: " + std::to_string(before.ringSize) + " -> " +
                      std::to_string(after.ringSize));
  }
  if (before.segmentArena != after.segmentArena) {
    changes.push_back("segment_arena: " + std::to_string(before.segmentArena) + " -> " +
                      std::to_string(after.segmentArena));
  }
  if (before.planStore != after.planStore) {
    changes.push_back("plan_store: " + std::to_string(before.planStore) + " -> " +
                      std::to_string(after.planStore));
  }
  if (before.logLevel != after.logLevel) {
    changes.push_back("log_level: " + logLevelName(before.logLevel) + " -> " +
                      logLevelName(after.logLevel));
  }
  const auto text = [&](std::string_view name, const std::string& a, const std::string& b) {
    if (a != b) {
      changes.push_back(std::string(name) + ": " + (a.empty() ? "(none)" : a) + " -> " +
                        (b.empty() ? "(none)" : b));
    }
  };
  const FleetSettings& a = before.fleet;
  const FleetSettings& b = after.fleet;
  text("fleet", a.url, b.url);
  text("fleet_node", a.node, b.node);
  text("fleet_stream", a.stream, b.stream);
  text("fleet_user", a.user, b.user);
  if (a.password != b.password) changes.push_back("fleet_password changed");
  text("fleet_tls_ca_file", a.tlsCaFile, b.tlsCaFile);
  text("fleet_tls_cert_file", a.tlsCertFile, b.tlsCertFile);
  text("fleet_tls_key_file", a.tlsKeyFile, b.tlsKeyFile);
  text("fleet_tls_server_name", a.tlsServerName, b.tlsServerName);
  text("fleet_on_gap", a.onGap, b.onGap);
  text("fleet_max_entries", std::to_string(a.maxEntries), std::to_string(b.maxEntries));
  text("fleet_queue", std::to_string(a.queue), std::to_string(b.queue));
  text("state_dir", a.stateDir, b.stateDir);
  text("metrics", before.metrics, after.metrics);
  if (before.controlGroup != after.controlGroup) {
    changes.push_back("control_group: " + (before.controlGroup.empty() ? "(none)" : before.controlGroup) +
                      " -> " + (after.controlGroup.empty() ? "(none)" : after.controlGroup));
  }
  return changes;
}

}  // namespace esi
