#include "esid/settings.h"

#include <gtest/gtest.h>

#include <stdexcept>
#include <string>

namespace esi {
namespace {

TEST(SettingsFile, KeysValuesCommentsAndBlankLinesAreRead) {
  const auto layer = parseSettingsFile(
      "# esid settings\n"
      "\n"
      "socket = /run/x.sock   # trailing comment\n"
      "  ring_size=4M\n"
      "log_level =\tdebug\r\n",
      "esid.conf");
  EXPECT_EQ(layer.socketPath, "/run/x.sock");
  EXPECT_EQ(layer.ringSize, 4u << 20);
  EXPECT_EQ(layer.logLevel, spdlog::level::debug);
}

TEST(SettingsFile, AnEmptyFileSetsNothing) {
  const auto layer = parseSettingsFile("", "esid.conf");
  EXPECT_FALSE(layer.socketPath);
  EXPECT_FALSE(layer.ringSize);
  EXPECT_FALSE(layer.logLevel);
}

TEST(SettingsFile, ErrorsNameTheFileAndLine) {
  try {
    parseSettingsFile("log_level = info\nring_size = 3M\n", "/etc/esid/esid.conf");
    FAIL() << "no exception";
  } catch (const std::invalid_argument& e) {
    EXPECT_STREQ(e.what(), "/etc/esid/esid.conf:2: ring size 3145728 is not a power of two");
  }
}

TEST(SettingsFile, UnknownKeysLinesWithoutEqualsAndEmptyValuesAreRefused) {
  EXPECT_THROW(parseSettingsFile("rings = 4\n", "f"), std::invalid_argument);
  EXPECT_THROW(parseSettingsFile("log_level\n", "f"), std::invalid_argument);
  EXPECT_THROW(parseSettingsFile("log_level =\n", "f"), std::invalid_argument);
  EXPECT_THROW(parseSettingsFile("log_level = loud\n", "f"), std::invalid_argument);
}

TEST(SettingsFile, ControlGroupMustExist) {
  const SettingsLayer layer = parseSettingsFile("control_group = root\n", "f");
  EXPECT_EQ(layer.controlGroup, "root");
  EXPECT_EQ(parseGroup("root"), 0u);
  EXPECT_EQ(parseGroup("0"), 0u);
  EXPECT_THROW(parseSettingsFile("control_group = no-such-group-here\n", "f"),
               std::invalid_argument);
}

TEST(SettingsFile, SocketGroupAndModeAreReadAndTheGroupMustExist) {
  const auto layer = parseSettingsFile("socket_group = root\nsocket_mode = 0640\n", "f");
  EXPECT_EQ(layer.socketGroup, "root");
  EXPECT_EQ(layer.socketMode, mode_t{0640});
  const Settings s = Settings::resolve(layer, {});
  EXPECT_EQ(s.socketGroup, "root");
  EXPECT_EQ(s.socketMode, mode_t{0640});
  EXPECT_THROW(parseSettingsFile("socket_group = no-such-group-here\n", "f"),
               std::invalid_argument);
}

TEST(SettingsFile, ASocketGroupAndModeLeftOutAreEsidsGroupAnd0660) {
  const Settings s = Settings::resolve({}, {});
  EXPECT_EQ(s.socketGroup, "");
  EXPECT_FALSE(s.socketMode);
  EXPECT_EQ(kDefaultSocketMode, mode_t{0660});
}

TEST(SettingsFile, AWorldWritableSocketModeIsRefusedWithItsLine) {
  try {
    parseSettingsFile("socket_mode = 0660\nsocket_mode = 0666\n", "/etc/esid/esid.conf");
    FAIL() << "no exception";
  } catch (const std::invalid_argument& e) {
    const std::string what = e.what();
    EXPECT_EQ(what.rfind("/etc/esid/esid.conf:2: socket mode 0666 is world-writable", 0), 0u)
        << what;
    EXPECT_NE(what.find("socket_group"), std::string::npos) << what;
  }
}

TEST(SocketMode, AcceptsOctalPermissionBitsThatAreNotWorldWritable) {
  EXPECT_EQ(parseSocketMode("0660"), mode_t{0660});
  EXPECT_EQ(parseSocketMode("660"), mode_t{0660});
  EXPECT_EQ(parseSocketMode("0600"), mode_t{0600});
  EXPECT_EQ(parseSocketMode(" 0775 "), mode_t{0775});
  EXPECT_EQ(parseSocketMode("0"), mode_t{0});
  EXPECT_THROW(parseSocketMode("0666"), std::invalid_argument);
  EXPECT_THROW(parseSocketMode("0602"), std::invalid_argument);
  EXPECT_THROW(parseSocketMode("0777"), std::invalid_argument);
  EXPECT_THROW(parseSocketMode("4660"), std::invalid_argument);   // setuid: not permission bits
  EXPECT_THROW(parseSocketMode("0680"), std::invalid_argument);   // 8 is no octal digit
  EXPECT_THROW(parseSocketMode("u+rw"), std::invalid_argument);
  EXPECT_THROW(parseSocketMode(""), std::invalid_argument);
  EXPECT_THROW(parseSocketMode("-660"), std::invalid_argument);
  EXPECT_THROW(parseSocketMode("00660"), std::invalid_argument);
  EXPECT_EQ(socketModeName(0660), "0660");
  EXPECT_EQ(socketModeName(07), "0007");
}

TEST(Settings, SocketGroupAndModeChangesAreDescribed) {
  Settings before, after;
  after.socketMode = kDefaultSocketMode;  // said, but what it was
  EXPECT_TRUE(describeChanges(before, after).empty());
  after.socketGroup = "root";
  after.socketMode = 0640;
  const auto changes = describeChanges(before, after);
  ASSERT_EQ(changes.size(), 2u);
  EXPECT_EQ(changes[0], "socket_group: (none) -> root");
  EXPECT_EQ(changes[1], "socket_mode: 0660 -> 0640");
}

TEST(RingSize, AcceptsBytesAndSuffixesWithinBounds) {
  EXPECT_EQ(parseRingSize("262144"), 256u << 10);
  EXPECT_EQ(parseRingSize("256K"), 256u << 10);
  EXPECT_EQ(parseRingSize("1m"), 1u << 20);
  EXPECT_EQ(parseRingSize("64M"), 64u << 20);
  EXPECT_THROW(parseRingSize("128K"), std::invalid_argument);
  EXPECT_THROW(parseRingSize("128M"), std::invalid_argument);
  EXPECT_THROW(parseRingSize("1G"), std::invalid_argument);
  EXPECT_THROW(parseRingSize("lots"), std::invalid_argument);
  EXPECT_THROW(parseRingSize("99999999999999999999"), std::invalid_argument);
}

TEST(SegmentArena, AcceptsBytesAndSuffixesFromOneMebibyte) {
  EXPECT_EQ(parseSegmentArena("1M"), uint64_t{1} << 20);
  EXPECT_EQ(parseSegmentArena("1048576"), uint64_t{1} << 20);
  EXPECT_EQ(parseSegmentArena("1536k"), uint64_t{1536} << 10);
  EXPECT_EQ(parseSegmentArena("2G"), uint64_t{2} << 30);
  EXPECT_THROW(parseSegmentArena("1023K"), std::invalid_argument);
  EXPECT_THROW(parseSegmentArena("0"), std::invalid_argument);
  EXPECT_THROW(parseSegmentArena("65G"), std::invalid_argument);
  EXPECT_THROW(parseSegmentArena("1T"), std::invalid_argument);
  EXPECT_THROW(parseSegmentArena("99999999999999G"), std::invalid_argument);
}

TEST(SettingsFile, SegmentArenaIsReadAndDefaultsTo256M) {
  EXPECT_EQ(Settings().segmentArena, uint64_t{256} << 20);
  const auto layer = parseSettingsFile("segment_arena = 64M\n", "esid.conf");
  EXPECT_EQ(layer.segmentArena, uint64_t{64} << 20);
  EXPECT_EQ(Settings::resolve(layer, {}).segmentArena, uint64_t{64} << 20);
  EXPECT_THROW(parseSettingsFile("segment_arena = 512K\n", "f"), std::invalid_argument);
}

TEST(SettingsFile, PlanStoreIsReadAndDefaultsTo64M) {
  EXPECT_EQ(Settings().planStore, uint64_t{64} << 20);
  const auto layer = parseSettingsFile("plan_store = 1G\n", "esid.conf");
  EXPECT_EQ(layer.planStore, uint64_t{1} << 30);
  EXPECT_EQ(Settings::resolve(layer, {}).planStore, uint64_t{1} << 30);
  SettingsLayer flag;
  flag.planStore = uint64_t{64} << 10;
  EXPECT_EQ(Settings::resolve(layer, flag).planStore, uint64_t{64} << 10);
  EXPECT_THROW(parsePlanStore("63K"), std::invalid_argument);
  EXPECT_THROW(parsePlanStore("65G"), std::invalid_argument);
  EXPECT_THROW(parseSettingsFile("plan_store = 1T\n", "f"), std::invalid_argument);
}

TEST(SettingsFile, MetricsIsOffByDefaultAndTakesAnAddressAndAPort) {
  EXPECT_EQ(Settings().metrics, "");
  const auto layer = parseSettingsFile("metrics = 127.0.0.1:9145\n", "esid.conf");
  EXPECT_EQ(Settings::resolve(layer, {}).metrics, "127.0.0.1:9145");
  SettingsLayer flag;
  flag.metrics = "[::1]:9100";
  EXPECT_EQ(Settings::resolve(layer, flag).metrics, "[::1]:9100");
  EXPECT_EQ(parseMetricsAddress("0.0.0.0:9145"), "0.0.0.0:9145");  // any, as documented
  EXPECT_THROW(parseSettingsFile("metrics = 9145\n", "f"), std::invalid_argument);
  EXPECT_THROW(parseSettingsFile("metrics = localhost:9145\n", "f"), std::invalid_argument);
  Settings after;
  after.metrics = "127.0.0.1:9145";
  EXPECT_EQ(describeChanges(Settings(), after),
            std::vector<std::string>{"metrics: (none) -> 127.0.0.1:9145"});
}

TEST(LogLevel, WarnIsSpelledWarnBothWays) {
  EXPECT_EQ(parseLogLevel("warn"), spdlog::level::warn);
  EXPECT_EQ(logLevelName(spdlog::level::warn), "warn");
  EXPECT_EQ(parseLogLevel("off"), spdlog::level::off);
  EXPECT_THROW(parseLogLevel("warning"), std::invalid_argument);
}

TEST(Settings, CommandLineOverridesFileOverridesDefaults) {
  SettingsLayer file, commandLine;
  file.ringSize = 2u << 20;
  file.logLevel = spdlog::level::debug;
  commandLine.logLevel = spdlog::level::warn;
  const Settings s = Settings::resolve(file, commandLine);
  EXPECT_EQ(s.socketPath, "/run/esid/esid.sock");
  EXPECT_EQ(s.ringSize, 2u << 20);
  EXPECT_EQ(s.logLevel, spdlog::level::warn);
}

TEST(Settings, ChangesAreDescribedOnePerLine) {
  Settings before, after;
  EXPECT_TRUE(describeChanges(before, after).empty());
  after.logLevel = spdlog::level::warn;
  after.ringSize = 4u << 20;
  const auto changes = describeChanges(before, after);
  ASSERT_EQ(changes.size(), 2u);
  EXPECT_EQ(changes[0], "ring_size: 1048576 -> 4194304");
  EXPECT_EQ(changes[1], "log_level: info -> warn");
}

}  // namespace
}  // namespace esi

