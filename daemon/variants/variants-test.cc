#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>

#include <unistd.h>

#include <filesystem>

#include "variants/cache_file.h"
#include "variants/zone_index.h"
#include "variants/zone_scan.h"

namespace esi {
namespace {

// A cache file laid out as ngx_http_file_cache_set_header() writes it.
std::string cacheFile(const std::string& key, const std::string& headers,
                      const std::string& vary = "", uint8_t variantByte = 0) {
  std::string file(336, '\0');
  const uint64_t version = 5;
  std::memcpy(file.data(), &version, 8);
  file[187] = static_cast<char>(vary.size());
  std::memcpy(file.data() + 188, vary.data(), vary.size());
  std::memset(file.data() + 316, variantByte, 16);
  file += "\nKEY: " + key + "\n";
  const uint16_t headerStart = static_cast<uint16_t>(file.size());
  file += "HTTP/1.1 200 OK\r\n" + headers + "\r\n";
  const uint16_t bodyStart = static_cast<uint16_t>(file.size());
  file += "<html>body</html>";
  std::memcpy(file.data() + 54, &headerStart, 2);
  std::memcpy(file.data() + 56, &bodyStart, 2);
  return file;
}

TEST(CacheFile, FileWrittenByDebiansNginxParses) {
  std::ifstream in(std::string(ESI_TESTDATA) + "/nginx-1.22.1-cache-file", std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), {});
  std::string why;
  auto file = parseCacheFile(bytes, &why);
  ASSERT_TRUE(file) << why;
  EXPECT_EQ(file->key, "http://127.0.0.1:18081/page.html");
  EXPECT_EQ(md5ToHex(md5Of(file->key)), "e0b04e599bb05ad54f3e71b26677fed5");
}

TEST(CacheFile, EveryConventionsTagHeaderBecomesTagsByDefault) {
  std::string why;
  auto file = parseCacheFile(
      cacheFile("/p", "Cache-Tag: cf-a,cf-b\r\nCache-Tags: node:1 node_list\r\n"
                      "Purge-Cache-Tags: config:system\r\n"
                      "X-Magento-Tags: store,cat_p_42,cat_c_7\r\nX-Other: no\r\n"),
      &why);
  ASSERT_TRUE(file) << why;
  EXPECT_EQ(file->tags, (std::vector<std::string>{"cf-a", "cf-b", "node:1", "node_list",
                                                  "config:system", "store", "cat_p_42",
                                                  "cat_c_7"}));
}

TEST(CacheFile, OnlyTheConfiguredTagHeadersCount) {
  std::string why;
  auto file = parseCacheFile(cacheFile("/p", "Surrogate-Key: a\r\nX-Mine: b c\r\n"), &why,
                             {"x-mine"});
  ASSERT_TRUE(file) << why;
  EXPECT_EQ(file->tags, (std::vector<std::string>{"b", "c"}));
}

TEST(CacheFile, SurrogateKeyAndXkeyBecomeTags) {
  std::string why;
  auto file = parseCacheFile(
      cacheFile("/p", "Surrogate-Key: product-1 cat-2\r\nXKey: home\r\nX-Other: no\r\n"), &why);
  ASSERT_TRUE(file) << why;
  EXPECT_EQ(file->tags, (std::vector<std::string>{"product-1", "cat-2", "home"}));
}

TEST(CacheFile, VariantAndVaryAreRead) {
  std::string why;
  auto file = parseCacheFile(cacheFile("/v", "", "Accept-Encoding", 0xab), &why);
  ASSERT_TRUE(file) << why;
  EXPECT_EQ(file->vary, "Accept-Encoding");
  EXPECT_EQ(file->variant[0], 0xab);
}

TEST(CacheFile, EveryTruncationIsRefusedOrParsedWithoutOverrun) {
  const std::string whole = cacheFile("/k", "Surrogate-Key: a\r\n");
  std::string why;
  for (size_t n = 0; n < 336 + 8; ++n) {
    EXPECT_FALSE(parseCacheFile(whole.substr(0, n), &why)) << n;
  }
  for (size_t n = 336 + 8; n <= whole.size(); ++n) {
    (void) parseCacheFile(whole.substr(0, n), &why);  // ASan watches
  }
}

// Found by fuzz_cache_file: a head cut inside the KEY line, right after a
// "\n" of the key, was read as a file with a shorter key.
TEST(CacheFile, HeadEndingBeforeHeaderStartIsRefused) {
  const std::string whole = cacheFile("/a\nb", "Surrogate-Key: t\r\n");
  const size_t cut = whole.find("/a\n") + 3;
  std::string why;
  EXPECT_FALSE(parseCacheFile(whole.substr(0, cut), &why));
  EXPECT_EQ(why, "shorter than its header says");
  auto file = parseCacheFile(whole, &why);
  ASSERT_TRUE(file) << why;
  EXPECT_EQ(file->key, "/a\nb");
}

TEST(CacheFile, WrongVersionIsRefused) {
  std::string bytes = cacheFile("/k", "");
  bytes[0] = 4;
  std::string why;
  EXPECT_FALSE(parseCacheFile(bytes, &why));
  EXPECT_NE(why.find("version"), std::string::npos);
}

StoredFile stored(const std::string& key, uint8_t variant, std::vector<std::string> tags = {}) {
  StoredFile f;
  f.key = key;
  f.main = md5Of(key);
  f.file = f.main;
  if (variant != 0) f.file[0] ^= variant;
  f.tags = std::move(tags);
  return f;
}

TEST(ZoneIndex, KnowsNothingBeforeAScanCompletes) {
  ZoneIndex index(1 << 20);
  index.record(stored("/a", 0));
  EXPECT_FALSE(index.filesOf(md5Of("/a")));
}

TEST(ZoneIndex, AfterAScanEveryVariantIsKnownAndReportsAddToIt) {
  ZoneIndex index(1 << 20);
  index.beginScan();
  index.record(stored("/a", 2));  // stored while the scan ran
  index.finishScan({stored("/a", 0), stored("/b", 0)}, true);
  index.record(stored("/a", 3));
  auto files = index.filesOf(md5Of("/a"));
  ASSERT_TRUE(files);
  EXPECT_EQ(files->size(), 3u);
  EXPECT_EQ(index.filesOf(md5Of("/nothing"))->size(), 0u);
}

TEST(ZoneIndex, IncompleteScanLeavesTheZoneUnknown) {
  ZoneIndex index(1 << 20);
  index.beginScan();
  index.finishScan({stored("/a", 0)}, false);
  EXPECT_FALSE(index.filesOf(md5Of("/a")));
}

TEST(ZoneIndex, KeyWithTooManyVariantsIsInDoubtUntilPurged) {
  ZoneIndex index(1 << 20);
  index.beginScan();
  index.finishScan({}, true);
  for (int v = 1; v <= 65; ++v) index.record(stored("/many", static_cast<uint8_t>(v)));
  EXPECT_FALSE(index.filesOf(md5Of("/many")));
  EXPECT_FALSE(index.keysWithTag("x"));  // one key in doubt: tags unsure too
  index.forget({md5Of("/many")});
  EXPECT_EQ(index.filesOf(md5Of("/many"))->size(), 0u);
}

TEST(ZoneIndex, EvictionUnderMemoryPressurePutsTheKeyInDoubt) {
  ZoneIndex index(1000);
  index.beginScan();
  index.finishScan({}, true);
  for (int i = 0; i < 20; ++i) index.record(stored("/k" + std::to_string(i), 0));
  EXPECT_LE(index.stats().bytes, 1000u);
  EXPECT_FALSE(index.filesOf(md5Of("/k0")));         // evicted: unsure
  EXPECT_TRUE(index.filesOf(md5Of("/k19")));         // recent: known
}

TEST(ZoneIndex, TagsAndPrefixesFindEveryKey) {
  ZoneIndex index(1 << 20);
  index.beginScan();
  index.finishScan({stored("/shop/a", 0, {"p1"}), stored("/shop/a", 1, {"p1"}),
                    stored("/shop/b", 0, {"p2"}), stored("/blog/c", 0, {"p1"})},
                   true);
  EXPECT_EQ(index.keysWithTag("p1")->size(), 2u);
  EXPECT_EQ(index.keysWithPrefix("/shop/")->size(), 2u);
  index.forget({md5Of("/shop/a")});
  EXPECT_EQ(index.keysWithTag("p1")->size(), 1u);
}

TEST(ZoneScan, FindsEveryFileBelowLevelDirectoriesAndSkipsStrangers) {
  const std::string root = ::testing::TempDir() + "zone-scan-" + std::to_string(getpid());
  std::filesystem::remove_all(root);
  auto write = [&](const std::string& key, const std::string& dir, const std::string& name) {
    std::filesystem::create_directories(root + "/" + dir);
    std::ofstream(root + "/" + dir + "/" + name, std::ios::binary)
        << cacheFile(key, "Surrogate-Key: t\r\n");
  };
  const std::string a = md5ToHex(md5Of("/a"));
  const std::string b = md5ToHex(md5Of("/b"));
  write("/a", a.substr(31, 1) + "/" + a.substr(29, 2), a);
  write("/b", b.substr(31, 1) + "/" + b.substr(29, 2), b);
  write("/tmp", "x", "0000000001");  // a temp file's name
  ScanProgress progress;
  ScanResult result = scanZone(root, progress);
  ASSERT_TRUE(result.complete) << result.error;
  EXPECT_EQ(result.files.size(), 2u);
  EXPECT_EQ(progress.files.load(), 2u);
  for (const auto& f : result.files) {
    EXPECT_EQ(f.main, md5Of(f.key));
    EXPECT_EQ(f.tags, std::vector<std::string>{"t"});
  }
  std::filesystem::remove_all(root);
}

TEST(ZoneScan, MissingDirectoryIsAnError) {
  ScanProgress progress;
  ScanResult result = scanZone("/nonexistent/zone", progress);
  EXPECT_FALSE(result.complete);
  EXPECT_FALSE(result.error.empty());
}

}  // namespace
}  // namespace esi
