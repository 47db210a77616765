// The shared memory one worker connection uses: a sealed memfd holding both
// rings, and the two eventfds that wake each side.  esid creates it; the
// worker receives the three fds with the Welcome.

#pragma once

#include <cstddef>
#include <cstdint>

#include "esi/ring.h"
#include "base/unique_fd.h"

namespace esi {

class SharedRings {
 public:
  // Throws std::system_error when the kernel refuses any of it.
  explicit SharedRings(uint32_t ringSize);
  ~SharedRings();
  SharedRings(const SharedRings&) = delete;
  SharedRings& operator=(const SharedRings&) = delete;

  int memfd() const { return memfd_.get(); }
  int workerEventfd() const { return workerEvent_.get(); }
  int daemonEventfd() const { return daemonEvent_.get(); }
  uint32_t ringSize() const { return ringSize_; }

  esi_ring_t& requests() { return requests_; }    // we consume
  esi_ring_t& responses() { return responses_; }  // we produce
  // The connection's pin table (ESI_PIN_SLOTS counts) after the rings.
  uint64_t pinsOffset() const { return esi_shm_pins_offset(ringSize_); }

  void wakeWorker();
  // Makes our own eventfd readable: serve again on the loop's next turn.
  void wakeDaemon();
  // Resets our eventfd after a wake-up.
  void clearWakeups();

 private:
  const uint32_t ringSize_;
  UniqueFd memfd_;
  UniqueFd workerEvent_;
  UniqueFd daemonEvent_;
  void* map_ = nullptr;
  size_t mapSize_ = 0;
  esi_ring_t requests_{};
  esi_ring_t responses_{};
};

}  // namespace esi
