// The pinned host memory one rank offloads into: cudaMallocHost'd staging buffers, kept and
// reused by size (Megatron keeps a pool for the same reason: pinning is slow, and a step needs
// the same sizes again). The buffers live on the rank's host NUMA node
// (DevicePlacement::process_numa): with bindpcie the GPU's own socket, without it wherever the
// unbound process landed.
//
// Reuse is ordered, not trusted: a buffer comes back with the event of the last copy that read
// it, and whoever takes it next makes its stream wait for that event first.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <vector>

#include "devices/buffer.hpp"
#include "devices/event.hpp"

namespace nodeemu {
class Device;
}

namespace nodeemu::offload {

class PinnedHostPool {
 public:
  explicit PinnedHostPool(Device& device);
  PinnedHostPool(const PinnedHostPool&) = delete;
  PinnedHostPool& operator=(const PinnedHostPool&) = delete;

  struct Lease {
    Buffer buffer;
    // Wait for this before writing the buffer; null when nothing read it yet. Shared, so that
    // its address (the ordering checker's key) survives the lease moving around.
    std::shared_ptr<Event> last_read;
  };
  // A pinned buffer of at least `bytes`, from the free list when one fits.
  Lease acquire(std::size_t bytes);
  // Gives a buffer back once `last_read` (recorded after the last copy out of it) completes.
  void release(Lease lease);

  int numa() const;       // emulated NUMA node
  int real_numa() const;  // where the bytes really are (-1 unknown or meta)
  std::uint64_t reserved_bytes() const { return reserved_; }  // pinned in all

 private:
  static std::size_t size_class(std::size_t bytes);
  Device& device_;
  std::multimap<std::size_t, Lease> free_;  // by size class
  std::uint64_t reserved_ = 0;
  int real_numa_ = -1;
};

}  // namespace nodeemu::offload
