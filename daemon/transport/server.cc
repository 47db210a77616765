#include "transport/server.h"

#include <fcntl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <vector>

#include <capnp/message.h>
#include <capnp/serialize.h>
#include <spdlog/spdlog.h>

#include "esi.capnp.h"
#include "base/private_dir.h"
#include "transport/worker_session.h"

namespace esi {

namespace {

constexpr size_t kMaxHelloBytes = size_t{64} * 1024;
constexpr int kSystemdFirstFd = 3;

// The listening socket systemd handed us, if any (sd_listen_fds(3)).
int inheritedSocket() {
  const char* pid = std::getenv("LISTEN_PID");
  const char* fds = std::getenv("LISTEN_FDS");
  if (pid == nullptr || fds == nullptr) return -1;
  if (std::strtol(pid, nullptr, 10) != getpid() || std::strtol(fds, nullptr, 10) < 1) {
    return -1;
  }
  unsetenv("LISTEN_PID");
  unsetenv("LISTEN_FDS");
  unsetenv("LISTEN_FDNAMES");
  return kSystemdFirstFd;
}

// The directory of esid's socket must be esid's alone (private_dir.h): esid
// removes a stale socket, binds and gives the socket its group by path.  A
// directory that does not exist is left to bind to report.
void requirePrivateSocketDirectory(const std::string& path) {
  const size_t slash = path.rfind('/');
  const std::string dir = slash == std::string::npos ? "."
                          : slash == 0               ? "/"
                                                     : path.substr(0, slash);
  struct stat st;
  if (stat(dir.c_str(), &st) == 0) requirePrivateDirectory("socket directory", dir, st);
}

// Gives the socket esid bound at path to group gid.  fchown on the
// listening socket would change the socket, not its file, so the file is
// opened without following a link, checked to be a socket of esid's, and
// that very file changed: whatever the path names by then.
void giveSocket(const std::string& path, gid_t gid, const std::string& groupName) {
  UniqueFd file(open(path.c_str(), O_PATH | O_NOFOLLOW | O_CLOEXEC));
  struct stat st;
  if (!file || fstat(file.get(), &st) != 0 || !S_ISSOCK(st.st_mode) || st.st_uid != geteuid()) {
    throw std::runtime_error(path + " is no longer the socket esid bound: something replaced "
                             "it before esid could give it to group " + groupName);
  }
  if (fchownat(file.get(), "", static_cast<uid_t>(-1), gid, AT_EMPTY_PATH) != 0) {
    throw std::runtime_error("cannot give " + path + " to group " + groupName + ": " +
                             std::strerror(errno) +
                             " (esid must run as root or as a member of the group)");
  }
}

// True when something already accepts connections on path.
bool socketAnswers(const std::string& path) {
  UniqueFd fd(socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, path.c_str(), sizeof(addr.sun_path) - 1);
  return connect(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
}

}  // namespace

class Server::Client {
 public:
  explicit Client(Server& server) : server_(server), pipe_(new uv_pipe_t) {
    uv_pipe_init(server.loop_, pipe_, 0);
    pipe_->data = this;
  }
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  ~Client() {
    session_.reset();
    endSilence();
    if (!closing_) {
      uv_close(reinterpret_cast<uv_handle_t*>(pipe_),
               [](uv_handle_t* h) { delete reinterpret_cast<uv_pipe_t*>(h); });
    }
  }

  uv_pipe_t* pipe() { return pipe_; }

  void forget(const std::vector<Md5>& files) {
    if (session_ && !closing_) session_->sendForget(files);
  }

  void catchUp() {
    if (session_ && !closing_) session_->catchUp();
  }

  // A worker's rings; nothing for esictl's connections.
  WorkerSession::RingUse ringUse() const {
    return session_ && !closing_ ? session_->ringUse() : WorkerSession::RingUse{};
  }

