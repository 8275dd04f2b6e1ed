#include "offload/pinned_host_pool.hpp"

#include <algorithm>

#include "devices/device.hpp"

namespace nodeemu::offload {

PinnedHostPool::PinnedHostPool(Device& device) : device_(device) {}

// Sizes round up to 1 MiB (or a power of two below that), so that micro-batches whose routing
// moves a few rows more or less still reuse each other's buffers.
std::size_t PinnedHostPool::size_class(std::size_t bytes) {
  constexpr std::size_t kMiB = std::size_t(1) << 20;
  if (bytes >= kMiB) return (bytes + kMiB - 1) / kMiB * kMiB;
  std::size_t c = 256;
  while (c < bytes) c *= 2;
  return c;
}

PinnedHostPool::Lease PinnedHostPool::acquire(std::size_t bytes) {
  const std::size_t cls = size_class(bytes);
  Lease lease;
  auto it = free_.find(cls);
  if (it != free_.end()) {
    lease = std::move(it->second);
    free_.erase(it);
  } else {
    lease.buffer = device_.allocate_host(cls, true);
    reserved_ += cls;
    if (real_numa_ < 0) real_numa_ = lease.buffer.real_numa();
  }
  return lease;
}

void PinnedHostPool::release(Lease lease) {
  const std::size_t cls = lease.buffer.bytes();
  free_.emplace(cls, std::move(lease));
}

int PinnedHostPool::numa() const {
  return device_.placement().process_numa;
}

int PinnedHostPool::real_numa() const {
  return real_numa_;
}

}  // namespace nodeemu::offload
