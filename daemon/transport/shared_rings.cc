#include "transport/shared_rings.h"

#include <fcntl.h>
#include <sys/eventfd.h>
#include <sys/mman.h>

#include <cerrno>
#include <cstring>
#include <system_error>

#include "esi_wire_layout.h"

namespace esi {

namespace {

[[noreturn]] void fail(const char* what) {
  throw std::system_error(errno, std::generic_category(), what);
}

}  // namespace

SharedRings::SharedRings(uint32_t ringSize) : ringSize_(ringSize) {
  if (!esi_ring_size_valid(ringSize)) {
    throw std::invalid_argument("ring size must be a power of two in [4 KiB, 64 MiB]");
  }
  mapSize_ = esi_shm_size(ringSize);

  memfd_.reset(memfd_create("esid-rings", MFD_CLOEXEC | MFD_ALLOW_SEALING));
  if (!memfd_) fail("memfd_create");
  if (ftruncate(memfd_.get(), static_cast<off_t>(mapSize_)) != 0) fail("ftruncate");
  // The worker refuses rings that could shrink under it (SIGBUS).
  if (fcntl(memfd_.get(), F_ADD_SEALS,
            F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) {
    fail("F_ADD_SEALS");
  }
  map_ = mmap(nullptr, mapSize_, PROT_READ | PROT_WRITE, MAP_SHARED,
              memfd_.get(), 0);
  if (map_ == MAP_FAILED) {
    map_ = nullptr;
    fail("mmap");
  }

  workerEvent_.reset(eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  daemonEvent_.reset(eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!workerEvent_ || !daemonEvent_) fail("eventfd");

  auto* header = static_cast<esi_shm_header_t*>(map_);
  header->magic = ESI_SHM_MAGIC;
  header->version = ESI_WIRE_PROTOCOL_VERSION;
  header->ring_size = ringSize;
  // Both consumers start asleep, so the first record of either side wakes
  // its peer.
  header->to_daemon.consumer_waiting = 1;
  header->to_worker.consumer_waiting = 1;

  auto* base = static_cast<uint8_t*>(map_) + ESI_SHM_HEADER_SIZE;
  esi_ring_attach(&requests_, &header->to_daemon, base, ringSize);
  esi_ring_attach(&responses_, &header->to_worker, base + ringSize, ringSize);
}

SharedRings::~SharedRings() {
  if (map_ != nullptr) munmap(map_, mapSize_);
}

void SharedRings::wakeWorker() {
  const uint64_t one = 1;
  // EAGAIN means the counter is already non-zero: the worker will wake.
  [[maybe_unused]] ssize_t n = write(workerEvent_.get(), &one, sizeof(one));
}

void SharedRings::wakeDaemon() {
  const uint64_t one = 1;
  [[maybe_unused]] ssize_t n = write(daemonEvent_.get(), &one, sizeof(one));
}

void SharedRings::clearWakeups() {
  uint64_t count;
  [[maybe_unused]] ssize_t n = read(daemonEvent_.get(), &count, sizeof(count));
}

}  // namespace esi
