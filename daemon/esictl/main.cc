// esictl: the operator's view of a running esid.

#include <grp.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <termios.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <functional>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <capnp/message.h>
#include <capnp/serialize.h>
#include <kj/io.h>
#include <nlohmann/json.hpp>

#include "esi.capnp.h"
#include "esictl/reply.h"

namespace {

using Clock = std::chrono::steady_clock;

constexpr int kAnswerTimeoutMs = 5000;
constexpr size_t kMaxReplyBytes = 16 << 20;

// A failure the user can act on; printed as one line, exit code 1.  Also
// what parseControlReply throws, so that no answer is returned from inside
// a try block (see reply.cc).
using Failure = esi::ControlFailure;

int fail(const std::string& message) {
  std::fprintf(stderr, "esictl: %s\n", message.c_str());
  return 1;
}

// "group www-data" for the socket's group, or its number.
std::string socketGroup(const std::string& path) {
  struct stat st;
  if (stat(path.c_str(), &st) != 0) return "the socket's group";
  group g{};
  group* found = nullptr;
  char names[4096];  // a group too large for it is shown by number
  if (getgrgid_r(st.st_gid, &g, names, sizeof(names), &found) == 0 && found != nullptr) {
    return std::string("group ") + g.gr_name;
  }
  return "gid " + std::to_string(st.st_gid);
}

// Called every kTickMs while a command without a time limit runs.
using Tick = std::function<void()>;
constexpr int kTickMs = 250;

// Reads until EOF, waiting at most kAnswerTimeoutMs for each piece; with a
// tick, as long as esid takes (a purge is bounded by the worker's
// esi_purge_timeout, after which esid answers with an error).
std::vector<char> readAll(int fd, const std::string& socketPath, const Tick& tick) {
  std::vector<char> bytes;
  char buffer[4096];
  for (;;) {
    pollfd p{fd, POLLIN, 0};
    const int ready = poll(&p, 1, tick ? kTickMs : kAnswerTimeoutMs);
    if (ready == 0 && tick) {
      tick();
      continue;
    }
    if (ready == 0) {
      throw Failure("esid at " + socketPath + " did not answer within " +
                    std::to_string(kAnswerTimeoutMs / 1000) +
                    " s (is it starting, or stopped while systemd holds its socket?)");
    }
    if (ready < 0) {
      if (errno == EINTR) continue;
      throw Failure(std::string("poll: ") + std::strerror(errno));
    }
    const ssize_t n = read(fd, buffer, sizeof(buffer));
    if (n == 0) return bytes;
    if (n < 0) {
      if (errno == EINTR) continue;
      throw Failure("reading esid's answer: " + std::string(std::strerror(errno)));
    }
    bytes.insert(bytes.end(), buffer, buffer + n);
    if (bytes.size() > kMaxReplyBytes) throw Failure("esid's answer is implausibly large");
  }
}

// Sends one control command and returns esid's JSON answer.
nlohmann::json ask(const std::string& socketPath, const std::string& command,
                   const Tick& tick = nullptr) {
  const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) throw Failure(std::string("socket: ") + std::strerror(errno));
  kj::AutoCloseFd owned(fd);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (socketPath.size() >= sizeof(addr.sun_path)) throw Failure("socket path too long: " + socketPath);
  std::memcpy(addr.sun_path, socketPath.c_str(), socketPath.size() + 1);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    const int err = errno;
    switch (err) {
      case ENOENT:
        throw Failure("esid is not running: no socket at " + socketPath);
      case ECONNREFUSED:
        throw Failure("esid is not running: nothing listens on " + socketPath);
      case EACCES:
        throw Failure("permission denied on " + socketPath + ": run as root or as a member of " +
                      socketGroup(socketPath));
      default:
        throw Failure("cannot connect to esid at " + socketPath + ": " + std::strerror(err));
    }
  }

  capnp::MallocMessageBuilder message;
  auto hello = message.initRoot<esi::wire::Hello>();
  hello.setVersion(esi::wire::PROTOCOL_VERSION);
  hello.setControl(command);
  try {
    capnp::writeMessageToFd(fd, message);
  } catch (const kj::Exception& e) {
    throw Failure("esid at " + socketPath + " closed the connection: " +
                  e.getDescription().cStr());
  }

  const std::vector<char> bytes = readAll(fd, socketPath, tick);
  if (bytes.empty()) {
    throw Failure("esid at " + socketPath + " closed the connection without answering");
  }
  return esi::parseControlReply(bytes.data(), bytes.size());
}

