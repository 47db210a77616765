// esid: the ESI daemon beside NGINX.  Wires the subsystems together; each of
// them lives in its own library.

#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>
#include <uv.h>

#include <cstdio>
#include <optional>
#include <string>

#include <CLI/CLI.hpp>
#include <spdlog/spdlog.h>

#include "control/control.h"
#include "engine/stats.h"
#include "esid/logging.h"
#include "esid/settings.h"
#include "fleet/fleet.h"
#include "http/metrics_endpoint.h"
#include "plans/plan_store.h"
#include "segments/segment_arena.h"
#include "trace/trace_ring.h"
#include "transport/server.h"
#include "variants/purger.h"

namespace {

// What SIGHUP needs: where the settings came from and what to apply them to.
struct Reload {
  std::string configPath;  // empty: no --config, nothing to re-read
  esi::SettingsLayer commandLine;
  esi::Settings current;
  esi::Server* server;
  esi::Control* control;
  esi::PlanStore* plans;
};

// The settings were checked when read; a group deleted since allows nobody.
std::optional<gid_t> controlGroup(const esi::Settings& settings) {
  if (settings.controlGroup.empty()) return std::nullopt;
  try {
    return esi::parseGroup(settings.controlGroup);
  } catch (const std::invalid_argument& e) {
    spdlog::error("control_group: {}; only root and esid's user may control esid", e.what());
    return std::nullopt;
  }
}

struct Signals {
  uv_signal_t term;
  uv_signal_t interrupt;
  uv_signal_t hangup;
  esi::Purger* purger;
  esi::Fleet* fleet = nullptr;
  esi::MetricsEndpoint* metrics = nullptr;
};

void onStop(uv_signal_t* handle, int signum) {
  auto* server = static_cast<esi::Server*>(handle->data);
  spdlog::info("signal {}: shutting down", signum);
  server->close();
  auto* signals = reinterpret_cast<Signals*>(handle->loop->data);
  signals->purger->close();
  if (signals->fleet != nullptr) signals->fleet->stop();
  if (signals->metrics != nullptr) signals->metrics->close();
  uv_close(reinterpret_cast<uv_handle_t*>(&signals->term), nullptr);
  uv_close(reinterpret_cast<uv_handle_t*>(&signals->interrupt), nullptr);
  uv_close(reinterpret_cast<uv_handle_t*>(&signals->hangup), nullptr);
}

// Logs the values of the file that the command line overrides.
void logOverrides(const esi::SettingsLayer& file, const esi::SettingsLayer& commandLine) {
  if (file.socketPath && commandLine.socketPath) {
    spdlog::info("--socket overrides socket in the config file");
  }
  if (file.socketGroup && commandLine.socketGroup) {
    spdlog::info("--socket-group overrides socket_group in the config file");
  }
  if (file.socketMode && commandLine.socketMode) {
    spdlog::info("--socket-mode overrides socket_mode in the config file");
  }
  if (file.ringSize && commandLine.ringSize) {
    spdlog::info("--ring-size overrides ring_size in the config file");
  }
  if (file.segmentArena && commandLine.segmentArena) {
    spdlog::info("--segment-arena overrides segment_arena in the config file");
  }
  if (file.planStore && commandLine.planStore) {
    spdlog::info("--plan-store overrides plan_store in the config file");
  }
  if (file.logLevel && commandLine.logLevel) {
    spdlog::info("--log-level overrides log_level in the config file");
  }
  if (file.controlGroup && commandLine.controlGroup) {
    spdlog::info("--control-group overrides control_group in the config file");
  }
  if (file.fleet && commandLine.fleet) {
    spdlog::info("--fleet overrides fleet in the config file");
  }
  if (file.fleetNode && commandLine.fleetNode) {
    spdlog::info("--fleet-node overrides fleet_node in the config file");
  }
  if (file.stateDir && commandLine.stateDir) {
    spdlog::info("--state-dir overrides state_dir in the config file");
  }
  if (file.metrics && commandLine.metrics) {
    spdlog::info("--metrics overrides metrics in the config file");
  }
}

// The fleet's options from the settings; nullopt without a fleet.  Throws
// std::invalid_argument saying what is wrong.
std::optional<esi::FleetOptions> fleetOptions(const esi::Settings& settings) {
  const esi::FleetSettings& fleet = settings.fleet;
  if (fleet.url.empty()) return std::nullopt;
  esi::FleetOptions options;
  options.redis = esi::parseRedisUrl(fleet.url);
  options.redis.user = fleet.user;
  options.redis.password = fleet.password;
  options.redis.tlsCaFile = fleet.tlsCaFile;
  options.redis.tlsCertFile = fleet.tlsCertFile;
  options.redis.tlsKeyFile = fleet.tlsKeyFile;
  options.redis.tlsServerName = fleet.tlsServerName;
  const bool tlsSet = !fleet.tlsCaFile.empty() || !fleet.tlsCertFile.empty() ||
                      !fleet.tlsKeyFile.empty() || !fleet.tlsServerName.empty();
  if (tlsSet && !options.redis.tls) {
    throw std::invalid_argument("fleet_tls_* are set but fleet is " + options.redis.text() +
                                ": write rediss:// for TLS");
  }
  options.node = fleet.node;
  if (options.node.empty()) {
    char host[256] = {};
    gethostname(host, sizeof(host) - 1);
    options.node = host;
  }
  if (!esi::validNodeName(options.node)) {
    throw std::invalid_argument("fleet_node \"" + options.node +
                                "\": 1 to 255 letters, digits and .-_: please");
  }
  if (fleet.stream.empty() || fleet.stream.size() > 200) {
    throw std::invalid_argument("fleet_stream: 1 to 200 bytes");
  }
  options.stream = fleet.stream;
  options.stateDir = fleet.stateDir;
  options.onGap = fleet.onGap == "log" ? esi::GapAction::kLog : esi::GapAction::kPurgeAll;
  options.maxEntries = fleet.maxEntries;
  options.queueLimit = fleet.queue;
  return options;
}

// SIGHUP: re-reads the config file and applies what changed.  Running streams
// and connections are left alone; a bad file changes nothing.
void onHangup(uv_signal_t* handle, int) {
  auto* reload = static_cast<Reload*>(handle->data);
  if (reload->configPath.empty()) {
    spdlog::info("SIGHUP: esid was started without --config; nothing to reload");
    return;
  }
  esi::SettingsLayer file;
  try {
    file = esi::readSettingsFile(reload->configPath);
  } catch (const std::exception& e) {
    spdlog::error("SIGHUP: {}; keeping the current settings", e.what());
    return;
  }
  esi::Settings next = esi::Settings::resolve(file, reload->commandLine);
  if (next.socketPath != reload->current.socketPath) {
    spdlog::warn("SIGHUP: the socket changes only when esid restarts; still on {}",
                 reload->server->describe());
    next.socketPath = reload->current.socketPath;
  }
  if (next.socketGroup != reload->current.socketGroup ||
      next.socketMode.value_or(esi::kDefaultSocketMode) !=
          reload->current.socketMode.value_or(esi::kDefaultSocketMode)) {
    spdlog::warn("SIGHUP: the socket's group and mode change only when esid restarts; "
                 "still {}", reload->server->describe());
    next.socketGroup = reload->current.socketGroup;
    next.socketMode = reload->current.socketMode;
  }
  if (next.segmentArena != reload->current.segmentArena) {
    spdlog::warn("SIGHUP: the segment arena's size changes only when esid restarts; "
                 "still {} bytes", reload->current.segmentArena);
    next.segmentArena = reload->current.segmentArena;
  }
  if (next.fleet != reload->current.fleet) {
    spdlog::warn("SIGHUP: the fleet's settings (fleet, fleet_*, state_dir) change only when "
                 "esid restarts");
    next.fleet = reload->current.fleet;
  }
  if (next.metrics != reload->current.metrics) {
    spdlog::warn("SIGHUP: metrics changes only when esid restarts; still {}",
                 reload->current.metrics.empty() ? "off" : reload->current.metrics);
    next.metrics = reload->current.metrics;
  }
  const auto changes = esi::describeChanges(reload->current, next);
  if (changes.empty()) {
    spdlog::info("SIGHUP: {} re-read, nothing changed", reload->configPath);
    return;
  }
  // Say what changed at the more verbose of the two levels, so that the
  // change is logged whichever way the level goes.
  spdlog::set_level(std::min(reload->current.logLevel, next.logLevel));
  spdlog::info("SIGHUP: {} re-read", reload->configPath);
  logOverrides(file, reload->commandLine);
  for (const auto& change : changes) spdlog::info("SIGHUP: {}", change);
  if (next.ringSize != reload->current.ringSize) {
    spdlog::info("SIGHUP: the new ring size applies to workers that connect from now on");
  }
  spdlog::set_level(next.logLevel);
  reload->server->setRingSize(next.ringSize);
  reload->control->allowGroup(controlGroup(next));
  reload->plans->setDefaultZoneBytes(next.planStore);
  reload->current = next;
}

}  // namespace

