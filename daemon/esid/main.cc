// esid: the ESI daemon beside NGINX.  Wires the subsystems together; each of
// them lives in its own library.

#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>
#include <uv.h>

#include <cstdio>
#include <optional>
#include <string>
#include <vector>

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
  for (const esi::SettingSpec& spec : esi::kSettings) {
    if (file.has(spec) && commandLine.has(spec)) {
      spdlog::info("{} overrides {} in the config file", spec.flag, spec.key);
    }
  }
}

// The fleet's options from the settings; nullopt without a fleet.  Throws
// std::invalid_argument saying what is wrong.
std::optional<esi::FleetOptions> fleetOptions(const esi::Settings& settings) {
  if (settings.fleet.empty()) return std::nullopt;
  esi::FleetOptions options;
  options.redis = esi::parseRedisUrl(settings.fleet);
  options.redis.user = settings.fleetUser;
  options.redis.password = settings.fleetPassword;
  options.redis.tlsCaFile = settings.fleetTlsCaFile;
  options.redis.tlsCertFile = settings.fleetTlsCertFile;
  options.redis.tlsKeyFile = settings.fleetTlsKeyFile;
  options.redis.tlsServerName = settings.fleetTlsServerName;
  const bool tlsSet = !settings.fleetTlsCaFile.empty() || !settings.fleetTlsCertFile.empty() ||
                      !settings.fleetTlsKeyFile.empty() || !settings.fleetTlsServerName.empty();
  if (tlsSet && !options.redis.tls) {
    throw std::invalid_argument("fleet_tls_* are set but fleet is " + options.redis.text() +
                                ": write rediss:// for TLS");
  }
  options.node = settings.fleetNode;
  if (options.node.empty()) {
    char host[256] = {};
    gethostname(host, sizeof(host) - 1);
    options.node = host;
  }
  if (!esi::validNodeName(options.node)) {
    throw std::invalid_argument("fleet_node \"" + options.node +
                                "\": 1 to 255 letters, digits and .-_: please");
  }
  if (settings.fleetStream.empty() || settings.fleetStream.size() > 200) {
    throw std::invalid_argument("fleet_stream: 1 to 200 bytes");
  }
  options.stream = settings.fleetStream;
  options.stateDir = settings.stateDir;
  options.onGap = settings.fleetOnGap == "log" ? esi::GapAction::kLog : esi::GapAction::kPurgeAll;
  options.maxEntries = settings.fleetMaxEntries;
  options.queueLimit = settings.fleetQueue;
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
  std::vector<const esi::SettingSpec*> kept;
  const esi::Settings next = esi::keepUntilRestart(
      reload->current, esi::Settings::resolve(file, reload->commandLine), kept);
  for (const esi::SettingSpec* spec : kept) {
    spdlog::warn("SIGHUP: {} changes only when esid restarts; still {}", spec->key,
                 esi::showSetting(*spec, reload->current));
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
  std::string configPath;
  bool checkOnly = false;
  app.add_option("--config", configPath,
                 "Settings file (key = value), re-read on SIGHUP; flags override it")
      ->check(CLI::ExistingFile);
  std::vector<std::string> flagValues(esi::kSettings.size());
  std::vector<CLI::Option*> flags(esi::kSettings.size());
  for (size_t i = 0; i < esi::kSettings.size(); ++i) {
    const esi::SettingSpec& spec = esi::kSettings[i];
    if (spec.flag.empty()) continue;
    flags[i] = app.add_option(std::string(spec.flag), flagValues[i], std::string(spec.help));
  }
  app.add_flag("--check-config", checkOnly, "Check the settings, print them and exit");
  app.set_version_flag("--version", "esid " ESI_VERSION);
  CLI11_PARSE(app, argc, argv);

  esi::SettingsLayer commandLine, file;
  try {
    for (size_t i = 0; i < esi::kSettings.size(); ++i) {
      if (flags[i] != nullptr && flags[i]->count() > 0) {
        commandLine.set(esi::kSettings[i], flagValues[i]);
      }
    }
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
    // The fleet as esid would join it: its URL as understood, the node's name
    // found.
    esi::Settings shown = settings;
    shown.fleet = fleetSettings ? fleetSettings->redis.text() : "";
    shown.fleetNode = fleetSettings ? fleetSettings->node : "";
    for (const esi::SettingSpec& spec : esi::kSettings) {
      std::printf("%s = %s\n", std::string(spec.key).c_str(),
                  esi::showSetting(spec, shown).c_str());
    }
    return 0;
  }

  esi::setUpLogging(settings.logLevel);
  logOverrides(file, commandLine);
  struct stat configStat;
  if (!settings.fleetPassword.empty() && stat(configPath.c_str(), &configStat) == 0 &&
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
                 settings.fleetOnGap, settings.stateDir);
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