// ---------------------------------------------------------------------------
// stats

int stats(const std::string& socketPath, bool json, bool prometheus) {
  if (prometheus) {
    // esid renders the page, as for GET /metrics.
    std::fputs(ask(socketPath, "metrics").value("text", "").c_str(), stdout);
    return 0;
  }
  const nlohmann::json body = ask(socketPath, "stats");
  if (json) {
    std::printf("%s\n", body.dump().c_str());
  } else {
    for (const auto& [name, value] : body.items()) {
      std::printf("%s %s\n", name.c_str(), value.dump().c_str());
    }
  }
  return 0;
}

// ---------------------------------------------------------------------------
// top

volatile sig_atomic_t stopRequested = 0;

void onStopSignal(int) { stopRequested = 1; }

// Puts the terminal in non-canonical, no-echo mode so that a single "q"
// quits; restores it, and the cursor, however top ends.
class TerminalMode {
 public:
  explicit TerminalMode(bool interactive) {
    if (interactive && isatty(STDIN_FILENO) && tcgetattr(STDIN_FILENO, &saved_) == 0) {
      termios raw = saved_;
      raw.c_lflag &= ~(ICANON | ECHO);
      raw.c_cc[VMIN] = 0;
      raw.c_cc[VTIME] = 0;
      restore_ = tcsetattr(STDIN_FILENO, TCSANOW, &raw) == 0;
    }
    if (interactive) std::fputs("\x1b[?25l", stdout);  // hide the cursor
    interactive_ = interactive;
  }
  ~TerminalMode() {
    if (restore_) tcsetattr(STDIN_FILENO, TCSANOW, &saved_);
    if (interactive_) std::fputs("\x1b[?25h", stdout);
    std::fflush(stdout);
  }
  TerminalMode(const TerminalMode&) = delete;
  TerminalMode& operator=(const TerminalMode&) = delete;

  bool readsKeys() const { return restore_; }

 private:
  termios saved_{};
  bool restore_ = false;
  bool interactive_ = false;
};

struct Snapshot {
  Clock::time_point at;
  nlohmann::json stats;

  uint64_t get(const char* key) const {
    const auto it = stats.find(key);
    return it != stats.end() && it->is_number_unsigned() ? it->get<uint64_t>() : 0;
  }
};

Snapshot snapshot(const std::string& socketPath) {
  nlohmann::json body = ask(socketPath, "stats");
  return Snapshot{Clock::now(), std::move(body)};
}

std::string humanBytes(double bytes) {
  static constexpr const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  size_t unit = 0;
  while (bytes >= 1024 && unit + 1 < std::size(kUnits)) {
    bytes /= 1024;
    ++unit;
  }
  char text[32];
  std::snprintf(text, sizeof(text), unit == 0 ? "%.0f %s" : "%.1f %s", bytes, kUnits[unit]);
  return text;
}

