#include "esid/settings.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <stdexcept>
#include <string>

namespace esi {
namespace {

const SettingSpec& spec(std::string_view key) {
  for (const SettingSpec& s : kSettings) {
    if (s.key == key) return s;
  }
  throw std::invalid_argument("no setting " + std::string(key));
}

TEST(SettingsFile, KeysValuesCommentsAndBlankLinesAreRead) {
  const auto layer = parseSettingsFile(
      "# esid settings\n"
      "\n"
      "socket = /run/x.sock   # trailing comment\n"
      "  ring_size=4M\n"
      "log_level =\tdebug\r\n",
      "esid.conf");
  const Settings s = Settings::resolve(layer, {});
  EXPECT_EQ(s.socketPath, "/run/x.sock");
  EXPECT_EQ(s.ringSize, 4u << 20);
  EXPECT_EQ(s.logLevel, spdlog::level::debug);
}

TEST(SettingsFile, AnEmptyFileSetsNothing) {
  EXPECT_TRUE(parseSettingsFile("# nothing\n\n", "esid.conf").empty());
}

TEST(SettingsFile, DefaultsAreTheTablesValues) {
  const Settings s = Settings::resolve({}, {});
  EXPECT_EQ(s.socketPath, "/run/esid/esid.sock");
  EXPECT_EQ(s.ringSize, 1u << 20);
  EXPECT_EQ(s.logLevel, spdlog::level::info);
  EXPECT_EQ(s.fleetStream, "esi:purges");
  EXPECT_EQ(s.fleetMaxEntries, 100000u);
  EXPECT_EQ(s.fleetQueue, 10000u);
  EXPECT_EQ(s.stateDir, "/var/lib/esid");
  EXPECT_EQ(s.fleetNode, "");
}

TEST(SettingsFile, AnUnknownKeyIsRefusedWithEveryKnownOne) {
  try {
    parseSettingsFile("log_level = info\nrings = 4\n", "esid.conf");
    FAIL() << "no exception";
  } catch (const std::invalid_argument& e) {
    EXPECT_STREQ(e.what(),
                 "esid.conf:2: unknown key \"rings\" (known: socket, socket_group, socket_mode, "
                 "ring_size, segment_arena, plan_store, log_level, control_group, fleet, "
                 "fleet_node, fleet_stream, fleet_user, fleet_password, fleet_tls_ca_file, "
                 "fleet_tls_cert_file, fleet_tls_key_file, fleet_tls_server_name, fleet_on_gap, "
                 "fleet_max_entries, fleet_queue, state_dir, metrics)");
  }
}

TEST(SettingsTable, EveryFlagsHelpNamesItsDefault) {
  for (const SettingSpec& spec : kSettings) {
    if (spec.flag.empty() || spec.value.empty()) continue;
    EXPECT_NE(spec.help.find("[default: " + std::string(spec.value) + "]"),
              std::string_view::npos)
        << spec.key;
  }
}

// argv is readable by every local user: a secret is read from the file only.
TEST(SettingsTable, AFlagIsTheKeyWithDashesAndNoSecretHasOne) {
  for (const SettingSpec& spec : kSettings) {
    if (spec.flag.empty()) continue;
    std::string flag = "--" + std::string(spec.key);
    std::replace(flag.begin(), flag.end(), '_', '-');
    EXPECT_EQ(spec.flag, flag);
    EXPECT_FALSE(spec.secret) << spec.key;
  }
}

TEST(SettingsFile, AStateDirMustBeAbsolute) {
  try {
    parseSettingsFile("state_dir = var/lib\n", "f");
    FAIL() << "no exception";
  } catch (const std::invalid_argument& e) {
    EXPECT_STREQ(e.what(), "f:1: state_dir must be an absolute path");
  }
}

TEST(SettingsFile, AFleetUrlWithCredentialsIsRefusedWithItsLine) {
  EXPECT_THROW(parseSettingsFile("fleet = redis://u:p@127.0.0.1:6379/0\n", "f"),
               std::invalid_argument);
  EXPECT_EQ(Settings::resolve(parseSettingsFile("fleet = redis://127.0.0.1:6379/0\n", "f"), {})
                .fleet,
            "redis://127.0.0.1:6379/0");
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
  EXPECT_EQ(Settings::resolve(layer, {}).controlGroup, "root");
  EXPECT_EQ(parseGroup("root"), 0u);
  EXPECT_EQ(parseGroup("0"), 0u);
  EXPECT_THROW(parseSettingsFile("control_group = no-such-group-here\n", "f"),
               std::invalid_argument);
}

TEST(SettingsFile, SocketGroupAndModeAreReadAndTheGroupMustExist) {
  const auto layer = parseSettingsFile("socket_group = root\nsocket_mode = 0640\n", "f");
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
  const auto changes = describeChanges(s, Settings::resolve(parseSettingsFile(
                                              "socket_mode = 0640\n", "f"), {}));
  EXPECT_EQ(changes, std::vector<std::string>{"socket_mode: 0660 -> 0640"});
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
  const Settings before = Settings::resolve({}, {});
  Settings after = before;
  after.socketMode = 0660;  // said, but what it was
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
  EXPECT_EQ(Settings::resolve({}, {}).segmentArena, uint64_t{256} << 20);
  const auto layer = parseSettingsFile("segment_arena = 64M\n", "esid.conf");
  EXPECT_EQ(Settings::resolve(layer, {}).segmentArena, uint64_t{64} << 20);
  EXPECT_THROW(parseSettingsFile("segment_arena = 512K\n", "f"), std::invalid_argument);
}

TEST(SettingsFile, PlanStoreIsReadAndDefaultsTo64M) {
  EXPECT_EQ(Settings::resolve({}, {}).planStore, uint64_t{64} << 20);
  const auto layer = parseSettingsFile("plan_store = 1G\n", "esid.conf");
  EXPECT_EQ(Settings::resolve(layer, {}).planStore, uint64_t{1} << 30);
  SettingsLayer flag;
  flag.set(spec("plan_store"), "64K");
  EXPECT_EQ(Settings::resolve(layer, flag).planStore, uint64_t{64} << 10);
  EXPECT_THROW(parsePlanStore("63K"), std::invalid_argument);
  EXPECT_THROW(parsePlanStore("65G"), std::invalid_argument);
  EXPECT_THROW(parseSettingsFile("plan_store = 1T\n", "f"), std::invalid_argument);
}

TEST(SettingsFile, MetricsIsOffByDefaultAndTakesAnAddressAndAPort) {
  EXPECT_EQ(Settings::resolve({}, {}).metrics, "");
  const auto layer = parseSettingsFile("metrics = 127.0.0.1:9145\n", "esid.conf");
  EXPECT_EQ(Settings::resolve(layer, {}).metrics, "127.0.0.1:9145");
  SettingsLayer flag;
  flag.set(spec("metrics"), "[::1]:9100");
  EXPECT_EQ(Settings::resolve(layer, flag).metrics, "[::1]:9100");
  EXPECT_EQ(parseMetricsAddress("0.0.0.0:9145"), "0.0.0.0:9145");  // any, as documented
  EXPECT_THROW(parseSettingsFile("metrics = 9145\n", "f"), std::invalid_argument);
  EXPECT_THROW(parseSettingsFile("metrics = localhost:9145\n", "f"), std::invalid_argument);
  Settings after;
  after.metrics = "127.0.0.1:9145";
  EXPECT_EQ(describeChanges(Settings(), after),
            std::vector<std::string>{"metrics: (off) -> 127.0.0.1:9145"});
}

TEST(LogLevel, WarnIsSpelledWarnBothWays) {
  EXPECT_EQ(parseLogLevel("warn"), spdlog::level::warn);
  EXPECT_EQ(logLevelName(spdlog::level::warn), "warn");
  EXPECT_EQ(parseLogLevel("off"), spdlog::level::off);
  EXPECT_THROW(parseLogLevel("warning"), std::invalid_argument);
}

TEST(Settings, CommandLineOverridesFileOverridesDefaults) {
  const SettingsLayer file = parseSettingsFile("ring_size = 2M\nlog_level = debug\n", "f");
  SettingsLayer commandLine;
  commandLine.set(spec("log_level"), "warn");
  const Settings s = Settings::resolve(file, commandLine);
  EXPECT_EQ(s.socketPath, "/run/esid/esid.sock");
  EXPECT_EQ(s.ringSize, 2u << 20);
  EXPECT_EQ(s.logLevel, spdlog::level::warn);
}

TEST(Settings, ChangesAreDescribedOnePerLine) {
  const Settings before = Settings::resolve({}, {});
  Settings after = before;
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
  commandLine.set(spec("fleet_node"), "web-2");
  const Settings s = Settings::resolve(file, commandLine);
  EXPECT_EQ(s.fleet, "redis://10.0.0.5:6379/1");
  EXPECT_EQ(s.fleetNode, "web-2");
  EXPECT_EQ(s.fleetPassword, "s3cret");
  EXPECT_EQ(s.fleetUser, "esid");
  EXPECT_EQ(s.fleetOnGap, "log");
  EXPECT_EQ(s.fleetMaxEntries, 5000u);
  EXPECT_EQ(s.fleetQueue, 20u);
  EXPECT_EQ(s.fleetStream, "site:purges");
  EXPECT_EQ(s.stateDir, "/srv/esid");
  EXPECT_EQ(Settings::resolve({}, {}).fleetOnGap, "purge_all");
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
  EXPECT_EQ(s.fleetTlsCaFile, "/etc/esid/ca.pem");
  EXPECT_EQ(s.fleetTlsCertFile, "/etc/esid/client.pem");
  EXPECT_EQ(s.fleetTlsKeyFile, "/etc/esid/client.key");
  EXPECT_EQ(s.fleetTlsServerName, "redis.test");
  EXPECT_THROW(parseSettingsFile("fleet_tls_key_file = client.key\n", "f"), std::invalid_argument);
}

TEST(SettingsFile, BadFleetValuesAreRefusedAndAPasswordIsNeverShown) {
  EXPECT_THROW(parseSettingsFile("fleet_on_gap = shrug\n", "f"), std::invalid_argument);
  EXPECT_THROW(parseSettingsFile("fleet_queue = 0\n", "f"), std::invalid_argument);
  EXPECT_THROW(parseSettingsFile("fleet_max_entries = many\n", "f"), std::invalid_argument);
  EXPECT_THROW(parseSettingsFile("state_dir = relative\n", "f"), std::invalid_argument);
  const Settings before = Settings::resolve({}, {});
  Settings after = before;
  after.fleetPassword = "s3cret";
  const auto changes = describeChanges(before, after);
  ASSERT_EQ(changes.size(), 1u);
  EXPECT_EQ(changes[0], "fleet_password changed");
  EXPECT_EQ(showSetting(spec("fleet_password"), after), "(set)");
  EXPECT_EQ(showSetting(spec("fleet_password"), before), "(none)");
}

TEST(Settings, AReloadKeepsWhatChangesOnlyWithARestart) {
  const Settings current = Settings::resolve(
      parseSettingsFile("plan_store = 1M\nfleet_password = a\n", "f"), {});
  const Settings read = Settings::resolve(
      parseSettingsFile("plan_store = 2M\nfleet_password = b\nsocket = /run/y.sock\n"
                        "socket_mode = 0640\nsegment_arena = 1G\nmetrics = 127.0.0.1:9\n",
                        "f"),
      {});
  std::vector<const SettingSpec*> kept;
  const Settings next = keepUntilRestart(current, read, kept);
  std::vector<std::string_view> keys;
  for (const SettingSpec* s : kept) keys.push_back(s->key);
  EXPECT_EQ(keys, (std::vector<std::string_view>{"socket", "socket_mode", "segment_arena",
                                                 "fleet_password", "metrics"}));
  EXPECT_EQ(describeChanges(current, next),
            std::vector<std::string>{"plan_store: 1048576 -> 2097152"});
}

}  // namespace
}  // namespace esi
