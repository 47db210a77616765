// esid's settings and where each comes from: built-in defaults, then the
// config file (`--config`), then the command line, which wins.  The file is
// read again on SIGHUP; what a reload may change is applied at once (the log
// level) or to connections made from then on (the ring size), never to the
// streams already running.
//
// The file is lines of `key = value`; `#` starts a comment; blank lines are
// ignored.  Keys:
//
//     socket    = /run/esid/esid.sock   # read at start only
//     socket_group = www-data           # the socket's group; read at start only
//     socket_mode = 0660                # octal, never o+w; read at start only
//     ring_size = 1M                    # bytes, K/M suffixes, a power of two
//     segment_arena = 256M              # bytes, K/M/G suffixes; read at start only
//     plan_store = 64M                  # bytes of the default plan zone
//     log_level = info                  # trace debug info warn error critical off
//     control_group = adm               # its members may use esictl (besides
//                                       # root and esid's own user)
//     fleet = redis://127.0.0.1:6379/0  # share purges with other esids; at start only
//     fleet_node = web-1                # this node's name (default: the host name)
//     fleet_stream = esi:purges         # the Redis stream
//     fleet_user = esid                 # Redis ACL user and password: the file
//     fleet_password = secret           # only, never the command line
//     fleet_tls_ca_file = /etc/esid/redis-ca.pem    # rediss://: the CA that signed
//                                       # Redis' certificate (default: the system's)
//     fleet_tls_cert_file = /etc/esid/client.pem    # a client certificate and
//     fleet_tls_key_file = /etc/esid/client.key     # its key, for tls-auth-clients
//     fleet_tls_server_name = redis.internal        # the name checked against the
//                                       # certificate (default: the URL's host)
//     fleet_on_gap = purge_all          # or log: entries trimmed before read
//     fleet_max_entries = 100000        # the stream keeps about this many
//     fleet_queue = 10000               # entries kept while Redis is away
//     state_dir = /var/lib/esid         # what must survive esid
//     metrics = 127.0.0.1:9145          # Prometheus' /metrics; off by default;
//                                       # read at start only

#pragma once

#include <sys/types.h>

#include <cstdint>
#include <optional>
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
constexpr mode_t kDefaultSocketMode = 0660;

// Values that one source sets; an empty optional leaves the value to the
// source below it.
struct SettingsLayer {
  std::optional<std::string> socketPath;
  std::optional<std::string> socketGroup;  // a group's name or number
  std::optional<mode_t> socketMode;
  std::optional<uint32_t> ringSize;
  std::optional<uint64_t> segmentArena;
  std::optional<uint64_t> planStore;
  std::optional<spdlog::level::level_enum> logLevel;
  std::optional<std::string> controlGroup;  // a group's name or number
  std::optional<std::string> fleet;          // redis://host:port/db
  std::optional<std::string> fleetNode;
  std::optional<std::string> fleetStream;
  std::optional<std::string> fleetUser;      // the file only
  std::optional<std::string> fleetPassword;  // the file only
  std::optional<std::string> fleetTlsCaFile;
  std::optional<std::string> fleetTlsCertFile;
  std::optional<std::string> fleetTlsKeyFile;
  std::optional<std::string> fleetTlsServerName;
  std::optional<std::string> fleetOnGap;     // purge_all or log
  std::optional<uint64_t> fleetMaxEntries;
  std::optional<uint64_t> fleetQueue;
  std::optional<std::string> stateDir;
  std::optional<std::string> metrics;  // ADDRESS:PORT
};

// The fleet's values (fleet_* and state_dir): they change only at a restart.
struct FleetSettings {
  std::string url;       // fleet; empty: no fleet
  std::string node;      // empty: the host name
  std::string stream = "esi:purges";
  std::string user;
  std::string password;
  std::string tlsCaFile;      // empty: the system's CAs
  std::string tlsCertFile;    // empty: no client certificate
  std::string tlsKeyFile;
  std::string tlsServerName;  // empty: the URL's host
  std::string onGap = "purge_all";
  uint64_t maxEntries = 100000;
  uint64_t queue = 10000;
  std::string stateDir = "/var/lib/esid";

  bool operator==(const FleetSettings&) const = default;
};

// The values esid runs with.
struct Settings {
  std::string socketPath = "/run/esid/esid.sock";
  std::string socketGroup;  // empty: esid's own group
  std::optional<mode_t> socketMode;  // empty: kDefaultSocketMode
  uint32_t ringSize = 1u << 20;
  uint64_t segmentArena = uint64_t{256} << 20;  // the gzip segments of plans
  uint64_t planStore = uint64_t{64} << 20;      // the default plan zone
  spdlog::level::level_enum logLevel = spdlog::level::info;
  std::string controlGroup;  // empty: none
  FleetSettings fleet;  // read at start only
  std::string metrics;  // ADDRESS:PORT of GET /metrics; empty: none

  // Defaults, overridden by file, overridden by commandLine.
  static Settings resolve(const SettingsLayer& file, const SettingsLayer& commandLine);
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

// "purge_all" or "log" (fleet_on_gap).  Throws std::invalid_argument.
std::string parseGapAction(std::string_view text);

// A decimal number in [low, high]; what names it in messages.  Throws
// std::invalid_argument.
uint64_t parseCount(std::string_view text, std::string_view what, uint64_t low, uint64_t high);

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

}  // namespace esi