// One screen: rates between two snapshots, totals and gauges of the later.
std::string render(const std::string& socketPath, const Snapshot& before, const Snapshot& now,
                   bool interactive) {
  const double seconds =
      std::chrono::duration<double>(now.at - before.at).count();
  // A counter that went down means esid restarted between the snapshots.
  bool restarted = false;
  for (const char* key : {"connections", "streams", "bytes", "includes", "errors"}) {
    restarted = restarted || now.get(key) < before.get(key);
  }

  std::string out;
  char line[160];
  const std::time_t wall = std::time(nullptr);
  char clock[16];
  std::tm local{};
  localtime_r(&wall, &local);
  std::strftime(clock, sizeof(clock), "%H:%M:%S", &local);
  std::snprintf(line, sizeof(line), "esid on %s at %s%s\n\n", socketPath.c_str(), clock,
                interactive ? "    (q quits)" : "");
  out += line;
  std::snprintf(line, sizeof(line), "%-20s %14s %14s\n", "", "per second", "total");
  out += line;

  struct Row {
    const char* label;
    const char* key;
    bool bytes;
  };
  for (const Row& row : {Row{"streams", "streams", false}, Row{"includes", "includes", false},
                         Row{"bytes parsed", "bytes", true}, Row{"errors", "errors", false},
                         Row{"warnings", "warnings", false},
                         Row{"ring full", "ring_full", false}}) {
    const uint64_t total = now.get(row.key);
    std::string rate = "-";
    if (!restarted && seconds > 0) {
      const double perSecond = static_cast<double>(total - before.get(row.key)) / seconds;
      if (row.bytes) {
        rate = humanBytes(perSecond);
      } else {
        char text[32];
        std::snprintf(text, sizeof(text), "%.1f", perSecond);
        rate = text;
      }
    }
    const std::string totalText =
        row.bytes ? humanBytes(static_cast<double>(total)) : std::to_string(total);
    std::snprintf(line, sizeof(line), "%-20s %14s %14s\n", row.label, rate.c_str(),
                  totalText.c_str());
    out += line;
  }
  std::snprintf(line, sizeof(line), "\n%-20s %14llu\n%-20s %14llu\n", "active connections",
                static_cast<unsigned long long>(now.get("active_connections")),
                "active streams", static_cast<unsigned long long>(now.get("active_streams")));
  out += line;
  if (restarted) out += "\nesid restarted: rates resume with the next refresh\n";
  return out;
}

// Waits up to `timeout`; false when the user asked to quit (q or a signal).
bool waitOrQuit(std::chrono::milliseconds timeout, bool readKeys) {
  const auto deadline = Clock::now() + timeout;
  while (!stopRequested) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    if (left.count() <= 0) return true;
    pollfd p{STDIN_FILENO, POLLIN, 0};
    const int ready = poll(&p, readKeys ? 1 : 0, static_cast<int>(left.count()));
    if (ready > 0) {
      char key = 0;
      if (read(STDIN_FILENO, &key, 1) == 1 && (key == 'q' || key == 'Q')) return false;
    }
  }
  return false;
}

int top(const std::string& socketPath, int iterations, double interval) {
  // Scripted use (--once, --iterations, or output not to a terminal) prints
  // plain frames one after another; otherwise the screen is redrawn in place.
  const bool interactive = iterations == 0 && isatty(STDOUT_FILENO);
  struct sigaction action {};
  action.sa_handler = onStopSignal;  // no SA_RESTART: poll returns at once
  sigaction(SIGINT, &action, nullptr);
  sigaction(SIGTERM, &action, nullptr);
  const auto period = std::chrono::milliseconds(static_cast<long>(interval * 1000));

  TerminalMode terminal(interactive);
  std::optional<Snapshot> before;
  std::string problem;
  for (int frame = 0; iterations == 0 || frame < iterations;) {
    try {
      Snapshot now = snapshot(socketPath);
      if (before) {
        const std::string screen = render(socketPath, *before, now, interactive);
        if (interactive) {
          std::printf("\x1b[H\x1b[2J%s", screen.c_str());
        } else {
          std::printf("%s%s", frame > 0 ? "\n" : "", screen.c_str());
        }
        std::fflush(stdout);
        ++frame;
      }
      before = std::move(now);
      problem.clear();
    } catch (const Failure& e) {
      // Interactive top rides out an esid restart; a script learns at once.
      if (!interactive) throw;
      if (problem != e.what()) {
        problem = e.what();
        std::printf("\x1b[H\x1b[2J%s\nwaiting for esid...    (q quits)\n", problem.c_str());
        std::fflush(stdout);
      }
      before.reset();
    }
    if (iterations != 0 && frame >= iterations) break;
    if (!waitOrQuit(period, terminal.readsKeys())) break;
  }
  return 0;
}