// An exception nothing else caught ends esid with its message rather than
// std::terminate's abort.
int main(int argc, char** argv) try {
  CLI::App app{"esid: Edge Side Includes daemon for NGINX"};
  std::string configPath, socketPath, socketGroup, socketMode, ringSize, segmentArena, planStore,
      level, group, fleetUrl, fleetNode, stateDir, metrics;
  bool checkOnly = false;
  app.add_option("--config", configPath,
                 "Settings file (key = value), re-read on SIGHUP; flags override it")
      ->check(CLI::ExistingFile);
  auto* socketOption = app.add_option(
      "--socket", socketPath,
      "Unix socket to listen on (unused under systemd socket activation) "
      "[default: /run/esid/esid.sock]");
  auto* socketGroupOption = app.add_option(
      "--socket-group", socketGroup,
      "Group of the socket esid creates, NGINX's user's (www-data on Debian); "
      "ignored under socket activation [default: esid's own]");
  auto* socketModeOption = app.add_option(
      "--socket-mode", socketMode,
      "Octal mode of the socket esid creates, never world-writable; ignored "
      "under socket activation [default: 0660]");
  auto* ringOption = app.add_option(
      "--ring-size", ringSize,
      "Bytes of each shared-memory ring per NGINX worker: a power of two from "
      "256K to 64M [default: 1M]");
  auto* arenaOption = app.add_option(
      "--segment-arena", segmentArena,
      "Bytes of the arena holding plans' gzip segments (esi_stitch), shared "
      "read-only with every NGINX worker: at least 1M, K/M/G suffixes [default: 256M]");
  auto* planStoreOption = app.add_option(
      "--plan-store", planStore,
      "Bytes of the default plan zone, where locations without esi_plan_zone "
      "keep their plans and segments: at least 64K, K/M/G suffixes [default: 64M]");
  auto* levelOption = app.add_option(
      "--log-level", level, "trace, debug, info, warn, error, critical or off [default: info]");
  auto* groupOption = app.add_option(
      "--control-group", group,
      "Members of this group may use esictl, besides root and esid's own user");
  auto* fleetOption = app.add_option(
      "--fleet", fleetUrl,
      "Share purges with every esid of the fleet through this Redis: redis://host:port/db "
      "(credentials only in the settings file: fleet_user, fleet_password)");
  auto* fleetNodeOption = app.add_option(
      "--fleet-node", fleetNode, "This node's name in the fleet [default: the host name]");
  auto* stateDirOption = app.add_option(
      "--state-dir", stateDir,
      "Where esid keeps what must survive it: its position on the fleet's stream "
      "[default: /var/lib/esid]");
  auto* metricsOption = app.add_option(
      "--metrics", metrics,
      "Serve Prometheus metrics at http://ADDRESS:PORT/metrics, e.g. 127.0.0.1:9145; any "
      "address is taken, so keep it on loopback or behind a firewall [default: off]");
  app.add_flag("--check-config", checkOnly, "Check the settings, print them and exit");
  app.set_version_flag("--version", "esid " ESI_VERSION);
  CLI11_PARSE(app, argc, argv);

  esi::SettingsLayer commandLine, file;
  try {
    if (socketOption->count() > 0) commandLine.socketPath = socketPath;
    if (socketGroupOption->count() > 0) {
      esi::parseGroup(socketGroup);
      commandLine.socketGroup = socketGroup;
    }
    if (socketModeOption->count() > 0) {
      commandLine.socketMode = esi::parseSocketMode(socketMode);
    }
    if (ringOption->count() > 0) commandLine.ringSize = esi::parseRingSize(ringSize);
    if (arenaOption->count() > 0) {
      commandLine.segmentArena = esi::parseSegmentArena(segmentArena);
    }
    if (planStoreOption->count() > 0) commandLine.planStore = esi::parsePlanStore(planStore);
    if (levelOption->count() > 0) commandLine.logLevel = esi::parseLogLevel(level);
    if (groupOption->count() > 0) {
      esi::parseGroup(group);
      commandLine.controlGroup = group;
    }
    if (fleetOption->count() > 0) {
      esi::parseRedisUrl(fleetUrl);  // refuses credentials on the command line
      commandLine.fleet = fleetUrl;
    }
    if (fleetNodeOption->count() > 0) commandLine.fleetNode = fleetNode;
    if (stateDirOption->count() > 0) commandLine.stateDir = stateDir;
    if (metricsOption->count() > 0) commandLine.metrics = esi::parseMetricsAddress(metrics);
    if (!configPath.empty()) file = esi::readSettingsFile(configPath);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "esid: %s\n", e.what());
    return 2;
  }
  const esi::Settings settings = esi::Settings::resolve(file, commandLine);
  std::optional<esi::FleetOptions> fleetSettings;
  try {
    fleetSettings = fleetOptions(settings);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "esid: %s\n", e.what());
    return 2;
  }
  if (checkOnly) {
    std::printf("socket = %s\nsocket_group = %s\nsocket_mode = %s\nring_size = %u\n"
                "segment_arena = %llu\nplan_store = %llu\nlog_level = %s\n"
                "control_group = %s\nfleet = %s\nfleet_node = %s\nfleet_stream = %s\n"
                "fleet_user = %s\nfleet_password = %s\nfleet_on_gap = %s\n"
                "fleet_max_entries = %llu\nfleet_queue = %llu\nstate_dir = %s\nmetrics = %s\n",
                settings.socketPath.c_str(),
                settings.socketGroup.empty() ? "(none)" : settings.socketGroup.c_str(),
                esi::socketModeName(settings.socketMode.value_or(esi::kDefaultSocketMode)).c_str(),
                settings.ringSize,
                static_cast<unsigned long long>(settings.segmentArena),
                static_cast<unsigned long long>(settings.planStore),
                esi::logLevelName(settings.logLevel).c_str(),
                settings.controlGroup.empty() ? "(none)" : settings.controlGroup.c_str(),
                fleetSettings ? fleetSettings->redis.text().c_str() : "(none)",
                fleetSettings ? fleetSettings->node.c_str() : "(none)",
                settings.fleet.stream.c_str(),
                settings.fleet.user.empty() ? "(none)" : settings.fleet.user.c_str(),
                settings.fleet.password.empty() ? "(none)" : "(set)",
                settings.fleet.onGap.c_str(),
                static_cast<unsigned long long>(settings.fleet.maxEntries),
                static_cast<unsigned long long>(settings.fleet.queue),
                settings.fleet.stateDir.c_str(),
                settings.metrics.empty() ? "(off)" : settings.metrics.c_str());
    return 0;
  }

  esi::setUpLogging(settings.logLevel);
  logOverrides(file, commandLine);
  struct stat configStat;
  if (!settings.fleet.password.empty() && stat(configPath.c_str(), &configStat) == 0 &&
      (configStat.st_mode & S_IROTH) != 0) {
    spdlog::warn("{} holds fleet_password and every local user may read it: chmod o-r it",
                 configPath);
  }
  signal(SIGPIPE, SIG_IGN);

  esi::ServerOptions options;
  options.socketPath = settings.socketPath;
  options.socketMode = settings.socketMode;
  if (!settings.socketGroup.empty()) {
    // The name was checked when read; here it becomes a gid.
    try {
      options.socketGroup = esi::parseGroup(settings.socketGroup);
    } catch (const std::invalid_argument& e) {
      spdlog::critical("socket_group: {}", e.what());
      return 2;
    }
    options.socketGroupName = settings.socketGroup;
  }
  options.ringSize = settings.ringSize;

  uv_loop_t* loop = uv_default_loop();
  esi::Stats stats;
  esi::Purger purger(loop);
  esi::PurgeOrders orders;
  // Before the plans, whose segments it holds.
  std::optional<esi::SegmentArena> arena;
  try {
    arena.emplace(settings.segmentArena);
  } catch (const std::exception& e) {
    spdlog::critical("cannot create the segment arena: {}", e.what());
    return 1;
  }
  esi::PlanStore plans(settings.planStore);
  esi::TraceRing trace;
  esi::Control control(stats, purger, orders, plans, *arena);
  control.allowGroup(controlGroup(settings));
  control.setTrace(&trace);
  esi::Server server(loop, options, stats, purger, orders, plans, *arena,
                     [&control](std::string_view command, const esi::PeerCredentials& peer,
                                const esi::ControlAnswerFn& answer) {
                       control.handle(command, peer, answer);
                     });
  server.setTrace(&trace);
  control.setServer(&server);
  std::optional<esi::MetricsEndpoint> metricsEndpoint;
  if (!settings.metrics.empty()) {
    metricsEndpoint.emplace(loop, esi::parseListenAddress(settings.metrics),
                            [&control] { return control.metrics(); });
  }
  std::optional<esi::Fleet> fleet;
  if (fleetSettings) {
    fleet.emplace(
        loop, *fleetSettings,
        [&orders](const esi::PurgeQuery& query, const esi::Fleet::Applied& done) {
          orders.order(query,
                       [done](const esi::PurgeOrderOutcome& o) { done(o.count, o.error); },
                       esi::PurgeOrderOptions{true, false});
        },
        [&orders] { return orders.zones(); });
    orders.onServes([&fleet] { fleet->workersChanged(); });
    server.setPurgeFeed([&fleet](const esi::PurgeQuery& query, const esi::PurgeOutcome& outcome,
                                 bool askAcks) {
      const esi::Publication p = fleet->published(query, outcome.files.size(), askAcks);
      return esi::FleetNote{p.status, p.uid};
    });
    control.setFleet(&*fleet);
  }
  // Before the socket listens: a client that connects may stop esid at once
  // (systemd, a test), and the default action would kill it.
  Reload reload{configPath, commandLine, settings, &server, &control, &plans};
  Signals signals;
  signals.purger = &purger;
  signals.fleet = fleet ? &*fleet : nullptr;
  signals.metrics = metricsEndpoint ? &*metricsEndpoint : nullptr;
  loop->data = &signals;
  for (uv_signal_t* handle : {&signals.term, &signals.interrupt, &signals.hangup}) {
    uv_signal_init(loop, handle);
    handle->data = &server;
  }
  signals.hangup.data = &reload;
  uv_signal_start(&signals.term, onStop, SIGTERM);
  uv_signal_start(&signals.interrupt, onStop, SIGINT);
  uv_signal_start(&signals.hangup, onHangup, SIGHUP);

  try {
    server.listen();
    if (metricsEndpoint) metricsEndpoint->listen();
    if (fleet) fleet->start();
  } catch (const std::exception& e) {
    spdlog::critical("{}", e.what());
    return 1;
  }
  if (metricsEndpoint) {
    spdlog::info("metrics: http://{}/metrics", metricsEndpoint->describe());
  }
  if (fleet) {
    spdlog::info("fleet: node {} on {} of {} (fleet_on_gap = {}, state in {})",
                 fleetSettings->node, fleetSettings->stream, fleetSettings->redis.text(),
                 settings.fleet.onGap, settings.fleet.stateDir);
  }

  spdlog::info("esid {} listening on {} (ring size {}, segment arena {}, plan store {}, "
               "log level {}{}{})",
               ESI_VERSION, server.describe(), settings.ringSize, settings.segmentArena,
               settings.planStore,
               esi::logLevelName(settings.logLevel),
               configPath.empty() ? "" : ", settings from ", configPath);
  uv_run(loop, UV_RUN_DEFAULT);
  uv_loop_close(loop);
  spdlog::info("esid stopped");
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "esid: %s\n", e.what());
  return 1;
}
