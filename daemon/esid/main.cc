// esid: the ESI daemon beside NGINX.  Wires the subsystems together; each of
// them lives in its own library.

#include <signal.h>
#include <uv.h>

#include <cstdio>
#include <string>

#include <CLI/CLI.hpp>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include "control/control.h"
#include "engine/stats.h"
#include "transport/server.h"
#include "variants/purger.h"

namespace {

struct Signals {
  uv_signal_t term;
  uv_signal_t interrupt;
  esi::Purger* purger;
};

void onStop(uv_signal_t* handle, int signum) {
  auto* server = static_cast<esi::Server*>(handle->data);
  spdlog::info("signal {}: shutting down", signum);
  server->close();
  auto* signals = reinterpret_cast<Signals*>(handle->loop->data);
  signals->purger->close();
  uv_close(reinterpret_cast<uv_handle_t*>(&signals->term), nullptr);
  uv_close(reinterpret_cast<uv_handle_t*>(&signals->interrupt), nullptr);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"esid: Edge Side Includes daemon for NGINX"};
  esi::ServerOptions options;
  options.socketPath = "/run/esid/esid.sock";
  std::string level = "info";
  app.add_option("--socket", options.socketPath,
                 "Unix socket to listen on (unused under systemd socket activation)")
      ->capture_default_str();
  app.add_option("--ring-size", options.ringSize,
                 "Bytes of each shared-memory ring per NGINX worker (a power of two)")
      ->capture_default_str()
      ->check(CLI::Range(256u << 10, 64u << 20));
  app.add_option("--log-level", level, "trace, debug, info, warn, error or off")
      ->capture_default_str()
      ->check(CLI::IsMember({"trace", "debug", "info", "warn", "error", "critical", "off"}));
  app.set_version_flag("--version", "esid " ESI_VERSION);
  CLI11_PARSE(app, argc, argv);
  if ((options.ringSize & (options.ringSize - 1)) != 0) {
    std::fprintf(stderr, "esid: --ring-size must be a power of two\n");
    return 2;
  }

  spdlog::set_default_logger(spdlog::stderr_color_st("esid"));
  spdlog::set_level(spdlog::level::from_str(level));
  spdlog::set_pattern("%Y-%m-%d %H:%M:%S.%e %l %v");
  signal(SIGPIPE, SIG_IGN);

  uv_loop_t* loop = uv_default_loop();
  esi::Stats stats;
  esi::Purger purger(loop);
  esi::Control control(stats, purger);
  esi::Server server(loop, options, stats, purger,
                     [&control](std::string_view command, const esi::PeerCredentials& peer) {
                       return control.handle(command, peer);
                     });
  try {
    server.listen();
  } catch (const std::exception& e) {
    spdlog::critical("{}", e.what());
    return 1;
  }

  Signals signals;
  signals.purger = &purger;
  loop->data = &signals;
  for (uv_signal_t* handle : {&signals.term, &signals.interrupt}) {
    uv_signal_init(loop, handle);
    handle->data = &server;
  }
  uv_signal_start(&signals.term, onStop, SIGTERM);
  uv_signal_start(&signals.interrupt, onStop, SIGINT);

  spdlog::info("esid {} listening on {}", ESI_VERSION, server.describe());
  uv_run(loop, UV_RUN_DEFAULT);
  uv_loop_close(loop);
  spdlog::info("esid stopped");
  return 0;
}