// Each zone esid indexes for purges: its directory, how much of its index
// is known, and the progress of a scan under way.
int zones(const std::string& socketPath, bool json) {
  const nlohmann::json body = ask(socketPath, "zones");
  if (json) {
    std::printf("%s\n", body.dump().c_str());
    return 0;
  }
  if (body.empty()) {
    std::printf("no zones: no NGINX worker has announced an esi_cache_purge zone\n");
  }
  for (const auto& [name, zone] : body.items()) {
    std::printf("%s %s: %s, %llu keys, %llu files, index %llu of %llu bytes, %llu keys in doubt, "
                "%llu scans, %llu purges",
                name.c_str(), zone["path"].get<std::string>().c_str(),
                zone["complete"].get<bool>() ? "complete" : "incomplete",
                zone["keys"].get<unsigned long long>(), zone["files"].get<unsigned long long>(),
                zone["index_bytes"].get<unsigned long long>(),
                zone["index_bytes_max"].get<unsigned long long>(),
                zone["keys_in_doubt"].get<unsigned long long>(),
                zone["scans"].get<unsigned long long>(), zone["purges"].get<unsigned long long>());
    if (zone["scanning"].get<bool>()) {
      std::printf(", scanning (%llu files read)", zone["scan_files_read"].get<unsigned long long>());
    }
    if (zone.value("matching", false)) std::printf(", matching a pattern purge");
    const std::string error = zone["last_scan_error"].get<std::string>();
    if (!error.empty()) std::printf(", last scan failed: %s", error.c_str());
    std::printf("\n");
  }
  return 0;
}

// The files esid's index lists for one key of a zone: what a purge of the
// key would remove without reading the zone's directory.
int variants(const std::string& socketPath, const std::string& zone, const std::string& key,
             bool json) {
  const nlohmann::json body = ask(socketPath, "variants " + zone + " " + key);
  if (json) {
    std::printf("%s\n", body.dump().c_str());
    return 0;
  }
  if (!body["known"].get<bool>()) {
    std::printf("%s %s: not known to the index (its next purge reads the zone)\n",
                zone.c_str(), key.c_str());
    return 0;
  }
  std::printf("%s %s: %zu file(s)\n", zone.c_str(), key.c_str(), body["files"].size());
  for (const auto& file : body["files"]) std::printf("%s\n", file.get<std::string>().c_str());
  return 0;
}

// Parse plans esid keeps per esi_plan_zone: their counters and, for one
// zone, its most recently used plans.
void printPlanZone(const std::string& name, const nlohmann::json& zone) {
  std::printf("%s: %llu plans, %llu of %llu bytes (%llu of them gzip segments), %llu hits, "
              "%llu misses, %llu drops, %llu recorded, %llu evictions, %llu too large, "
              "%llu purged\n",
              name.c_str(), zone["entries"].get<unsigned long long>(),
              zone["bytes"].get<unsigned long long>(), zone["max_bytes"].get<unsigned long long>(),
              zone.value("segment_bytes", 0ULL),
              zone["hits"].get<unsigned long long>(), zone["misses"].get<unsigned long long>(),
              zone["drops"].get<unsigned long long>(), zone["recorded"].get<unsigned long long>(),
              zone["evictions"].get<unsigned long long>(),
              zone["too_large"].get<unsigned long long>(), zone.value("purged", 0ULL));
}

// A cached response's Date as "2026-11-30 12:00:00 UTC".
std::string utcTime(uint64_t seconds) {
  const std::time_t t = static_cast<std::time_t>(seconds);
  std::tm tm{};
  char text[32];
  if (gmtime_r(&t, &tm) == nullptr ||
      std::strftime(text, sizeof(text), "%Y-%m-%d %H:%M:%S UTC", &tm) == 0) {
    return std::to_string(seconds);
  }
  return text;
}

int plans(const std::string& socketPath, const std::string& zone, bool json) {
  const nlohmann::json body = ask(socketPath, zone.empty() ? "plans" : "plans " + zone);
  if (json) {
    std::printf("%s\n", body.dump().c_str());
    return 0;
  }
  if (zone.empty()) {
    if (body.empty()) std::printf("no plan zones: no NGINX worker has planned a cache hit yet\n");
    for (const auto& [name, stats] : body.items()) printPlanZone(name, stats);
    return 0;
  }
  printPlanZone(zone, body["zone"]);
  const auto& entries = body["entries"];
  for (const auto& entry : entries) {
    std::printf("%s: stored %s, file %llu bytes, %llu steps, plan %llu bytes "
                "(%llu gzip segments, %llu bytes), %llu hits\n",
                entry["key"].get<std::string>().c_str(),
                utcTime(entry["modified"].get<uint64_t>() / 1000000000).c_str(),
                entry["length"].get<unsigned long long>(), entry["steps"].get<unsigned long long>(),
                entry["bytes"].get<unsigned long long>(), entry.value("segments", 0ULL),
                entry.value("segment_bytes", 0ULL), entry["hits"].get<unsigned long long>());
  }
  const auto total = body["zone"]["entries"].get<unsigned long long>();
  if (total > entries.size()) {
    std::printf("(%llu less recently used plans not shown)\n",
                total - static_cast<unsigned long long>(entries.size()));
  }
  return 0;
}

