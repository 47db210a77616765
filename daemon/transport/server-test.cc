// esid's listening socket: how it is made in its directory, and what it
// does with connections that do not say hello.

#include "transport/server.h"

#include <fcntl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <string>

#include <capnp/message.h>
#include <capnp/serialize.h>
#include <gtest/gtest.h>

#include "esi.capnp.h"
#include "base/unique_fd.h"

namespace esi {
namespace {

// The attacker of issue 33, who may write in the socket's directory: at the
// first call after esid bound its socket that sets a file's mode or owner,
// it swaps the socket for a link to victim.  Armed by a test.
struct Attacker {
  std::string socket;
  std::string victim;
  bool struck = false;

  void strike() {
    if (victim.empty() || struck) return;
    struck = true;
    unlink(socket.c_str());
    symlink(victim.c_str(), socket.c_str());
  }
};

Attacker attacker;

}  // namespace
}  // namespace esi

// The calls that could set the socket's mode or owner, each the attacker's
// moment, then carried out as asked (by the system call, not libc's name
// these definitions take).
extern "C" int chmod(const char* path, mode_t mode) noexcept {
  esi::attacker.strike();
  return static_cast<int>(syscall(SYS_fchmodat, AT_FDCWD, path, mode));
}

extern "C" int chown(const char* path, uid_t owner, gid_t group) noexcept {
  esi::attacker.strike();
  return static_cast<int>(syscall(SYS_fchownat, AT_FDCWD, path, owner, group, 0));
}

extern "C" int lchown(const char* path, uid_t owner, gid_t group) noexcept {
  esi::attacker.strike();
  return static_cast<int>(
      syscall(SYS_fchownat, AT_FDCWD, path, owner, group, AT_SYMLINK_NOFOLLOW));
}

extern "C" int fchownat(int dir, const char* path, uid_t owner, gid_t group, int flags) noexcept {
  esi::attacker.strike();
  return static_cast<int>(syscall(SYS_fchownat, dir, path, owner, group, flags));
}

namespace esi {
namespace {

class ServerTest : public ::testing::Test {
 protected:
  ServerTest() {
    uv_loop_init(&loop_);
    uv_timer_init(&loop_, &guard_);
    dir_ = ::testing::TempDir() + "esid-server-XXXXXX";
    if (mkdtemp(dir_.data()) == nullptr) std::abort();
    options_.socketPath = dir_ + "/esid.sock";
  }

  ~ServerTest() override {
    attacker = {};
    uv_close(reinterpret_cast<uv_handle_t*>(&guard_), nullptr);
    if (server_) {
      server_->close();
      uv_run(&loop_, UV_RUN_DEFAULT);  // the clients' handles close
      server_.reset();
    }
    uv_run(&loop_, UV_RUN_DEFAULT);
    uv_loop_close(&loop_);
  }

  Server& server() {
    if (!server_) {
      server_ = std::make_unique<Server>(
          &loop_, options_, stats_, purger_, orders_, plans_, arena_,
          [](std::string_view, const PeerCredentials&, const ControlAnswerFn& answer) {
            answer(ControlAnswer{true, "{}"});
          });
    }
    return *server_;
  }

