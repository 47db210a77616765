// esictl: the operator's view of a running esid.

#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string>

#include <CLI/CLI.hpp>
#include <capnp/message.h>
#include <capnp/serialize.h>
#include <nlohmann/json.hpp>

#include "esi.capnp.h"

namespace {

int fail(const std::string& message) {
  std::fprintf(stderr, "esictl: %s\n", message.c_str());
  return 1;
}

// Sends one control command; returns esid's answer or throws with a reason.
esi::wire::ControlReply::Reader ask(const std::string& socketPath, const std::string& command,
                              kj::Own<capnp::MessageReader>& holder) {
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) throw std::runtime_error(std::string("socket: ") + std::strerror(errno));
  kj::AutoCloseFd owned(fd);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (socketPath.size() >= sizeof(addr.sun_path)) throw std::runtime_error("socket path too long");
  std::strcpy(addr.sun_path, socketPath.c_str());
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    const int err = errno;
    std::string why = "cannot connect to esid at " + socketPath + ": " + std::strerror(err);
    if (err == ENOENT || err == ECONNREFUSED) why += " (is esid running?)";
    if (err == EACCES) why += " (run as root or as a member of the socket's group)";
    throw std::runtime_error(why);
  }

  capnp::MallocMessageBuilder message;
  auto hello = message.initRoot<esi::wire::Hello>();
  hello.setVersion(esi::wire::PROTOCOL_VERSION);
  hello.setControl(command);
  capnp::writeMessageToFd(fd, message);

  holder = kj::heap<capnp::StreamFdMessageReader>(kj::mv(owned));
  return holder->getRoot<esi::wire::ControlReply>();
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"esictl: inspect and control a running esid"};
  std::string socketPath = "/run/esid/esid.sock";
  bool json = false;
  app.add_option("--socket", socketPath, "esid's Unix socket")->capture_default_str();
  app.set_version_flag("--version", "esictl " ESI_VERSION);
  app.require_subcommand(1);
  auto* stats = app.add_subcommand("stats", "Counters: streams, bytes, includes, errors");
  stats->add_flag("--json", json, "Print one JSON object");
  CLI11_PARSE(app, argc, argv);

  try {
    kj::Own<capnp::MessageReader> holder;
    auto reply = ask(socketPath, "stats", holder);
    if (!reply.getOk()) return fail(std::string("esid refused: ") + reply.getBody().cStr());
    const auto body = nlohmann::json::parse(reply.getBody().cStr());
    if (json) {
      std::printf("%s\n", body.dump().c_str());
    } else {
      for (const auto& [name, value] : body.items()) {
        std::printf("%s %s\n", name.c_str(), value.dump().c_str());
      }
    }
    return 0;
  } catch (const kj::Exception& e) {
    return fail("esid closed the connection or answered garbage: " +
                std::string(e.getDescription().cStr()));
  } catch (const std::exception& e) {
    return fail(e.what());
  }
}