// While a purge waits for a scan of its zone, a bar on a terminal's stderr:
// the share of the zone's first-level directories walked, and files read.
class ScanProgressBar {
 public:
  ScanProgressBar(std::string socketPath, std::string zone)
      : socketPath_(std::move(socketPath)), zone_(std::move(zone)),
        enabled_(isatty(STDERR_FILENO)) {}
  ~ScanProgressBar() {
    if (drawn_) std::fputs("\r\x1b[K", stderr);
  }
  ScanProgressBar(const ScanProgressBar&) = delete;
  ScanProgressBar& operator=(const ScanProgressBar&) = delete;

  void update() {
    if (!enabled_) return;
    nlohmann::json zones;
    try {
      zones = ask(socketPath_, "zones");
    } catch (const Failure&) {
      return;  // the purge's own answer says what went wrong
    }
    const auto it = zones.find(zone_);
    if (it == zones.end() || !(*it)["scanning"].get<bool>()) return;
    const auto dirs = (*it)["scan_dirs"].get<unsigned long long>();
    const auto entered = (*it)["scan_dirs_entered"].get<unsigned long long>();
    const double done = dirs ? std::min(1.0, static_cast<double>(entered ? entered - 1 : 0) /
                                                 static_cast<double>(dirs))
                             : 0.0;
    constexpr int kWidth = 30;
    const int filled = static_cast<int>(done * kWidth);
    std::fprintf(stderr, "\r\x1b[Kscanning %s [%s%s] %3.0f%%, %llu files read", zone_.c_str(),
                 std::string(static_cast<size_t>(filled), '#').c_str(),
                 std::string(static_cast<size_t>(kWidth - filled), '.').c_str(), done * 100,
                 (*it)["scan_files_read"].get<unsigned long long>());
    drawn_ = true;
  }

 private:
  const std::string socketPath_;
  const std::string zone_;
  const bool enabled_;
  bool drawn_ = false;
};

// Has a live NGINX worker purge a key (with every Vary variant), a prefix, a
// tag or a tag pattern, exactly as an HTTP purge would: esid relays the order.
// With fleet, says what became of the purge in esid's fleet; with wait > 0,
// then prints each node's count as it applies it, until every node seen
// recently has, or wait seconds pass (exit 1, naming the nodes missing).
int purge(const std::string& socketPath, const std::string& zone, const std::string& kind,
          const std::string& value, bool json, bool fleet, double wait) {
  ScanProgressBar bar(socketPath, zone);
  const std::string command = std::string(fleet && wait > 0 ? "fleet purge " : "purge ") + zone +
                              " " + kind + " " + value;
  const nlohmann::json body = ask(socketPath, command, [&bar] { bar.update(); });
  if (json) {
    std::printf("%s\n", body.dump().c_str());
    return 0;
  }
  const char* what = kind == "key"      ? "exact"
                     : kind == "prefix" ? "wildcard"
                                        : kind.c_str();  // tag, pattern
  std::printf("%s purge of \"%s\" in %s: %llu file(s) removed, %s\n", what, value.c_str(),
              zone.c_str(), body["count"].get<unsigned long long>(),
              body["scanned"].get<bool>() ? "zone directory read" : "via variant index");
  if (!fleet) return 0;
  const std::string status = body.value("fleet", "");
  std::printf("fleet: %s\n", status.empty() ? "none (esid has no fleet)" : status.c_str());
  std::fflush(stdout);
  const std::string uid = body.value("fleet_uid", "");
  if (wait <= 0 || uid.empty()) return status.empty() || status == "refused" ? 1 : 0;

  std::vector<std::string> expected;
  const nlohmann::json nodes = ask(socketPath, "fleet")["nodes"];
  for (const auto& node : nodes) {
    if (node.value("recent", false)) expected.push_back(node.value("node", ""));
  }
  std::vector<std::string> seen;
  const auto deadline = Clock::now() + std::chrono::milliseconds(static_cast<int64_t>(wait * 1000));
  for (;;) {
    const nlohmann::json acks = ask(socketPath, "fleet acks " + uid)["acks"];
    for (const auto& [node, count] : acks.items()) {
      if (std::find(seen.begin(), seen.end(), node) != seen.end()) continue;
      seen.push_back(node);
      std::printf("%s: %s file(s)\n", node.c_str(), count.get<std::string>().c_str());
      std::fflush(stdout);
    }
    std::vector<std::string> missing;
    for (const std::string& node : expected) {
      if (std::find(seen.begin(), seen.end(), node) == seen.end()) missing.push_back(node);
    }
    if (missing.empty()) return 0;
    if (Clock::now() >= deadline) {
      std::string names;
      for (const std::string& node : missing) names += " " + node;
      std::printf("not applied within %g s by:%s\n", wait, names.c_str());
      return 1;
    }
    poll(nullptr, 0, 100);
  }
}