  // A client of esid's socket: the backlog takes it before esid accepts.
  UniqueFd connectClient() {
    UniqueFd fd(socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::strncpy(addr.sun_path, options_.socketPath.c_str(), sizeof(addr.sun_path) - 1);
    EXPECT_EQ(connect(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0)
        << std::strerror(errno);
    return fd;
  }

  static void sayControlHello(int fd) {
    capnp::MallocMessageBuilder message;
    auto hello = message.initRoot<wire::Hello>();
    hello.setVersion(wire::PROTOCOL_VERSION);
    hello.setControl("stats");
    const auto words = capnp::messageToFlatArray(message);
    const auto bytes = words.asBytes();
    EXPECT_EQ(write(fd, bytes.begin(), bytes.size()), static_cast<ssize_t>(bytes.size()));
  }

  // What the client of fd sees now: "closed" by esid, "answered" (bytes
  // to read) or "open".
  static std::string state(int fd) {
    char byte;
    const ssize_t n = recv(fd, &byte, 1, MSG_PEEK | MSG_DONTWAIT);
    if (n == 0) return "closed";
    if (n > 0) return "answered";
    return errno == EAGAIN ? "open" : std::strerror(errno);
  }

  // Runs the loop until done() holds; false if it still did not after a
  // minute (a failure, not a hang).
  bool runUntil(const std::function<bool()>& done) {
    bool expired = false;
    guard_.data = &expired;
    uv_timer_start(&guard_, [](uv_timer_t* t) { *static_cast<bool*>(t->data) = true; }, 60000, 0);
    while (!done() && !expired) uv_run(&loop_, UV_RUN_ONCE);
    uv_timer_stop(&guard_);
    return !expired;
  }

  // A file of mode 0600 the attacker would have esid change.
  std::string victim() {
    const std::string path = dir_ + "/victim";
    UniqueFd fd(open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600));
    fchmod(fd.get(), 0600);
    return path;
  }

  // "socket 0640", "file 0600", "link 0777", as lstat says.
  static std::string whatIs(const std::string& path) {
    struct stat st{};
    if (lstat(path.c_str(), &st) != 0) return "nothing";
    char mode[8];
    std::snprintf(mode, sizeof(mode), "%04o", st.st_mode & 07777);
    return std::string(S_ISSOCK(st.st_mode) ? "socket " : S_ISREG(st.st_mode) ? "file " : "link ") +
           mode;
  }

  uv_loop_t loop_;
  std::string dir_;
  ServerOptions options_;
  Stats stats_;
  Purger purger_{&loop_};
  PurgeOrders orders_;
  SegmentArena arena_{SegmentArena::kMinBytes};  // before the plans it holds
  PlanStore plans_;
  std::unique_ptr<Server> server_;
  uv_timer_t guard_;
};

TEST_F(ServerTest, TheSocketIsBornWithItsModeAndNothingSetsOneByPath) {
  attacker = {options_.socketPath, victim()};
  options_.socketMode = 0640;
  server().listen();
  EXPECT_EQ(whatIs(attacker.victim), "file 0600");
  EXPECT_EQ(whatIs(options_.socketPath), "socket 0640");
}

TEST_F(ServerTest, TheSocketsGroupIsNeverGivenThroughALink) {
  attacker = {options_.socketPath, victim()};
  options_.socketGroup = getegid();
  options_.socketGroupName = "esid's own";
  server().listen();
  EXPECT_TRUE(attacker.struck);
  EXPECT_EQ(whatIs(attacker.victim), "file 0600");
}

TEST_F(ServerTest, ASocketDirectoryOthersMayWriteInIsRefused) {
  ASSERT_EQ(chmod(dir_.c_str(), 0777), 0);
  try {
    server().listen();
    ADD_FAILURE() << "esid listened in a directory of mode 0777";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("socket directory " + dir_ + " is owned by user "),
              std::string::npos)
        << e.what();
  }
  EXPECT_NE(access(options_.socketPath.c_str(), F_OK), 0);
}

TEST_F(ServerTest, AConnectionThatSaysNoHelloIsClosedAtItsDeadline) {
  options_.helloTimeoutMs = 1;
  server().listen();
  const UniqueFd silent = connectClient();
  EXPECT_TRUE(runUntil([&] { return state(silent.get()) == "closed"; }));
}

TEST_F(ServerTest, PastTheSilentCapANewConnectionIsClosedAtOnceUntilOneSaysHello) {
  options_.helloTimeoutMs = 3600 * 1000;  // never, here
  options_.maxSilent = 2;
  server().listen();
  const UniqueFd first = connectClient();
  const UniqueFd second = connectClient();
  const UniqueFd third = connectClient();
  ASSERT_TRUE(runUntil([&] { return state(third.get()) == "closed"; }));
  EXPECT_EQ(state(first.get()), "open");
  EXPECT_EQ(state(second.get()), "open");
  // A hello takes its connection out of the silent, and makes room.
  sayControlHello(first.get());
  ASSERT_TRUE(runUntil([&] { return state(first.get()) == "answered"; }));
  const UniqueFd fourth = connectClient();
  sayControlHello(fourth.get());
  EXPECT_TRUE(runUntil([&] { return state(fourth.get()) != "open"; }));
  EXPECT_EQ(state(fourth.get()), "answered");
  EXPECT_EQ(state(second.get()), "open");
}

}  // namespace
}  // namespace esi