  // Reads the hello, which must come within helloTimeoutMs.
  void start() {
    uv_read_start(reinterpret_cast<uv_stream_t*>(pipe_), onAlloc, onRead);
    ++server_.silent_;
    deadline_ = new uv_timer_t;
    uv_timer_init(server_.loop_, deadline_);
    deadline_->data = this;
    uv_timer_start(deadline_, [](uv_timer_t* t) { static_cast<Client*>(t->data)->silentTooLong(); },
                   server_.options_.helloTimeoutMs, 0);
  }

  void close() {
    if (closing_) return;
    endSilence();
    closing_ = true;
    if (session_) session_->shutdown();
    uv_read_stop(reinterpret_cast<uv_stream_t*>(pipe_));
    uv_close(reinterpret_cast<uv_handle_t*>(pipe_), [](uv_handle_t* h) {
      auto* self = static_cast<Client*>(h->data);
      auto* pipe = reinterpret_cast<uv_pipe_t*>(h);
      self->server_.remove(self);
      delete pipe;
    });
  }

 private:
  static void onAlloc(uv_handle_t* h, size_t, uv_buf_t* buf) {
    auto* self = static_cast<Client*>(h->data);
    buf->base = self->readBuffer_;
    buf->len = sizeof(self->readBuffer_);
  }

  static void onRead(uv_stream_t* stream, ssize_t nread, const uv_buf_t* buf) {
    auto* self = static_cast<Client*>(stream->data);
    if (nread < 0) {
      if (nread != UV_EOF) spdlog::debug("client: {}", uv_strerror(static_cast<int>(nread)));
      if (self->session_) self->session_->drainReports();
      self->close();
      return;
    }
    if (self->session_ || self->answered_) {
      spdlog::error("client sent bytes after its hello; closing it");
      self->close();
      return;
    }
    self->inbox_.insert(self->inbox_.end(), buf->base, buf->base + nread);
    self->readHello();
  }

  void readHello() {
    if (inbox_.size() < 8) return;
    uint32_t table[2];
    std::memcpy(table, inbox_.data(), sizeof(table));
    const size_t total = 8 + size_t{table[1]} * sizeof(capnp::word);
    if (table[0] != 0 || total > kMaxHelloBytes) {
      spdlog::error("client hello is not a single-segment message of at most {} bytes", kMaxHelloBytes);
      close();
      return;
    }
    if (inbox_.size() < total) return;
    if (inbox_.size() > total) {
      spdlog::error("client sent bytes after its hello; closing it");
      close();
      return;
    }

    endSilence();  // whether esid takes it or not
    kj::Array<capnp::word> words = kj::heapArray<capnp::word>(total / sizeof(capnp::word));
    std::memcpy(words.begin(), inbox_.data(), total);
    inbox_.clear();
    try {
      capnp::FlatArrayMessageReader reader(words);
      auto hello = reader.getRoot<wire::Hello>();
      if (hello.getVersion() != wire::PROTOCOL_VERSION) {
        spdlog::error("client speaks protocol {}, esid speaks {}; closing it",
                      hello.getVersion(), wire::PROTOCOL_VERSION);
        close();
        return;
      }
      switch (hello.which()) {
        case wire::Hello::ATTACH:
          attach();
          return;
        case wire::Hello::CONTROL:
          control(std::string(hello.getControl().cStr()));
          return;
      }
      spdlog::error("client hello of an unknown kind; closing it");
    } catch (const kj::Exception& e) {
      spdlog::error("malformed client hello: {}", e.getDescription().cStr());
    }
    close();
  }

  void silentTooLong() {
    spdlog::warn("closing a connection that said no hello within {:g} s",
                 static_cast<double>(server_.options_.helloTimeoutMs) / 1000);
    close();
  }

  // It said its hello, or goes: its deadline and its place among the
  // silent go.
  void endSilence() {
    if (deadline_ == nullptr) return;
    uv_close(reinterpret_cast<uv_handle_t*>(deadline_),
             [](uv_handle_t* h) { delete reinterpret_cast<uv_timer_t*>(h); });
    deadline_ = nullptr;
    --server_.silent_;
  }

