#include "esid/settings.h"

#include <gtest/gtest.h>

#include <stdexcept>

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
