#include "esid/settings.h"

#include <grp.h>
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <fstream>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <vector>

#include "base/text.h"
#include "fleet/redis_link.h"
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

// fleet_on_gap.
std::string parseGapAction(std::string_view text) {
  text = trim(text);
  if (text != "purge_all" && text != "log") {
    throw std::invalid_argument("fleet_on_gap \"" + std::string(text) +
                                "\" is not purge_all or log");
  }
  return std::string(text);
}

// A decimal number in [low, high]; what names it in messages.
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

}  // namespace

std::string logLevelName(spdlog::level::level_enum level) {
  // spdlog calls it "warning"; esid's flag and file say "warn".
  if (level == spdlog::level::warn) return "warn";
  const auto name = spdlog::level::to_string_view(level);
  return std::string(name.data(), name.size());
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

namespace {

// The readers of the settings that kSettings' rows need beyond the parsers
// above: each checks its text and returns the value.
std::string anyText(std::string_view text) { return std::string(text); }

std::string existingGroup(std::string_view text) {
  parseGroup(text);
  return std::string(text);
}

std::string fleetUrl(std::string_view text) {
  parseRedisUrl(text);  // refuses credentials: they belong in the file
  return std::string(text);
}

// what: the setting, as its refusal names it.
std::string absolutePathOf(std::string_view what, std::string_view text) {
  if (text.empty() || text.front() != '/') {
    throw std::invalid_argument(std::string(what) + " must be an absolute path");
  }
  return std::string(text);
}

std::string absolutePath(std::string_view text) { return absolutePathOf("state_dir", text); }

std::string tlsFile(std::string_view text) {
  return absolutePathOf("a fleet_tls_*_file", text);
}

uint64_t fleetMaxEntries(std::string_view text) {
  return parseCount(text, "fleet_max_entries", 100, uint64_t{1} << 32);
}

uint64_t fleetQueue(std::string_view text) {
  return parseCount(text, "fleet_queue", 1, uint64_t{1} << 24);
}

std::string valueText(const std::string& value) { return value; }
std::string valueText(uint64_t value) { return std::to_string(value); }
std::string valueText(spdlog::level::level_enum level) { return logLevelName(level); }
std::string valueText(const std::optional<mode_t>& mode) {
  return mode ? socketModeName(*mode) : std::string();
}

// spec, with the functions that read, show and keep member of Settings,
// whose text parse checks.
template <auto member, auto parse>
constexpr SettingSpec setting(SettingSpec spec) {
  spec.read = [](std::string_view text) -> std::function<void(Settings&)> {
    return [value = parse(text)](Settings& s) { s.*member = value; };
  };
  spec.text = [](const Settings& s) { return valueText(s.*member); };
  spec.keep = [](const Settings& from, Settings& to) { to.*member = from.*member; };
  return spec;
}

constexpr SettingSpec kSettingTable[] = {
    setting<&Settings::socketPath, anyText>({
        .key = "socket", .flag = "--socket", .value = "/run/esid/esid.sock",
        .help = "Unix socket to listen on (unused under systemd socket activation) "
                "[default: /run/esid/esid.sock]"}),
    setting<&Settings::socketGroup, existingGroup>({
        .key = "socket_group", .flag = "--socket-group",
        .help = "Group of the socket esid creates, NGINX's user's (www-data on Debian); "
                "ignored under socket activation [default: esid's own]"}),
    setting<&Settings::socketMode, parseSocketMode>({
        .key = "socket_mode", .flag = "--socket-mode", .unset = "0660",
        .help = "Octal mode of the socket esid creates, never world-writable; ignored "
                "under socket activation [default: 0660]"}),
    setting<&Settings::ringSize, parseRingSize>({
        .key = "ring_size", .flag = "--ring-size", .value = "1M", .reloads = true,
        .help = "Bytes of each shared-memory ring per NGINX worker: a power of two from "
                "256K to 64M [default: 1M]"}),
    setting<&Settings::segmentArena, parseSegmentArena>({
        .key = "segment_arena", .flag = "--segment-arena", .value = "256M",
        .help = "Bytes of the arena holding plans' gzip segments (esi_stitch), shared "
                "read-only with every NGINX worker: at least 1M, K/M/G suffixes "
                "[default: 256M]"}),
    setting<&Settings::planStore, parsePlanStore>({
        .key = "plan_store", .flag = "--plan-store", .value = "64M", .reloads = true,
        .help = "Bytes of the default plan zone, where locations without esi_plan_zone "
                "keep their plans and segments: at least 64K, K/M/G suffixes "
                "[default: 64M]"}),
    setting<&Settings::logLevel, parseLogLevel>({
        .key = "log_level", .flag = "--log-level", .value = "info", .reloads = true,
        .help = "trace, debug, info, warn, error, critical or off [default: info]"}),
    setting<&Settings::controlGroup, existingGroup>({
        .key = "control_group", .flag = "--control-group", .reloads = true,
        .help = "Members of this group may use esictl, besides root and esid's own user"}),
    setting<&Settings::fleet, fleetUrl>({
        .key = "fleet", .flag = "--fleet",
        .help = "Share purges with every esid of the fleet through this Redis: "
                "redis://host:port/db (credentials only in the settings file: "
                "fleet_user, fleet_password)"}),
    setting<&Settings::fleetNode, anyText>({
        .key = "fleet_node", .flag = "--fleet-node",
        .help = "This node's name in the fleet [default: the host name]"}),
    setting<&Settings::fleetStream, anyText>({.key = "fleet_stream", .value = "esi:purges"}),
    setting<&Settings::fleetUser, anyText>({.key = "fleet_user"}),
    setting<&Settings::fleetPassword, anyText>({.key = "fleet_password", .secret = true}),
    setting<&Settings::fleetTlsCaFile, tlsFile>({.key = "fleet_tls_ca_file"}),
    setting<&Settings::fleetTlsCertFile, tlsFile>({.key = "fleet_tls_cert_file"}),
    setting<&Settings::fleetTlsKeyFile, tlsFile>({.key = "fleet_tls_key_file"}),
    setting<&Settings::fleetTlsServerName, anyText>({.key = "fleet_tls_server_name"}),
    setting<&Settings::fleetOnGap, parseGapAction>({.key = "fleet_on_gap", .value = "purge_all"}),
    setting<&Settings::fleetMaxEntries, fleetMaxEntries>({
        .key = "fleet_max_entries", .value = "100000"}),
    setting<&Settings::fleetQueue, fleetQueue>({.key = "fleet_queue", .value = "10000"}),
    setting<&Settings::stateDir, absolutePath>({
        .key = "state_dir", .flag = "--state-dir", .value = "/var/lib/esid",
        .help = "Where esid keeps what must survive it: its position on the fleet's "
                "stream [default: /var/lib/esid]"}),
    setting<&Settings::metrics, parseMetricsAddress>({
        .key = "metrics", .flag = "--metrics", .unset = "(off)",
        .help = "Serve Prometheus metrics at http://ADDRESS:PORT/metrics, e.g. "
                "127.0.0.1:9145; any address is taken, so keep it on loopback or behind "
                "a firewall [default: off]"}),
};

// A secret differs by its value, which is never shown.
bool differs(const SettingSpec& spec, const Settings& a, const Settings& b) {
  return spec.secret ? spec.text(a) != spec.text(b)
                     : showSetting(spec, a) != showSetting(spec, b);
}

}  // namespace

const std::span<const SettingSpec> kSettings(kSettingTable);

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
    const auto spec = std::find_if(kSettings.begin(), kSettings.end(),
                                   [&](const SettingSpec& s) { return s.key == key; });
    try {
      if (spec == kSettings.end()) {
        std::string known;
        for (const SettingSpec& s : kSettings) known += (known.empty() ? "" : ", ") + std::string(s.key);
        throw std::invalid_argument("unknown key \"" + std::string(key) + "\" (known: " + known + ")");
      }
      layer.set(*spec, value);
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

void SettingsLayer::set(const SettingSpec& spec, std::string_view text) {
  values_.insert_or_assign(spec.key, spec.read(text));
}

void SettingsLayer::applyTo(Settings& settings) const {
  for (const auto& [key, store] : values_) store(settings);
}

Settings Settings::resolve(const SettingsLayer& file, const SettingsLayer& commandLine) {
  Settings s;
  for (const SettingSpec& spec : kSettings) {
    if (!spec.value.empty()) spec.read(spec.value)(s);
  }
  file.applyTo(s);
  commandLine.applyTo(s);
  return s;
}

std::string showSetting(const SettingSpec& spec, const Settings& settings) {
  const std::string text = spec.text(settings);
  if (text.empty()) return spec.unset.empty() ? "(none)" : std::string(spec.unset);
  return spec.secret ? "(set)" : text;
}

std::vector<std::string> describeChanges(const Settings& before, const Settings& after) {
  std::vector<std::string> changes;
  for (const SettingSpec& spec : kSettings) {
    if (!differs(spec, before, after)) continue;
    const std::string key(spec.key);
    changes.push_back(spec.secret ? key + " changed"
                                  : key + ": " + showSetting(spec, before) + " -> " +
                                        showSetting(spec, after));
  }
  return changes;
}

Settings keepUntilRestart(const Settings& current, Settings next,
                          std::vector<const SettingSpec*>& kept) {
  for (const SettingSpec& spec : kSettings) {
    if (spec.reloads || !differs(spec, current, next)) continue;
    spec.keep(current, next);
    kept.push_back(&spec);
  }
  return next;
}

}  // namespace esi