  void attach() {
    int fd = -1;
    uv_fileno(reinterpret_cast<uv_handle_t*>(pipe_), &fd);
    try {
      session_ = std::make_shared<WorkerSession>(
          server_.loop_, fd, server_.options_.ringSize, server_.stats_,
          server_.purger_, server_.orders_, server_.plans_, server_.arena_,
          [this](std::string_view) { close(); },
          [&server = server_](const std::vector<Md5>& files) { server.purged(files); },
          server_.feed_);
      session_->setTrace(server_.trace_);
    } catch (const std::exception& e) {
      spdlog::error("cannot set up rings for a worker: {}", e.what());
      close();
      return;
    }
    if (!session_->start()) {
      close();
      return;
    }
    spdlog::info("worker attached");
  }

  void control(const std::string& command) {
    answered_ = true;
    int fd = -1;
    uv_fileno(reinterpret_cast<uv_handle_t*>(pipe_), &fd);
    ucred cred{};
    socklen_t len = sizeof(cred);
    if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) {
      reply(ControlAnswer{false, "cannot read peer credentials"});
      return;
    }
    PeerCredentials peer{cred.pid, cred.uid, cred.gid, {}};
    // NGROUPS_MAX is 65536; a first guess fits nearly everyone.
    peer.groups.resize(64);
    socklen_t groupsLen = static_cast<socklen_t>(peer.groups.size() * sizeof(gid_t));
    if (getsockopt(fd, SOL_SOCKET, SO_PEERGROUPS, peer.groups.data(), &groupsLen) != 0 &&
        errno == ERANGE) {
      peer.groups.resize(groupsLen / sizeof(gid_t));
      getsockopt(fd, SOL_SOCKET, SO_PEERGROUPS, peer.groups.data(), &groupsLen);
    }
    peer.groups.resize(groupsLen / sizeof(gid_t));
    std::weak_ptr<Client*> alive = alive_;
    server_.control_(command, peer,
                     [alive](const ControlAnswer& answer) {
                       if (auto self = alive.lock()) (*self)->reply(answer);
                     });
  }

  void reply(const ControlAnswer& answer) {
    if (closing_) return;
    capnp::MallocMessageBuilder message;
    auto reply = message.initRoot<wire::ControlReply>();
    reply.setOk(answer.ok);
    reply.setBody(answer.body);
    reply_ = capnp::messageToFlatArray(message);
    uv_buf_t buf = uv_buf_init(reinterpret_cast<char*>(reply_.begin()),
                               static_cast<unsigned>(reply_.size() * sizeof(capnp::word)));
    write_.data = this;
    uv_write(&write_, reinterpret_cast<uv_stream_t*>(pipe_), &buf, 1,
             [](uv_write_t* req, int) { static_cast<Client*>(req->data)->close(); });
  }

