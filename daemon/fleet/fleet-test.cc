#include "fleet/fleet.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>
#include <uv.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "fleet/entry.h"
#include "fleet/pending_queue.h"
#include "fleet/redis_link.h"
#include "fleet/state_file.h"

namespace esi {
namespace {

using Fields = std::vector<std::pair<std::string_view, std::string_view>>;

FleetEntry entry(std::string zone, PurgeQuery::Kind kind, std::string value) {
  return FleetEntry{"node-a", PurgeQuery{kind, std::move(zone), std::move(value)}, "node-a:1:7"};
}

// The fields as Redis hands them back.
std::optional<FleetEntry> roundTrip(const FleetEntry& e, std::string* why) {
  const auto encoded = encodeEntry(e);
  Fields fields;
  for (const auto& [name, value] : encoded) fields.emplace_back(name, value);
  return decodeEntry(fields, why);
}

TEST(FleetEntry, EveryKindSurvivesTheStream) {
  for (const auto kind : {PurgeQuery::Kind::kKey, PurgeQuery::Kind::kKeyPrefix,
                          PurgeQuery::Kind::kTag, PurgeQuery::Kind::kTagPattern}) {
    FleetEntry e = entry("pages", kind, "/shop/item?id=1 2");
    e.askAcks = kind == PurgeQuery::Kind::kTag;
    std::string why;
    const auto back = roundTrip(e, &why);
    ASSERT_TRUE(back) << why;
    EXPECT_EQ(back->node, "node-a");
    EXPECT_EQ(back->query.zone, "pages");
    EXPECT_EQ(back->query.kind, kind);
    EXPECT_EQ(back->query.value, "/shop/item?id=1 2");
    EXPECT_EQ(back->uid, "node-a:1:7");
    EXPECT_EQ(back->askAcks, e.askAcks);
  }
}

TEST(FleetEntry, ASoftPurgeStaysSoft) {
  FleetEntry e = entry("pages", PurgeQuery::Kind::kTag, "t1");
  std::string why;
  auto hard = roundTrip(e, &why);
  ASSERT_TRUE(hard) << why;
  EXPECT_FALSE(hard->query.soft);
  e.query.soft = true;
  auto soft = roundTrip(e, &why);
  ASSERT_TRUE(soft) << why;
  EXPECT_TRUE(soft->query.soft);
  auto fields = encodeEntry(e);
  Fields bad;
  for (const auto& [name, value] : fields) {
    bad.emplace_back(name, name == "soft" ? std::string_view("yes") : std::string_view(value));
  }
  EXPECT_FALSE(decodeEntry(bad, &why));
}

TEST(FleetEntry, AnEmptyPrefixIsAWholeZoneButAnEmptyKeyOrTagIsRefused) {
  std::string why;
  EXPECT_TRUE(roundTrip(entry("pages", PurgeQuery::Kind::kKeyPrefix, ""), &why));
  EXPECT_FALSE(roundTrip(entry("pages", PurgeQuery::Kind::kKey, ""), &why));
  EXPECT_FALSE(roundTrip(entry("pages", PurgeQuery::Kind::kTag, ""), &why));
  EXPECT_FALSE(roundTrip(entry("pages", PurgeQuery::Kind::kTagPattern, ""), &why));
}

TEST(FleetEntry, EntriesThatAreNotPurgesAreRefusedWhole) {
  const Fields good = {{"v", "1"}, {"node", "b"}, {"zone", "pages"}, {"kind", "key"},
                       {"value", "/a"}, {"uid", "b:1:1"}};
  std::string why;
  ASSERT_TRUE(decodeEntry(good, &why)) << why;

  const auto without = [&](std::string_view name) {
    Fields f;
    for (const auto& field : good) {
      if (field.first != name) f.push_back(field);
    }
    return f;
  };
  const auto with = [&](std::string_view name, std::string_view value) {
    Fields f = without(name);
    f.emplace_back(name, value);
    return f;
  };
  EXPECT_FALSE(decodeEntry(without("zone"), &why));
  EXPECT_FALSE(decodeEntry(without("v"), &why));
  EXPECT_FALSE(decodeEntry(with("v", "2"), &why));
  EXPECT_FALSE(decodeEntry(with("kind", "flushall"), &why));
  EXPECT_EQ(why, "unknown kind \"flushall\"");
  EXPECT_FALSE(decodeEntry(with("node", "a b"), &why));
  EXPECT_FALSE(decodeEntry(with("zone", "pa ges"), &why));
  EXPECT_FALSE(decodeEntry(with("zone", std::string(256, 'z')), &why));
  EXPECT_FALSE(decodeEntry(with("value", std::string(kMaxEntryValueBytes + 1, 'k')), &why));
  EXPECT_TRUE(decodeEntry(with("value", std::string(kMaxEntryValueBytes, 'k')), &why));
  EXPECT_FALSE(decodeEntry(with("value", std::string("a\0b", 3)), &why));
  EXPECT_FALSE(decodeEntry(with("ack", "yes"), &why));
  Fields extra = good;
  extra.emplace_back("command", "FLUSHALL");
  EXPECT_FALSE(decodeEntry(extra, &why));
  EXPECT_EQ(why, "unknown field \"command\"");
  Fields twice = good;
  twice.emplace_back("zone", "other");
  EXPECT_FALSE(decodeEntry(twice, &why));
}

TEST(FleetEntry, NodeNamesAreHostNames) {
  EXPECT_TRUE(validNodeName("web-1.example.org"));
  EXPECT_TRUE(validNodeName("n_2:8080"));
  EXPECT_FALSE(validNodeName(""));
  EXPECT_FALSE(validNodeName("a/b"));
  EXPECT_FALSE(validNodeName(std::string(256, 'n')));
}

TEST(StreamId, ParsesAndOrdersAsRedisDoes) {
  EXPECT_EQ(StreamId::parse("1796172032767-12"), (StreamId{1796172032767, 12}));
  EXPECT_EQ(StreamId::parse("0-0"), StreamId{});
  EXPECT_FALSE(StreamId::parse("17"));
  EXPECT_FALSE(StreamId::parse("a-1"));
  EXPECT_FALSE(StreamId::parse("1-"));
  EXPECT_FALSE(StreamId::parse("-1"));
  EXPECT_LT((StreamId{5, 9}), (StreamId{6, 0}));
  EXPECT_LT((StreamId{5, 1}), (StreamId{5, 2}));
  EXPECT_EQ((StreamId{5, 1}).text(), "5-1");
}

TEST(GapDetection, ANodeThatReadEverythingTheStreamLostHasNoGap) {
  // 10 entries ever added, the stream keeps the last 4 (ordinals 7..10).
  EXPECT_EQ(lostEntries(10, 10, 4), 0u);
  EXPECT_EQ(lostEntries(6, 10, 4), 0u);   // 7 is still there
  EXPECT_EQ(lostEntries(5, 10, 4), 1u);   // 6 is gone
  EXPECT_EQ(lostEntries(0, 10, 4), 6u);   // never read anything: 1..6 gone
  EXPECT_EQ(lostEntries(0, 0, 0), 0u);    // an empty stream
  EXPECT_EQ(lostEntries(3, 3, 0), 0u);    // everything read, then trimmed
  EXPECT_EQ(lostEntries(3, 2, 5), 0u);    // a stream that makes no sense
}

// A new directory of the test's own, mode 0700.
std::string tempDir() {
  std::string dir = ::testing::TempDir() + "fleet-state-XXXXXX";
  if (mkdtemp(dir.data()) == nullptr) throw std::runtime_error("mkdtemp " + dir);
  return dir;
}

std::string readFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

void writeFile(const std::string& path, const std::string& text, mode_t mode) {
  std::ofstream(path, std::ios::binary) << text;
  chmod(path.c_str(), mode);
}

std::set<std::string> namesIn(const std::string& dir) {
  std::set<std::string> names;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    names.insert(entry.path().filename());
  }
  return names;
}

// load()'s error, "" when it did not throw.
std::string loadError(const StateFile& file) {
  try {
    file.load();
  } catch (const std::runtime_error& e) {
    return e.what();
  }
  return "";
}

// A root-only file where esid's links could lead it: its first line would
// be quoted in the parse error.
struct Secret {
  std::string path = tempDir() + "/secret";
  Secret() { writeFile(path, "top-secret-first-line\n", 0600); }
};

TEST(StateFile, APositionSurvivesARestart) {
  const std::string dir = tempDir();
  const StateFile file(dir, "esi:purges");
  EXPECT_EQ(file.path(), dir + "/fleet-esi_purges.state");
  EXPECT_FALSE(file.load());
  file.save(FleetState{FleetPosition{StreamId{1796172032767, 3}, 42}, {}});
  file.save(FleetState{FleetPosition{StreamId{1796172032767, 4}, 43}, {"pages", "site"}});
  const auto back = StateFile(dir, "esi:purges").load();
  ASSERT_TRUE(back);
  EXPECT_EQ(back->position.last, (StreamId{1796172032767, 4}));
  EXPECT_EQ(back->position.ordinal, 43u);
  EXPECT_EQ(back->zones, (std::set<std::string>{"pages", "site"}));
  // Renamed into place, no temporary left; the owner's alone.
  EXPECT_EQ(namesIn(dir), std::set<std::string>{"fleet-esi_purges.state"});
  struct stat st;
  ASSERT_EQ(stat(file.path().c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
}

// The attack of issue 33: whoever may write in state_dir plants links where
// esid (root) reads and writes.
TEST(StateFile, ALinkAtItsNameIsNeitherFollowedNorQuoted) {
  const Secret secret;
  const std::string dir = tempDir();
  const StateFile file(dir, "esi:purges");
  ASSERT_EQ(symlink(secret.path.c_str(), file.path().c_str()), 0);
  const std::string error = loadError(file);
  EXPECT_NE(error.find(file.path() + " is a symbolic link"), std::string::npos) << error;
  EXPECT_EQ(error.find("top-secret"), std::string::npos) << error;
  // A save replaces the link itself.
  file.save(FleetState{FleetPosition{StreamId{5, 0}, 1}, {}});
  EXPECT_EQ(readFile(secret.path), "top-secret-first-line\n");
  struct stat st;
  ASSERT_EQ(lstat(file.path().c_str(), &st), 0);
  EXPECT_TRUE(S_ISREG(st.st_mode));
  EXPECT_EQ(file.load()->position.last, (StreamId{5, 0}));
}

TEST(StateFile, ALinkAtATemporaryNameIsNotWrittenThrough) {
  const Secret secret;
  const std::string dir = tempDir();
  const StateFile file(dir, "esi:purges");
  // The name esid once wrote its temporary to, O_TRUNC and all.
  ASSERT_EQ(symlink(secret.path.c_str(), (file.path() + ".tmp").c_str()), 0);
  file.save(FleetState{FleetPosition{StreamId{6, 0}, 2}, {}});
  EXPECT_EQ(readFile(secret.path), "top-secret-first-line\n");
  struct stat st;
  ASSERT_EQ(stat(secret.path.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  EXPECT_EQ(file.load()->position.last, (StreamId{6, 0}));
}

TEST(StateFile, AHardLinkOrAFifoAtItsNameIsRefusedUnread) {
  const std::string dir = tempDir();
  const Secret secret;  // in a directory beside dir: the same file system
  const StateFile file(dir, "esi:purges");
  ASSERT_EQ(link(secret.path.c_str(), file.path().c_str()), 0);
  const std::string linked = loadError(file);
  EXPECT_NE(linked.find(file.path() + " is not a regular file of one link"), std::string::npos)
      << linked;
  ASSERT_EQ(linked.find("top-secret"), std::string::npos) << linked;
  ASSERT_EQ(unlink(file.path().c_str()), 0);
  ASSERT_EQ(mkfifo(file.path().c_str(), 0600), 0);
  EXPECT_NE(loadError(file).find(" is not a regular file"), std::string::npos);
}

TEST(StateFile, AStateDirOthersMayWriteInOrALinkToOneIsRefused) {
  const std::string dir = tempDir();
  ASSERT_EQ(chmod(dir.c_str(), 0777), 0);
  try {
    StateFile(dir, "esi:purges");
    ADD_FAILURE() << "a state_dir of mode 0777 was taken";
  } catch (const std::runtime_error& e) {
    const std::string error = e.what();
    EXPECT_NE(error.find("state_dir " + dir + " is owned by user "), std::string::npos) << error;
    EXPECT_NE(error.find("mode 0777: every user may write in it"), std::string::npos) << error;
    EXPECT_NE(error.find("fix: chmod o-w " + dir), std::string::npos) << error;
  }
  ASSERT_EQ(chmod(dir.c_str(), 0700), 0);
  const std::string link = tempDir() + "/link";
  ASSERT_EQ(symlink(dir.c_str(), link.c_str()), 0);
  try {
    StateFile(link, "esi:purges");
    ADD_FAILURE() << "a link to a state_dir was followed";
  } catch (const std::runtime_error& e) {
    EXPECT_EQ(std::string(e.what()), "state_dir " + link + " is a symbolic link: name the "
                                     "directory itself");
  }
}

TEST(StateFile, AMissingStateDirIsMade) {
  const std::string dir = tempDir() + "/new";
  StateFile(dir, "s").save(FleetState{FleetPosition{StreamId{1, 0}, std::nullopt}, {}});
  struct stat st;
  ASSERT_EQ(stat(dir.c_str(), &st), 0);
  EXPECT_TRUE(S_ISDIR(st.st_mode));
}

TEST(StateFile, AHandSetPositionHasNoOrdinal) {
  const FleetPosition p = parseState("stream s\nlast 17-2   # by hand\n", "s", "f").position;
  EXPECT_EQ(p.last, (StreamId{17, 2}));
  EXPECT_FALSE(p.ordinal);
}

TEST(StateFile, ACorruptFileOrAnotherStreamsStopsEsid) {
  EXPECT_THROW(parseState("stream s\nlast 17\n", "s", "f"), std::runtime_error);
  EXPECT_THROW(parseState("stream s\n", "s", "f"), std::runtime_error);
  EXPECT_THROW(parseState("stream other\nlast 1-0\n", "s", "f"), std::runtime_error);
  EXPECT_THROW(parseState("stream s\nlast 1-0\nordinal x\n", "s", "f"), std::runtime_error);
  EXPECT_THROW(parseState("stream s\nlast 1-0\nfirst 0-0\n", "s", "f"), std::runtime_error);
  EXPECT_EQ(parseState(formatState("s", FleetState{FleetPosition{StreamId{9, 9}, 3}, {}}), "s", "f")
                .position.ordinal,
            3u);
  EXPECT_THROW(parseState("stream s\nlast 1-0\nzone\n", "s", "f"), std::runtime_error);
}

TEST(PendingQueue, KeepsOrderAndDropsTheOldestWhenFull) {
  PendingQueue queue(3);
  for (const char* key : {"/1", "/2", "/3"}) queue.push(entry("a", PurgeQuery::Kind::kKey, key));
  queue.push(entry("b", PurgeQuery::Kind::kKey, "/4"));
  EXPECT_EQ(queue.size(), 3u);
  EXPECT_EQ(queue.dropped(), 1u);
  EXPECT_EQ(queue.takeLostZones(), std::set<std::string>{"a"});
  EXPECT_TRUE(queue.takeLostZones().empty());
  EXPECT_EQ(queue.pop().query.value, "/2");
  EXPECT_EQ(queue.pop().query.value, "/3");
  EXPECT_EQ(queue.pop().query.value, "/4");
  EXPECT_TRUE(queue.empty());
}

TEST(PendingQueue, EntriesSentButUnansweredGoBackInFrontInOrder) {
  PendingQueue queue(10);
  queue.push(entry("a", PurgeQuery::Kind::kKey, "/3"));
  queue.putBack({entry("a", PurgeQuery::Kind::kKey, "/1"), entry("a", PurgeQuery::Kind::kKey, "/2")});
  EXPECT_EQ(queue.pop().query.value, "/1");
  EXPECT_EQ(queue.pop().query.value, "/2");
  EXPECT_EQ(queue.pop().query.value, "/3");
}

TEST(RedisUrl, HostPortAndDatabase) {
  const RedisAddress a = parseRedisUrl("redis://127.0.0.1:6380/2");
  EXPECT_EQ(a.host, "127.0.0.1");
  EXPECT_EQ(a.port, 6380);
  EXPECT_EQ(a.db, 2);
  const RedisAddress b = parseRedisUrl("redis://redis.internal");
  EXPECT_EQ(b.port, 6379);
  EXPECT_EQ(b.db, 0);
  EXPECT_EQ(parseRedisUrl("redis://[::1]:7000/0").host, "::1");
  EXPECT_EQ(parseRedisUrl("redis://[::1]:7000/0").text(), "redis://[::1]:7000/0");
  EXPECT_FALSE(a.tls);
  const RedisAddress tls = parseRedisUrl("rediss://redis.internal:6380/1");
  EXPECT_TRUE(tls.tls);
  EXPECT_EQ(tls.host, "redis.internal");
  EXPECT_EQ(tls.port, 6380);
  EXPECT_EQ(tls.text(), "rediss://redis.internal:6380/1");
}

TEST(RedisUrl, CredentialsAndOtherSchemesAreRefused) {
  EXPECT_THROW(parseRedisUrl("redis://user:secret@host:6379/0"), std::invalid_argument);
  EXPECT_THROW(parseRedisUrl("http://host"), std::invalid_argument);
  EXPECT_THROW(parseRedisUrl("redisss://host"), std::invalid_argument);
  EXPECT_THROW(parseRedisUrl("rediss://user:secret@host:6380/0"), std::invalid_argument);
  EXPECT_THROW(parseRedisUrl("redis://host:0"), std::invalid_argument);
  EXPECT_THROW(parseRedisUrl("redis://host:99999"), std::invalid_argument);
  EXPECT_THROW(parseRedisUrl("redis://:6379"), std::invalid_argument);
  EXPECT_THROW(parseRedisUrl("redis://host/x"), std::invalid_argument);
}

TEST(Fleet, APurgeIsPendingWhileRedisIsAwayAndNoRequestWaits) {
  uv_loop_t loop;
  ASSERT_EQ(uv_loop_init(&loop), 0);
  {
    FleetOptions options;
    options.redis = parseRedisUrl("redis://127.0.0.1:1/0");  // nothing listens there
    options.node = "lonely";
    options.stateDir = tempDir();
    options.queueLimit = 2;
    Fleet fleet(&loop, options, [](const PurgeQuery&, Fleet::Applied done) { done(0, {}); },
                [] { return std::vector<std::string>{"pages"}; });
    fleet.start();
    const Publication first = fleet.published(PurgeQuery{PurgeQuery::Kind::kKey, "pages", "/a"}, 1, false);
    EXPECT_EQ(first.status, "pending");
    EXPECT_FALSE(first.uid.empty());
    fleet.published(PurgeQuery{PurgeQuery::Kind::kKey, "pages", "/b"}, 1, false);
    fleet.published(PurgeQuery{PurgeQuery::Kind::kKey, "pages", "/c"}, 1, false);
    EXPECT_EQ(fleet.stats()["fleet_pending"], 2);
    EXPECT_EQ(fleet.stats()["fleet_dropped"], 1);
    EXPECT_EQ(fleet.published(PurgeQuery{PurgeQuery::Kind::kKey, "pa ges", "/d"}, 1, false).status,
              "refused");
    fleet.stop();
  }
  uv_run(&loop, UV_RUN_DEFAULT);  // the handles close
  EXPECT_EQ(uv_loop_close(&loop), 0);
}

// A "Redis" that accepts connections and reads what it is sent but never
// answers, as a stopped (SIGSTOP) or swapping one: the kernel completes
// the TCP connections all the same.
class SilentRedis {
 public:
  explicit SilentRedis(uv_loop_t* loop) : server_(new uv_tcp_t) {
    uv_tcp_init(loop, server_);
    server_->data = this;
    sockaddr_in addr{};
    uv_ip4_addr("127.0.0.1", 0, &addr);
    EXPECT_EQ(uv_tcp_bind(server_, reinterpret_cast<const sockaddr*>(&addr), 0), 0);
    EXPECT_EQ(uv_listen(reinterpret_cast<uv_stream_t*>(server_), 16, onConnection), 0);
    sockaddr_storage bound{};
    int length = sizeof bound;
    uv_tcp_getsockname(server_, reinterpret_cast<sockaddr*>(&bound), &length);
    port_ = ntohs(reinterpret_cast<const sockaddr_in*>(&bound)->sin_port);
  }
  ~SilentRedis() { close(); }
  SilentRedis(const SilentRedis&) = delete;
  SilentRedis& operator=(const SilentRedis&) = delete;

  std::string url() const { return "redis://127.0.0.1:" + std::to_string(port_) + "/0"; }
  // What each accepted connection was sent, in the order accepted.
  const std::vector<std::string>& received() const { return received_; }
  size_t spokenTo() const {
    return static_cast<size_t>(std::count_if(received_.begin(), received_.end(),
                                             [](const std::string& r) { return !r.empty(); }));
  }
  void close() {
    for (uv_tcp_t* client : std::exchange(clients_, {})) closeTcp(client);
    if (server_ != nullptr) closeTcp(std::exchange(server_, nullptr));
  }

 private:
  static void closeTcp(uv_tcp_t* tcp) {
    uv_close(reinterpret_cast<uv_handle_t*>(tcp),
             [](uv_handle_t* h) { delete reinterpret_cast<uv_tcp_t*>(h); });
  }
  static void onConnection(uv_stream_t* server, int status) {
    auto* self = static_cast<SilentRedis*>(server->data);
    if (status != 0) return;
    auto* client = new uv_tcp_t;
    uv_tcp_init(server->loop, client);
    client->data = self;
    if (uv_accept(server, reinterpret_cast<uv_stream_t*>(client)) != 0) {
      closeTcp(client);
      return;
    }
    self->clients_.push_back(client);
    self->received_.emplace_back();
    uv_read_start(
        reinterpret_cast<uv_stream_t*>(client),
        [](uv_handle_t*, size_t, uv_buf_t* buf) {
          static char bytes[4096];
          *buf = uv_buf_init(bytes, sizeof bytes);
        },
        [](uv_stream_t* stream, ssize_t n, const uv_buf_t* buf) {
          auto* redis = static_cast<SilentRedis*>(stream->data);
          if (n < 0) uv_read_stop(stream);
          if (n <= 0) return;
          const auto at = std::find(redis->clients_.begin(), redis->clients_.end(),
                                    reinterpret_cast<uv_tcp_t*>(stream));
          redis->received_[static_cast<size_t>(at - redis->clients_.begin())].append(
              buf->base, static_cast<size_t>(n));
        });
  }

  uv_tcp_t* server_;
  int port_ = 0;
  std::vector<uv_tcp_t*> clients_;
  std::vector<std::string> received_;
};

// A connection is no proof that Redis is there: one that never answers
// leaves the fleet disconnected and its purges pending.  (It was taken for
// live as soon as TCP connected: `published`, and fleet_connected 1, until
// its first command timed out 2 s later; issue 34.)
TEST(Fleet, ARedisThatConnectsButNeverAnswersIsNotConnectedAndPurgesWait) {
  uv_loop_t loop;
  ASSERT_EQ(uv_loop_init(&loop), 0);
  {
    SilentRedis redis(&loop);
    FleetOptions options;
    options.redis = parseRedisUrl(redis.url());
    options.node = "hung";
    options.stateDir = tempDir();
    Fleet fleet(&loop, options, [](const PurgeQuery&, Fleet::Applied done) { done(0, {}); },
                [] { return std::vector<std::string>{"pages"}; });
    fleet.start();
    // Both connections, the reader's and the writer's, sent their first
    // command: what each does once it takes Redis for ready.
    while (redis.spokenTo() < 2) uv_run(&loop, UV_RUN_ONCE);
    for (const std::string& sent : redis.received()) {
      EXPECT_EQ(sent.rfind("*1\r\n$4\r\nROLE\r\n", 0), 0u) << sent;
    }
    EXPECT_EQ(fleet.stats()["fleet_connected"], 0);
    const Publication p = fleet.published(PurgeQuery{PurgeQuery::Kind::kKey, "pages", "/a"}, 1, false);
    EXPECT_EQ(p.status, "pending");
    EXPECT_EQ(fleet.stats()["fleet_pending"], 1);
    fleet.stop();
    redis.close();
  }
  uv_run(&loop, UV_RUN_DEFAULT);  // the handles close
  EXPECT_EQ(uv_loop_close(&loop), 0);
}

}  // namespace
}  // namespace esi
