// The shared-memory ring (include/esi/ring.h): messages/s and round trips.
//
//   BM_RingSameThread      reserve + copy + commit + peek + release on one
//                          thread: the ring's own bookkeeping per message
//   BM_RingStream          a producer thread and a consumer thread, both
//                          spinning: messages/s through one ring
//   BM_RingRoundTripSpin   request on one ring, answer on the other, both
//                          sides spinning: the floor of a round trip
//   BM_RingRoundTripWake   the same with the real wake-up rule: a side with
//                          nothing to read advertises it and sleeps on an
//                          eventfd, and the writer wakes it (what NGINX and
//                          esid do; NOTES measured ~11 us between processes)
//
// The two sides are threads of one process here, sharing an ordinary
// allocation laid out like the memfd region; the ring code is the same.

#include "esi/ring.h"

#include <benchmark/benchmark.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

namespace {

// The region esid maps: header page, then the two rings.
class Region {
 public:
  explicit Region(uint32_t ringSize) : size_(ringSize) {
    mem_ = static_cast<uint8_t*>(
        std::aligned_alloc(4096, esi_shm_size(ringSize)));
    std::memset(mem_, 0, esi_shm_size(ringSize));
    header_ = reinterpret_cast<esi_shm_header_t*>(mem_);
    header_->magic = ESI_SHM_MAGIC;
    header_->ring_size = ringSize;
  }
  ~Region() { std::free(mem_); }
  Region(const Region&) = delete;
  Region& operator=(const Region&) = delete;

  // One view of a ring; 0 is to_daemon, 1 is to_worker.
  esi_ring_t view(int which) {
    esi_ring_t r;
    esi_ring_attach(&r, which == 0 ? &header_->to_daemon : &header_->to_worker,
                    mem_ + ESI_SHM_HEADER_SIZE + which * size_, size_);
    return r;
  }

 private:
  uint32_t size_;
  uint8_t* mem_;
  esi_shm_header_t* header_;
};

constexpr uint32_t kRingSize = 1u << 20;  // esid's default --ring-size

inline void relax(unsigned& spins) {
  if (++spins < 64) {
    __builtin_ia32_pause();
  } else {
    spins = 0;
    std::this_thread::yield();  // two cores, shared: let the other side run
  }
}

bool send(esi_ring_t& r, const void* payload, uint32_t len) {
  void* dst = esi_ring_reserve(&r, len);
  if (dst == nullptr) return false;
  std::memcpy(dst, payload, len);
  return esi_ring_commit(&r, len) != 0;
}

void BM_RingSameThread(benchmark::State& state) {
  const auto len = static_cast<uint32_t>(state.range(0));
  Region region(kRingSize);
  esi_ring_t producer = region.view(0);
  esi_ring_t consumer = region.view(0);
  std::vector<uint8_t> payload(len, 'x');
  for (auto _ : state) {
    send(producer, payload.data(), len);
    const uint8_t* msg;
    uint32_t got;
    if (esi_ring_peek(&consumer, &msg, &got) != ESI_RING_OK || got != len) {
      state.SkipWithError("ring lost a message");
      break;
    }
    benchmark::DoNotOptimize(msg[got - 1]);
    esi_ring_release(&consumer);
  }
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations()));
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * len);
}

void BM_RingStream(benchmark::State& state) {
  const auto len = static_cast<uint32_t>(state.range(0));
  Region region(kRingSize);
  esi_ring_t producer = region.view(0);
  esi_ring_t consumer = region.view(0);
  std::atomic<bool> stop{false};
  std::thread writer([&] {
    std::vector<uint8_t> payload(len, 'x');
    unsigned spins = 0;
    while (!stop.load(std::memory_order_relaxed)) {
      if (esi_ring_reserve(&producer, len) == nullptr) {
        relax(spins);
        continue;
      }
      send(producer, payload.data(), len);
    }
  });
  unsigned spins = 0;
  for (auto _ : state) {
    const uint8_t* msg;
    uint32_t got;
    esi_ring_rc_e rc;
    while ((rc = esi_ring_peek(&consumer, &msg, &got)) == ESI_RING_EMPTY) {
      relax(spins);
    }
    if (rc != ESI_RING_OK || got != len) {
      state.SkipWithError("ring corrupt");
      break;
    }
    benchmark::DoNotOptimize(msg[got - 1]);
    esi_ring_release(&consumer);
  }
  stop = true;
  writer.join();
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations()));
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * len);
}

// Request on ring 0, answer on ring 1; `wake` selects eventfd sleeping.
void roundTrip(benchmark::State& state, bool wake) {
  const auto len = static_cast<uint32_t>(state.range(0));
  Region region(kRingSize);
  esi_ring_t requests = region.view(0), requestsIn = region.view(0);
  esi_ring_t answers = region.view(1), answersIn = region.view(1);
  const int toEcho = eventfd(0, EFD_CLOEXEC);
  const int toMain = eventfd(0, EFD_CLOEXEC);
  std::atomic<bool> stop{false};

  auto poke = [](int fd) {
    uint64_t one = 1;
    if (write(fd, &one, sizeof one) != sizeof one) std::abort();
  };
  auto sleepOn = [](int fd) {
    uint64_t n;
    if (read(fd, &n, sizeof n) != sizeof n) std::abort();
  };
  // Wait for one message on `ring`: spin, or advertise and sleep.
  auto receive = [&](esi_ring_t& ring, int fd, const uint8_t** msg,
                     uint32_t* got) {
    unsigned spins = 0;
    for (;;) {
      esi_ring_rc_e rc = esi_ring_peek(&ring, msg, got);
      if (rc != ESI_RING_EMPTY) return rc == ESI_RING_OK;
      if (stop.load(std::memory_order_relaxed)) return false;
      if (!wake) {
        relax(spins);
      } else if (esi_ring_wait_data(&ring)) {
        sleepOn(fd);
      }
    }
  };

  std::thread echo([&] {
    std::vector<uint8_t> payload(len, 'a');
    const uint8_t* msg;
    uint32_t got;
    while (receive(requestsIn, toEcho, &msg, &got)) {
      esi_ring_release(&requestsIn);
      if (send(answers, payload.data(), len) && wake) poke(toMain);
    }
  });

  std::vector<uint8_t> payload(len, 'q');
  for (auto _ : state) {
    if (send(requests, payload.data(), len) && wake) poke(toEcho);
    const uint8_t* msg;
    uint32_t got;
    if (!receive(answersIn, toMain, &msg, &got) || got != len) {
      state.SkipWithError("no answer");
      break;
    }
    esi_ring_release(&answersIn);
  }
  stop = true;
  poke(toEcho);
  echo.join();
  close(toEcho);
  close(toMain);
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations()));
}

void BM_RingRoundTripSpin(benchmark::State& state) { roundTrip(state, false); }
void BM_RingRoundTripWake(benchmark::State& state) { roundTrip(state, true); }

BENCHMARK(BM_RingSameThread)->Arg(64)->Arg(1024)->Arg(16 << 10);
BENCHMARK(BM_RingStream)->Arg(64)->Arg(1024)->Arg(16 << 10)->UseRealTime();
BENCHMARK(BM_RingRoundTripSpin)->Arg(64)->UseRealTime();
BENCHMARK(BM_RingRoundTripWake)->Arg(64)->UseRealTime();

}  // namespace

BENCHMARK_MAIN();