namespace esi {
namespace {

TEST(SettingsFile, FleetKeysAreReadAndTheCommandLineWins) {
  const SettingsLayer file = parseSettingsFile(
      "fleet = redis://10.0.0.5:6379/1\nfleet_node = web-1\nfleet_password = s3cret\n"
      "fleet_user = esid\nfleet_on_gap = log\nfleet_max_entries = 5000\nfleet_queue = 20\n"
      "fleet_stream = site:purges\nstate_dir = /srv/esid\n",
      "f");
  SettingsLayer commandLine;
  commandLine.fleetNode = "web-2";
  const Settings s = Settings::resolve(file, commandLine);
  EXPECT_EQ(s.fleet.url, "redis://10.0.0.5:6379/1");
  EXPECT_EQ(s.fleet.node, "web-2");
  EXPECT_EQ(s.fleet.password, "s3cret");
  EXPECT_EQ(s.fleet.user, "esid");
  EXPECT_EQ(s.fleet.onGap, "log");
  EXPECT_EQ(s.fleet.maxEntries, 5000u);
  EXPECT_EQ(s.fleet.queue, 20u);
  EXPECT_EQ(s.fleet.stream, "site:purges");
  EXPECT_EQ(s.fleet.stateDir, "/srv/esid");
  EXPECT_EQ(Settings::resolve({}, {}).fleet.onGap, "purge_all");
}

TEST(SettingsFile, FleetTlsKeysAreRead) {
  const Settings s = Settings::resolve(
      parseSettingsFile("fleet = rediss://redis.internal:6380/0\n"
                        "fleet_tls_ca_file = /etc/esid/ca.pem\n"
                        "fleet_tls_cert_file = /etc/esid/client.pem\n"
                        "fleet_tls_key_file = /etc/esid/client.key\n"
                        "fleet_tls_server_name = redis.test\n",
                        "f"),
      {});
  EXPECT_EQ(s.fleet.tlsCaFile, "/etc/esid/ca.pem");
  EXPECT_EQ(s.fleet.tlsCertFile, "/etc/esid/client.pem");
  EXPECT_EQ(s.fleet.tlsKeyFile, "/etc/esid/client.key");
  EXPECT_EQ(s.fleet.tlsServerName, "redis.test");
  EXPECT_THROW(parseSettingsFile("fleet_tls_key_file = client.key\n", "f"), std::invalid_argument);
}

TEST(SettingsFile, BadFleetValuesAreRefusedAndAPasswordIsNeverShown) {
  EXPECT_THROW(parseSettingsFile("fleet_on_gap = shrug\n", "f"), std::invalid_argument);
  EXPECT_THROW(parseSettingsFile("fleet_queue = 0\n", "f"), std::invalid_argument);
  EXPECT_THROW(parseSettingsFile("fleet_max_entries = many\n", "f"), std::invalid_argument);
  EXPECT_THROW(parseSettingsFile("state_dir = relative\n", "f"), std::invalid_argument);
  Settings before, after;
  after.fleet.password = "s3cret";
  const auto changes = describeChanges(before, after);
  ASSERT_EQ(changes.size(), 1u);
  EXPECT_EQ(changes[0], "fleet_password changed");
}

}  // namespace
}  // namespace esi