// ---------------------------------------------------------------------------
// log

// One trace entry as a line: when, what, and what became of it.
void printEntry(const nlohmann::json& entry, bool json) {
  if (json) {
    std::printf("%s\n", entry.dump().c_str());
    return;
  }
  const int64_t ms = entry.value("ms", int64_t{0});
  const std::time_t seconds = static_cast<std::time_t>(ms / 1000);
  std::tm local{};
  localtime_r(&seconds, &local);
  char clock[16];
  std::strftime(clock, sizeof(clock), "%H:%M:%S", &local);
  // Escaped: a URL's control characters must not forge lines.
  const std::string url = nlohmann::json(entry.value("url", "")).dump();
  if (entry.value("kind", "") == "purge") {
    const std::string error = entry.value("error", "");
    const std::string why = error.empty() ? "" : " error=" + nlohmann::json(error).dump();
    std::printf("%s.%03lld purge %s %s zone=%s files=%llu path=%s time=%lluus%s\n", clock,
                static_cast<long long>(ms % 1000), entry.value("how", "").c_str(), url.c_str(),
                entry.value("zone", "").c_str(), entry.value("files", 0ULL),
                entry.value("path", "").c_str(), entry.value("micros", 0ULL), why.c_str());
    return;
  }
  std::printf("%s.%03lld page %u %s %s fragments=%llu bytes=%llu time=%lluus\n", clock,
              static_cast<long long>(ms % 1000), entry.value("status", 0U),
              entry.value("how", "").c_str(), url.c_str(), entry.value("fragments", 0ULL),
              entry.value("bytes", 0ULL), entry.value("micros", 0ULL));
}

// Prints what esid traced, as varnishlog does: with dump, what the ring
// holds now; else from now on until interrupted.  esid never waits for
// esictl: entries overwritten before esictl asked are counted as missed.
int traceLog(const std::string& socketPath, const std::string& prefix, unsigned status,
             bool dump, bool json) {
  const std::string filter = " " + std::to_string(status) + (prefix.empty() ? "" : " " + prefix);
  uint64_t after = dump ? 0 : ask(socketPath, "log now").value("last", uint64_t{0});
  if (!dump) {
    signal(SIGINT, onStopSignal);
    signal(SIGTERM, onStopSignal);
    std::fprintf(stderr, "esictl: following esid's trace after entry %llu (^C stops)\n",
                 static_cast<unsigned long long>(after));
  }
  do {
    const nlohmann::json body = ask(socketPath, "log " + std::to_string(after) + filter);
    const uint64_t missed = body.value("missed", uint64_t{0});
    if (missed != 0 && json) {
      std::printf("%s\n", nlohmann::json{{"missed", missed}}.dump().c_str());
    } else if (missed != 0) {
      std::printf("# %llu entries missed: overwritten before esictl read them\n",
                  static_cast<unsigned long long>(missed));
    }
    for (const auto& entry : body["entries"]) printEntry(entry, json);
    std::fflush(stdout);
    after = body.value("last", after);
    if (dump) break;
    poll(nullptr, 0, kTickMs);
  } while (stopRequested == 0);
  return 0;
}