  Server& server_;
  uv_pipe_t* pipe_;
  uv_timer_t* deadline_ = nullptr;  // until the hello
  bool closing_ = false;
  bool answered_ = false;
  char readBuffer_[4096] = {};
  std::vector<char> inbox_;
  std::shared_ptr<WorkerSession> session_;
  // A late control answer finds the client through this, or finds it gone.
  std::shared_ptr<Client*> alive_ = std::make_shared<Client*>(this);
  kj::Array<capnp::word> reply_;
  uv_write_t write_;
};

Server::Server(uv_loop_t* loop, ServerOptions options, Stats& stats,
               Purger& purger, PurgeOrders& orders, PlanStore& plans,
               SegmentArena& arena, ControlHandler control)
    : loop_(loop), options_(std::move(options)), stats_(stats), purger_(purger),
      orders_(orders), plans_(plans), arena_(arena), control_(std::move(control)) {}

Server::~Server() { close(); }

void Server::purged(const std::vector<Md5>& files) {
  plans_.purged(files);
  for (const auto& client : clients_) client->forget(files);
}

void Server::listen() {
  listener_ = new uv_pipe_t;
  uv_pipe_init(loop_, listener_, 0);
  listener_->data = this;

  if (int fd = inheritedSocket(); fd >= 0) {
    if (int rc = uv_pipe_open(listener_, fd); rc != 0) {
      throw std::runtime_error(std::string("cannot use the socket systemd passed: ") + uv_strerror(rc));
    }
    where_ = "socket from systemd (fd 3)";
    if (options_.socketGroup || options_.socketMode) {
      spdlog::info("socket_group and socket_mode are ignored: systemd passed the socket, "
                   "so its unit's SocketGroup= and SocketMode= decide");
    }
  } else {
    const std::string& path = options_.socketPath;
    requirePrivateSocketDirectory(path);
    struct stat st;
    if (lstat(path.c_str(), &st) == 0) {
      if (!S_ISSOCK(st.st_mode)) {
        throw std::runtime_error(path + " exists and is not a socket");
      }
      if (socketAnswers(path)) {
        throw std::runtime_error("another esid is already listening on " + path);
      }
      unlink(path.c_str());
    }
    // The socket is born with its mode, so nothing sets one by path.  Its
    // group is esid's until giveSocket changes it, but nobody can connect
    // before uv_listen below.
    const mode_t mode = options_.socketMode.value_or(0660);
    const mode_t old = umask(~mode & 0777);
    const int rc = uv_pipe_bind(listener_, path.c_str());
    umask(old);
    if (rc != 0) {
      throw std::runtime_error("cannot bind " + path + ": " + uv_strerror(rc));
    }
    ownsPath_ = true;
    if (options_.socketGroup) giveSocket(path, *options_.socketGroup, options_.socketGroupName);
    where_ = fmt::format("{}, mode {:04o}{}{}", path, mode,
                         options_.socketGroup ? ", group " : "", options_.socketGroupName);
  }

  if (int rc = uv_listen(reinterpret_cast<uv_stream_t*>(listener_), SOMAXCONN, onConnection);
      rc != 0) {
    throw std::runtime_error(std::string("cannot listen: ") + uv_strerror(rc));
  }
}

void Server::close() {
  if (listener_ != nullptr) {
    uv_close(reinterpret_cast<uv_handle_t*>(listener_),
             [](uv_handle_t* h) { delete reinterpret_cast<uv_pipe_t*>(h); });
    listener_ = nullptr;
    if (ownsPath_) unlink(options_.socketPath.c_str());
  }
  // Clients remove themselves once their handles are closed.
  for (auto& client : clients_) client->close();
}

void Server::onConnection(uv_stream_t* listener, int status) {
  auto* self = static_cast<Server*>(listener->data);
  if (status < 0) {
    spdlog::warn("accept: {}", uv_strerror(status));
    return;
  }
  auto client = std::make_unique<Client>(*self);
  if (uv_accept(listener, reinterpret_cast<uv_stream_t*>(client->pipe())) != 0) {
    return;  // the Client's destructor closes its handle
  }
  if (self->silent_ >= self->options_.maxSilent) {
    spdlog::warn("closing a new connection at once: {} others have not said hello yet (each "
                 "may take {:g} s)", self->silent_,
                 static_cast<double>(self->options_.helloTimeoutMs) / 1000);
    return;
  }
  client->start();
  self->clients_.push_back(std::move(client));
}

void Server::remove(Client* client) {
  clients_.remove_if([client](const auto& c) { return c.get() == client; });
}

void Server::catchUp() {
  for (const auto& client : clients_) client->catchUp();
}

WorkerSession::RingUse Server::ringUse() const {
  WorkerSession::RingUse total;
  for (const auto& client : clients_) {
    const WorkerSession::RingUse use = client->ringUse();
    total.requests += use.requests;
    total.responses += use.responses;
    total.capacity += use.capacity;
  }
  return total;
}

}  // namespace esi
