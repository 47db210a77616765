// The connector's gzip inflate (nginx-connector/esi_inflate.c) on any bytes,
// fed as NGINX feeds it: the body in buffers of any size, each inflated into
// output buffers of any size until it is taken.  It must agree with zlib
// inflating the whole body at once: the same bytes out and the same verdict
// (whole members, cut inside one, or corrupt), never write past the space
// it is given, and hold no more than zlib's own state however far the body
// inflates.
//
// Input: 8 header bytes, the seed of the buffer sizes; then the body.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>

#include <zlib.h>

#include "esi_inflate.h"
#include "fuzz_check.h"

namespace {

enum class Verdict { kOk, kTruncated, kCorrupt };

// Output compared per input: past it a ratio bomb only costs time.
constexpr size_t kOutputLimit = 1 << 16;

// zlib's inflate state and its 32 KiB window (zlib's zconf.h), with room.
constexpr size_t kStateLimit = 48 * 1024;

struct Inflated {
  std::string bytes;
  Verdict verdict = Verdict::kOk;
  bool overLimit = false;  // stopped at kOutputLimit: bytes is a prefix
};

// The whole body in one call, members one after another, as gzip -d reads.
Inflated reference(const uint8_t* data, size_t size) {
  Inflated result;
  z_stream zs{};
  FUZZ_CHECK(inflateInit2(&zs, MAX_WBITS + 16) == Z_OK);
  result.bytes.resize(kOutputLimit + 1);
  zs.next_in = const_cast<Bytef*>(data);
  zs.avail_in = static_cast<uInt>(size);
  zs.next_out = reinterpret_cast<Bytef*>(result.bytes.data());
  zs.avail_out = static_cast<uInt>(result.bytes.size());
  for (;;) {
    const int rc = inflate(&zs, Z_NO_FLUSH);
    if (rc == Z_STREAM_END && zs.avail_in == 0) break;
    if (rc == Z_STREAM_END) {
      FUZZ_CHECK(inflateReset(&zs) == Z_OK);
    } else if (rc != Z_OK && rc != Z_BUF_ERROR) {
      result.verdict = Verdict::kCorrupt;
      break;
    } else if (zs.avail_out == 0) {
      break;
    } else if (zs.avail_in == 0) {
      result.verdict = Verdict::kTruncated;
      break;
    } else if (rc == Z_BUF_ERROR) {
      result.verdict = Verdict::kCorrupt;  // no progress with both
      break;
    }
  }
  result.bytes.resize(result.bytes.size() - zs.avail_out);
  result.overLimit = result.bytes.size() > kOutputLimit;
  inflateEnd(&zs);
  return result;
}

// splitmix64: the sizes of the buffers, from the input's header.
struct Sizes {
  uint64_t state;

  uint64_t next() {
    uint64_t z = (state += 0x9e3779b97f4a7c15);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9;
    z = (z ^ (z >> 27)) * 0x94d049bb133111eb;
    return z ^ (z >> 31);
  }

  // 0 to 2^12 - 1, small ones as likely as large.
  size_t input() { return next() % (size_t{1} << (next() % 13)); }
  // 1 to 2^14.
  size_t output() { return 1 + next() % (size_t{1} << (next() % 15)); }
};

// zlib's allocations through the caller's functions, as the module's pool.
struct Heap {
  size_t live = 0;
  size_t peak = 0;
};

void* heapAlloc(void* opaque, unsigned items, unsigned size) {
  auto* heap = static_cast<Heap*>(opaque);
  const size_t bytes = size_t{items} * size;
  auto* block = static_cast<size_t*>(std::malloc(sizeof(size_t) + bytes));
  if (block == nullptr) return nullptr;
  *block = bytes;
  heap->live += bytes;
  heap->peak = std::max(heap->peak, heap->live);
  return block + 1;
}

void heapFree(void* opaque, void* address) {
  auto* heap = static_cast<Heap*>(opaque);
  size_t* block = static_cast<size_t*>(address) - 1;
  heap->live -= *block;
  std::free(block);
}

// The body in buffers of random sizes, each copied to memory of exactly its
// size (so that ASan sees a read past it), inflated into output buffers of
// random sizes, also exact.
Inflated inChunks(const uint8_t* data, size_t size, Sizes sizes, Heap& heap) {
  Inflated result;
  esi_inflate_t z;
  FUZZ_CHECK(esi_inflate_init(&z, heapAlloc, heapFree, &heap) == Z_OK);

  size_t taken = 0;
  bool corrupt = false;
  while (!corrupt && !result.overLimit && taken < size) {
    const size_t length = std::min(sizes.input(), size - taken);
    const std::unique_ptr<uint8_t[]> chunk(new uint8_t[length]);
    std::memcpy(chunk.get(), data + taken, length);
    taken += length;
    uint8_t* in = chunk.get();
    uint8_t* const inEnd = in + length;

    for (;;) {
      const size_t space = sizes.output();
      const std::unique_ptr<uint8_t[]> buffer(new uint8_t[space]);
      uint8_t* out = buffer.get();
      uint8_t* const outEnd = out + space;
      const uint8_t* const inBefore = in;

      const int rc = esi_inflate(&z, &in, inEnd, &out, outEnd);

      FUZZ_CHECK(in >= inBefore && in <= inEnd);
      FUZZ_CHECK(out >= buffer.get() && out <= outEnd);
      FUZZ_CHECK(heap.live <= kStateLimit);
      result.bytes.append(reinterpret_cast<char*>(buffer.get()),
                          out - buffer.get());
      if (result.bytes.size() > kOutputLimit) {
        result.overLimit = true;
        break;
      }
      if (rc == ESI_INFLATE_CORRUPT) {
        corrupt = true;
        break;
      }
      if (rc == ESI_INFLATE_AGAIN) {
        FUZZ_CHECK(in == inEnd);
        break;
      }
      FUZZ_CHECK(rc == ESI_INFLATE_FULL);
      FUZZ_CHECK(out == outEnd);
    }
  }

  if (corrupt) {
    result.verdict = Verdict::kCorrupt;
  } else if (!esi_inflate_complete(&z)) {
    result.verdict = Verdict::kTruncated;
  }
  FUZZ_CHECK(z.total == result.bytes.size());
  esi_inflate_end(&z);
  return result;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 8) return 0;
  Sizes sizes{0};
  std::memcpy(&sizes.state, data, 8);
  data += 8;
  size -= 8;

  const Inflated whole = reference(data, size);
  Heap heap;
  const Inflated chunked = inChunks(data, size, sizes, heap);
  FUZZ_CHECK(heap.live == 0);

  if (whole.overLimit || chunked.overLimit) {
    // Both went past the limit, the same way up to it.
    FUZZ_CHECK(whole.overLimit && chunked.overLimit);
    FUZZ_CHECK(chunked.bytes.compare(0, kOutputLimit, whole.bytes, 0,
                                     kOutputLimit) == 0);
    return 0;
  }
  FUZZ_CHECK(chunked.verdict == whole.verdict);
  FUZZ_CHECK(chunked.bytes == whole.bytes);
  return 0;
}