// The fleet as esid sees it: this node, and each node's last heartbeat.
int fleet(const std::string& socketPath, bool json) {
  const nlohmann::json body = ask(socketPath, "fleet");
  if (json) {
    std::printf("%s\n", body.dump().c_str());
    return 0;
  }
  const nlohmann::json& stats = body["stats"];
  std::printf("node %s on %s of %s%s: %s, last applied %s, lag %llu entries, %llu pending, "
              "%llu gap(s)\n",
              body.value("node", "").c_str(), body.value("stream", "").c_str(),
              body.value("redis", "").c_str(), body.value("tls", false) ? " (TLS)" : "",
              body.value("connected", false) ? "connected" : "Redis unreachable",
              body.value("last", "").c_str(), stats.value("fleet_lag_entries", 0ULL),
              stats.value("fleet_pending", 0ULL), stats.value("fleet_gaps", 0ULL));
  if (!body.value("last_gap", "").empty()) {
    std::printf("purges lost: %s\n", body.value("last_gap", "").c_str());
  }
  if (!body.value("waiting_at", "").empty()) {
    std::printf("waiting at entry %s: no NGINX worker here serves zone \"%s\" now\n",
                body.value("waiting_at", "").c_str(), body.value("waiting_zone", "").c_str());
  }
  if (body.contains("stream_entries")) {
    std::printf("stream: %llu entries kept of %llu added, last %s\n",
                body.value("stream_entries", 0ULL), body.value("stream_entries_added", 0ULL),
                body.value("stream_last", "").c_str());
  }
  std::printf("%-24s %-22s %12s %10s %9s %7s %s\n", "NODE", "LAST APPLIED", "LAG ENTRIES",
              "APPLIED", "PENDING", "GAPS", "SEEN");
  for (const auto& node : body["nodes"]) {
    const unsigned long long ago = node.value("seen_ms_ago", 0ULL);
    std::printf("%-24s %-22s %12llu %10llu %9llu %7llu %s\n", node.value("node", "").c_str(),
                node.value("last", "").c_str(), node.value("lag_entries", 0ULL),
                node.value("applied", 0ULL), node.value("pending", 0ULL),
                node.value("gaps", 0ULL),
                node.value("recent", false) ? "now" : (std::to_string(ago / 1000) + " s ago").c_str());
  }
  return 0;
}

}  // namespace

