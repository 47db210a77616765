// esid's settings and where each comes from: built-in defaults, then the
// config file (`--config`), then the command line, which wins.  The file is
// read again on SIGHUP; what a reload may change is applied at once (the log
// level) or to connections made from then on (the ring size), never to the
// streams already running.
//
// The file is lines of `key = value`; `#` starts a comment; blank lines are
// ignored.  Every setting is one row of kSettings (settings.cc): its key, its
// flag, its default, how its value is checked, its --help text and whether a
// SIGHUP applies it; the file's reader, the flags, --check-config, the log
// of a reload's changes and docs/reference.md's check are driven by it.

#pragma once

#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <spdlog/common.h>

namespace esi {

constexpr uint32_t kMinRingSize = 256u << 10;
constexpr uint32_t kMaxRingSize = 64u << 20;
constexpr uint64_t kMinSegmentArena = uint64_t{1} << 20;
constexpr uint64_t kMaxSegmentArena = uint64_t{64} << 30;
constexpr uint64_t kMinPlanStore = uint64_t{64} << 10;  // esi_plan_zone's least
constexpr uint64_t kMaxPlanStore = uint64_t{64} << 30;

class SettingsLayer;

// The values esid runs with; Settings::resolve gives them their defaults.
struct Settings {
  std::string socketPath;
  std::string socketGroup;           // a group's name or number; empty: esid's own
  std::optional<mode_t> socketMode;  // empty: the server's 0660
  uint32_t ringSize = 0;
  uint64_t segmentArena = 0;  // the gzip segments of plans
  uint64_t planStore = 0;     // the default plan zone
  spdlog::level::level_enum logLevel{};
  std::string controlGroup;  // a group's name or number; empty: none
  std::string fleet;         // redis://host:port/db; empty: no fleet
  std::string fleetNode;     // empty: the host name
  std::string fleetStream;
  std::string fleetUser;      // the file only
  std::string fleetPassword;  // the file only
  std::string fleetTlsCaFile;      // rediss://; empty: the system's CAs
  std::string fleetTlsCertFile;    // empty: no client certificate
  std::string fleetTlsKeyFile;
  std::string fleetTlsServerName;  // empty: the URL's host
  std::string fleetOnGap;     // purge_all or log
  uint64_t fleetMaxEntries = 0;
  uint64_t fleetQueue = 0;
  std::string stateDir;
  std::string metrics;  // ADDRESS:PORT of GET /metrics; empty: none

  // Defaults, overridden by file, overridden by commandLine.
  static Settings resolve(const SettingsLayer& file, const SettingsLayer& commandLine);
};

// One of esid's settings.  Every setting has its file key; a flag too unless
// it is a secret (argv is readable by every local user) or rarely changed.
struct SettingSpec {
  std::string_view key;       // in the file: "ring_size"
  std::string_view flag{};    // "--ring-size"; empty: the file only
  std::string_view value{};   // the default, as the file would say it; empty: none
  std::string_view unset{};   // how no value reads in --check-config and logs: "(none)"
  bool reloads = false;       // a SIGHUP applies it; otherwise only a restart
  bool secret = false;        // never shown, only said to be set or changed
  std::string_view help{};    // --help's text for the flag
  // Checks text (throws std::invalid_argument saying what is wrong) and
  // returns what stores its value.
  std::function<void(Settings&)> (*read)(std::string_view text) = nullptr;
  // The value as text ("" when there is none), and its copy between two
  // Settings (a reload keeping what waits for a restart).
  std::string (*text)(const Settings& settings) = nullptr;
  void (*keep)(const Settings& from, Settings& to) = nullptr;
};

// Every setting, in the order --check-config and the logs list them.
extern const std::span<const SettingSpec> kSettings;

// The value of spec in settings as --check-config and logs show it.
std::string showSetting(const SettingSpec& spec, const Settings& settings);

// Values that one source (the file, the command line) sets; a setting it
// does not set is left to the source below it.
class SettingsLayer {
 public:
  // Checks text as spec's value and keeps it (the last one given wins).
  // Throws std::invalid_argument saying what is wrong.
  void set(const SettingSpec& spec, std::string_view text);
  bool has(const SettingSpec& spec) const { return values_.count(spec.key) > 0; }
  bool empty() const { return values_.empty(); }
  void applyTo(Settings& settings) const;

 private:
  std::map<std::string_view, std::function<void(Settings&)>> values_;
};

// "1048576", "1024K", "1M": a power of two in [kMinRingSize, kMaxRingSize].
// Throws std::invalid_argument saying what is wrong.
uint32_t parseRingSize(std::string_view text);

// "268435456", "256M", "1G": bytes in [kMinSegmentArena, kMaxSegmentArena].
// Throws std::invalid_argument saying what is wrong.
uint64_t parseSegmentArena(std::string_view text);

// "67108864", "64M": bytes in [kMinPlanStore, kMaxPlanStore].  Throws
// std::invalid_argument saying what is wrong.
uint64_t parsePlanStore(std::string_view text);

// "0660", "660", "0600": octal permission bits, at most 0777, never o+w
// (any local user could then speak to esid).  Throws std::invalid_argument
// saying what is wrong.
mode_t parseSocketMode(std::string_view text);

// "0660": the four octal digits of mode's permission bits.
std::string socketModeName(mode_t mode);

// "trace" ... "off".  Throws std::invalid_argument for anything else.
spdlog::level::level_enum parseLogLevel(std::string_view text);
std::string logLevelName(spdlog::level::level_enum level);

// "127.0.0.1:9145", "[::1]:9145": a numeric address and a port, for
// metrics.  Throws std::invalid_argument saying what is wrong.
std::string parseMetricsAddress(std::string_view text);

// A group's id from its name or number.  Throws std::invalid_argument when
// there is no such group.
gid_t parseGroup(std::string_view text);

// Parses the file's text; `name` is used in messages.  Throws
// std::invalid_argument naming the file and line of the first bad line.
SettingsLayer parseSettingsFile(std::string_view text, std::string_view name);

// Reads and parses path.  Throws std::runtime_error or std::invalid_argument.
SettingsLayer readSettingsFile(const std::string& path);

// One line per setting that differs, e.g. "log_level: info -> debug".
std::vector<std::string> describeChanges(const Settings& before, const Settings& after);

// next, with every setting a SIGHUP cannot change put back to current's
// value; the settings put back are added to kept.
Settings keepUntilRestart(const Settings& current, Settings next,
                          std::vector<const SettingSpec*>& kept);

}  // namespace esi
