// The connector's gzip inflate (nginx-connector/esi_inflate.c) on bodies
// zlib's deflate writes, fed the way NGINX feeds the module: any split of
// the input, any size of output buffer.

#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include <zlib.h>

#include "esi_inflate.h"

namespace {

std::string gzip(const std::string& data, int level = 6) {
  z_stream zs{};
  EXPECT_EQ(deflateInit2(&zs, level, Z_DEFLATED, MAX_WBITS + 16, 9,
                         Z_DEFAULT_STRATEGY),
            Z_OK);
  // deflateBound() leaves out the gzip wrapper at some levels
  std::string out(deflateBound(&zs, data.size()) + 64, '\0');
  zs.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(data.data()));
  zs.avail_in = data.size();
  zs.next_out = reinterpret_cast<Bytef*>(out.data());
  zs.avail_out = out.size();
  EXPECT_EQ(deflate(&zs, Z_FINISH), Z_STREAM_END);
  out.resize(zs.total_out);
  deflateEnd(&zs);
  return out;
}

std::string page(size_t bytes) {
  std::string text;
  for (size_t i = 0; text.size() < bytes; ++i) {
    text += "<li>item " + std::to_string(i * 7919 % 1000) + "</li>";
  }
  text.resize(bytes);
  return text;
}

// zlib's memory through the caller's functions, counted.
struct Heap {
  size_t live = 0;
  size_t peak = 0;
};

void* heapAlloc(void* opaque, unsigned items, unsigned size) {
  auto* heap = static_cast<Heap*>(opaque);
  auto* block = static_cast<size_t*>(std::malloc(sizeof(size_t) + items * size));
  *block = size_t{items} * size;
  heap->live += *block;
  heap->peak = std::max(heap->peak, heap->live);
  return block + 1;
}

void heapFree(void* opaque, void* address) {
  size_t* block = static_cast<size_t*>(address) - 1;
  static_cast<Heap*>(opaque)->live -= *block;
  std::free(block);
}

enum class Verdict { kComplete, kTruncated, kCorrupt };

struct Result {
  std::string bytes;
  Verdict verdict = Verdict::kComplete;
  std::string message;
  uint64_t total = 0;
};

// Feeds body in parts of inSize bytes, each inflated into buffers of
// outSize bytes until it is taken, as the module does.
Result inflateInParts(const std::string& body, size_t inSize, size_t outSize,
                      Heap* heap = nullptr) {
  Heap own;
  if (heap == nullptr) heap = &own;
  Result result;
  esi_inflate_t z;
  EXPECT_EQ(esi_inflate_init(&z, heapAlloc, heapFree, heap), Z_OK);
  std::vector<unsigned char> input(body.begin(), body.end());
  std::vector<unsigned char> buffer(outSize);
  for (size_t at = 0; at < input.size(); at += inSize) {
    unsigned char* in = input.data() + at;
    unsigned char* const inEnd = in + std::min(inSize, input.size() - at);
    for (;;) {
      unsigned char* out = buffer.data();
      const int rc = esi_inflate(&z, &in, inEnd, &out, out + outSize);
      result.bytes.append(reinterpret_cast<char*>(buffer.data()),
                          out - buffer.data());
      if (rc == ESI_INFLATE_CORRUPT) {
        result.verdict = Verdict::kCorrupt;
        result.message = esi_inflate_message(&z);
        result.total = z.total;
        esi_inflate_end(&z);
        return result;
      }
      if (rc == ESI_INFLATE_AGAIN) {
        EXPECT_EQ(in, inEnd);
        break;
      }
      EXPECT_EQ(rc, ESI_INFLATE_FULL);
      EXPECT_EQ(out, buffer.data() + outSize);
    }
  }
  if (!esi_inflate_complete(&z)) result.verdict = Verdict::kTruncated;
  result.total = z.total;
  esi_inflate_end(&z);
  EXPECT_EQ(heap->live, 0u);
  return result;
}

TEST(Inflate, MemberInOneCallIsInflated) {
  const std::string text = page(20000);
  const Result r = inflateInParts(gzip(text), 1 << 20, 1 << 20);
  EXPECT_EQ(r.verdict, Verdict::kComplete);
  EXPECT_EQ(r.bytes, text);
  EXPECT_EQ(r.total, text.size());
}

TEST(Inflate, InputSplitAtEveryByteIsTheSame) {
  const std::string text = page(3000);
  const std::string body = gzip(text);
  for (const size_t outSize : {1, 7, 4096}) {
    const Result r = inflateInParts(body, 1, outSize);
    EXPECT_EQ(r.verdict, Verdict::kComplete) << outSize;
    EXPECT_EQ(r.bytes, text) << outSize;
  }
}

TEST(Inflate, MembersThatFollowEachOtherAreOneBody) {
  const std::string a = page(5000), b = "tail", c;
  const std::string body = gzip(a) + gzip(b, 1) + gzip(c, 0);
  for (const size_t inSize : {size_t{1}, gzip(a).size(), body.size()}) {
    const Result r = inflateInParts(body, inSize, 1000);
    EXPECT_EQ(r.verdict, Verdict::kComplete) << inSize;
    EXPECT_EQ(r.bytes, a + b) << inSize;
    EXPECT_EQ(r.total, a.size() + b.size()) << inSize;
  }
}