// Every error, CLI11's setup included, ends as one line naming the cause.
int main(int argc, char** argv) try {
  CLI::App app{"esictl: inspect a running esid, purge through it"};
  std::string socketPath = "/run/esid/esid.sock";
  app.add_option("--socket", socketPath, "esid's Unix socket")->capture_default_str();
  app.set_version_flag("--version", "esictl " ESI_VERSION);
  app.require_subcommand(1);

  auto* statsCommand = app.add_subcommand("stats", "Counters: streams, bytes, includes, errors");
  bool json = false, prometheus = false;
  auto* jsonFlag = statsCommand->add_flag("--json", json, "Print one JSON object");
  statsCommand->add_flag("--prometheus", prometheus, "Print Prometheus text exposition format")
      ->excludes(jsonFlag);

  auto* topCommand =
      app.add_subcommand("top", "Live rates: streams/s, includes/s, bytes/s, errors (q quits)");
  int iterations = 0;
  double interval = 1.0;
  bool once = false;
  auto* onceFlag = topCommand->add_flag("--once", once, "Print one frame and exit");
  topCommand->add_option("--iterations,-n", iterations, "Print this many frames and exit")
      ->check(CLI::PositiveNumber)
      ->excludes(onceFlag);
  topCommand->add_option("--interval,-d", interval, "Seconds between refreshes")
      ->capture_default_str()
      ->check(CLI::Range(0.1, 3600.0));
  auto* zonesCommand =
      app.add_subcommand("zones", "Cache zones indexed for purges, and scans under way");
  bool zonesJson = false;
  zonesCommand->add_flag("--json", zonesJson, "Print one JSON object");
  auto* variantsCommand =
      app.add_subcommand("variants", "Files the variant index lists for one key of a zone");
  std::string variantsZone, variantsKey;
  bool variantsJson = false;
  variantsCommand->add_option("zone", variantsZone, "proxy_cache zone name")->required();
  variantsCommand->add_option("key", variantsKey, "cache key, as proxy_cache_key makes it")
      ->required();
  variantsCommand->add_flag("--json", variantsJson, "Print one JSON object");
  auto* plansCommand =
      app.add_subcommand("plans", "Parse plans per esi_plan_zone; with a zone, its plans");
  std::string plansZone;
  bool plansJson = false;
  plansCommand->add_option("zone", plansZone, "esi_plan_zone name");
  plansCommand->add_flag("--json", plansJson, "Print one JSON object");
  auto* purgeCommand = app.add_subcommand(
      "purge",
      "Purge a key and every Vary variant of it (or a prefix, a tag, a tag pattern) through NGINX");
  std::string purgeZone, purgeValue;
  bool purgePrefix = false, purgeTag = false, purgePattern = false, purgeJson = false;
  purgeCommand->add_option("zone", purgeZone, "proxy_cache zone name")->required();
  purgeCommand->add_option("key", purgeValue, "cache key, as proxy_cache_key makes it (or the "
                                              "prefix, the tag, the pattern)")
      ->required();
  auto* prefixFlag = purgeCommand->add_flag("--prefix", purgePrefix,
                                            "Purge every key starting with KEY");
  auto* tagFlag =
      purgeCommand->add_flag("--tag", purgeTag, "Purge every object tagged KEY (Surrogate-Key, xkey)")
          ->excludes(prefixFlag);
  purgeCommand
      ->add_flag("--pattern", purgePattern,
                 "Purge every object whose tags, joined with commas, the RE2 pattern KEY finds "
                 "(as X-Magento-Tags-Pattern)")
      ->excludes(prefixFlag)
      ->excludes(tagFlag);
  purgeCommand->add_flag("--json", purgeJson, "Print one JSON object");
  bool purgeFleet = false;
  double purgeWait = 0;
  auto* fleetFlag = purgeCommand->add_flag(
      "--fleet", purgeFleet, "Say whether the purge went out to esid's fleet (published, pending)");
  purgeCommand->add_option("--wait", purgeWait,
                           "With --fleet: wait up to SECONDS for every node to apply it, "
                           "printing each node's count")
      ->needs(fleetFlag);
  auto* fleetCommand = app.add_subcommand(
      "fleet", "The fleet: this node's place on the stream, and every node's");
  bool fleetJson = false;
  fleetCommand->add_flag("--json", fleetJson, "Print one JSON object");
  auto* logCommand = app.add_subcommand(
      "log", "What esid does, page by page and purge by purge, from now on (as varnishlog)");
  std::string logPrefix;
  unsigned logStatus = 0;
  bool logDump = false, logJson = false;
  logCommand->add_option("--prefix", logPrefix, "Only URLs (purges: keys) starting with this");
  logCommand->add_option("--status", logStatus, "Only pages NGINX answered with this status")
      ->check(CLI::Range(100u, 999u));
  logCommand->add_flag("--dump", logDump, "Print what esid holds now and exit");
  logCommand->add_flag("--json", logJson, "One JSON object per entry");
  CLI11_PARSE(app, argc, argv);

  if (*statsCommand) return stats(socketPath, json, prometheus);
  if (*zonesCommand) return zones(socketPath, zonesJson);
  if (*variantsCommand) return variants(socketPath, variantsZone, variantsKey, variantsJson);
  if (*plansCommand) return plans(socketPath, plansZone, plansJson);
  if (*purgeCommand) {
    const char* kind = purgePattern ? "pattern" : purgeTag ? "tag" : purgePrefix ? "prefix" : "key";
    return purge(socketPath, purgeZone, kind, purgeValue, purgeJson, purgeFleet, purgeWait);
  }
  if (*fleetCommand) return fleet(socketPath, fleetJson);
  if (*logCommand) return traceLog(socketPath, logPrefix, logStatus, logDump, logJson);
  if (*topCommand) return top(socketPath, once ? 1 : iterations, interval);
  return 1;
} catch (const std::exception& e) {
  return fail(e.what());
}
