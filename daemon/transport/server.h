// esid's Unix socket: bound by path or inherited from systemd, accepting
// NGINX workers (which get a WorkerSession) and esictl (which gets one
// control answer).

#pragma once

#include <sys/types.h>
#include <uv.h>

#include <cstdint>
#include <functional>
#include <list>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "engine/stats.h"
#include "plans/plan_store.h"
#include "segments/segment_arena.h"
#include "trace/trace_ring.h"
#include "transport/purge_orders.h"
#include "transport/worker_session.h"
#include "variants/purger.h"

namespace esi {

struct PeerCredentials {
  pid_t pid;
  uid_t uid;
  gid_t gid;
  std::vector<gid_t> groups;  // supplementary (SO_PEERGROUPS)
};

struct ControlAnswer {
  bool ok;
  std::string body;
};

// Answers a control command, at once or later (a purge waits for a worker);
// answer must be called exactly once, and may be after the client left.
using ControlAnswerFn = std::function<void(ControlAnswer)>;
using ControlHandler = std::function<void(std::string_view command, const PeerCredentials&,
                                          ControlAnswerFn answer)>;

// A connection must say its hello this soon after esid accepts it, and at
// most this many may be waiting to: one that connects and says nothing is
// closed, and many such cannot pile up.  Workers and esictl say theirs at
// once.
constexpr uint64_t kHelloTimeoutMs = 10000;
constexpr size_t kMaxSilentConnections = 64;

struct ServerOptions {
  // The socket esid creates: its path, group (empty: esid's own) and mode
  // (empty: 0660).  All ignored when systemd passed a socket: its unit's
  // SocketGroup= and SocketMode= decide.
  std::string socketPath;
  std::optional<gid_t> socketGroup;
  std::string socketGroupName;  // as the operator named it, for messages
  std::optional<mode_t> socketMode;
  uint32_t ringSize = 1 << 20;
  // No setting changes these; a test does.
  uint64_t helloTimeoutMs = kHelloTimeoutMs;
  size_t maxSilent = kMaxSilentConnections;
};

class Server {
 public:
  // The arena must outlive the server.
  Server(uv_loop_t* loop, ServerOptions options, Stats& stats, Purger& purger,
         PurgeOrders& orders, PlanStore& plans, SegmentArena& arena,
         ControlHandler control);
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  // Throws std::runtime_error when the socket cannot be had.
  void listen();
  // Stops accepting and ends every connection.
  void close();

  const std::string& describe() const { return where_; }

  // The ring size for workers that connect from now on; connected ones keep
  // theirs.
  void setRingSize(uint32_t bytes) { options_.ringSize = bytes; }

  // Where workers' purges are told once answered (the fleet); for workers
  // that connect from now on.
  void setPurgeFeed(PurgeFeed feed) { feed_ = std::move(feed); }

  // Where workers' pages and purges are traced (esictl log); for workers
  // that connect from now on.  Must outlive the server.
  void setTrace(TraceRing* trace) { trace_ = trace; }

  // The workers' rings: bytes waiting each way, and their size.
  WorkerSession::RingUse ringUse() const;

  // Every worker's session reads what it was written without a wake-up
  // (WorkerSession::catchUp).
  void catchUp();

 private:
  class Client;
  static void onConnection(uv_stream_t* listener, int status);
  void remove(Client* client);
  // A worker's purge removes these files: esid's plans of them go, and
  // every worker forgets what it keeps of them.
  void purged(const std::vector<Md5>& files);

  uv_loop_t* loop_;
  ServerOptions options_;
  Stats& stats_;
  Purger& purger_;
  PurgeOrders& orders_;
  PlanStore& plans_;
  SegmentArena& arena_;
  ControlHandler control_;
  PurgeFeed feed_;
  TraceRing* trace_ = nullptr;
  uv_pipe_t* listener_ = nullptr;
  bool ownsPath_ = false;
  std::string where_;
  size_t silent_ = 0;  // connections that have not said hello yet
  std::list<std::unique_ptr<Client>> clients_;
};

}  // namespace esi