TEST(Inflate, EmptyBodyIsNotComplete) {
  EXPECT_EQ(inflateInParts("", 1, 1).verdict, Verdict::kTruncated);
}

TEST(Inflate, BodyCutAnywhereInsideAMemberIsTruncated) {
  const std::string text = page(2000);
  const std::string body = gzip(text) + gzip(text);
  const size_t first = body.size() / 2;
  for (size_t n = 0; n < body.size(); ++n) {
    const Result r = inflateInParts(body.substr(0, n), 64, 512);
    EXPECT_EQ(r.verdict, n == first ? Verdict::kComplete : Verdict::kTruncated)
        << n;
    EXPECT_EQ(r.bytes, (text + text).substr(0, r.bytes.size())) << n;
  }
}

TEST(Inflate, WrongCrcOrLengthIsCorrupt) {
  const std::string body = gzip(page(1000));
  const struct {
    size_t fromEnd;  // the trailer: CRC-32, then ISIZE
    const char* message;
  } cases[] = {{8, "incorrect data check"}, {4, "incorrect length check"}};
  for (const auto& c : cases) {
    std::string broken = body;
    broken[broken.size() - c.fromEnd] ^= 1;
    const Result r = inflateInParts(broken, 100, 100);
    EXPECT_EQ(r.verdict, Verdict::kCorrupt) << c.message;
    EXPECT_EQ(r.message, c.message);
  }
}

TEST(Inflate, BytesAfterTheLastMemberAreCorrupt) {
  const std::string text = page(1000);
  for (const std::string& tail : {std::string("garbage"), std::string(8, '\0')}) {
    const Result r = inflateInParts(gzip(text) + tail, 4096, 4096);
    EXPECT_EQ(r.verdict, Verdict::kCorrupt) << tail;
    EXPECT_EQ(r.bytes, text);
  }
}

TEST(Inflate, OneByteAfterTheLastMemberIsAMemberCut) {
  const std::string text = page(1000);
  const Result r = inflateInParts(gzip(text) + "\n", 4096, 4096);
  EXPECT_EQ(r.verdict, Verdict::kTruncated);
  EXPECT_EQ(r.bytes, text);
}

TEST(Inflate, OtherFormatsAreCorrupt) {
  const std::string text = page(1000);
  std::string zlibFormat(compressBound(text.size()), '\0');
  uLongf length = zlibFormat.size();
  ASSERT_EQ(compress(reinterpret_cast<Bytef*>(zlibFormat.data()), &length,
                     reinterpret_cast<const Bytef*>(text.data()), text.size()),
            Z_OK);
  zlibFormat.resize(length);
  for (const std::string& body : {zlibFormat, text}) {
    const Result r = inflateInParts(body, 4096, 4096);
    EXPECT_EQ(r.verdict, Verdict::kCorrupt);
    EXPECT_EQ(r.bytes, "");
    EXPECT_EQ(r.message, "incorrect header check");
  }
}

TEST(Inflate, RatioBombIsHandedOutOneBufferAtATime) {
  const std::string zeros(64 << 20, '\0');
  std::vector<unsigned char> body;
  {
    const std::string b = gzip(zeros, 9);
    body.assign(b.begin(), b.end());
  }
  ASSERT_LT(body.size(), 100u * 1024);
  Heap heap;
  esi_inflate_t z;
  ASSERT_EQ(esi_inflate_init(&z, heapAlloc, heapFree, &heap), Z_OK);
  std::vector<unsigned char> buffer(4096);
  unsigned char* in = body.data();
  unsigned char* out = buffer.data();
  // All the compressed bytes in one call: it stops at 4 KiB of output.
  EXPECT_EQ(esi_inflate(&z, &in, body.data() + body.size(), &out,
                        buffer.data() + buffer.size()),
            ESI_INFLATE_FULL);
  EXPECT_EQ(out, buffer.data() + buffer.size());
  EXPECT_LT(in, body.data() + body.size());
  uint64_t calls = 1;
  for (int rc = ESI_INFLATE_FULL; rc == ESI_INFLATE_FULL; ++calls) {
    out = buffer.data();
    rc = esi_inflate(&z, &in, body.data() + body.size(), &out,
                     buffer.data() + buffer.size());
    ASSERT_NE(rc, ESI_INFLATE_CORRUPT);
  }
  EXPECT_TRUE(esi_inflate_complete(&z));
  EXPECT_EQ(z.total, zeros.size());
  EXPECT_EQ(calls, zeros.size() / buffer.size() + 1);
  // zlib's state and its 32 KiB window, whatever the ratio.
  EXPECT_LT(heap.peak, 48u * 1024);
  esi_inflate_end(&z);
  EXPECT_EQ(heap.live, 0u);
}

}  // namespace
