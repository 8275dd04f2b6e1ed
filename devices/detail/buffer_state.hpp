// Internal state behind a Buffer handle.
//
// Two lifetimes meet here. BufferGuard is the user's side: when the last user handle goes, the
// device's virtual account releases the bytes once the last operation that used them completes.
// BufferState is shared with the operations themselves: the real bytes are freed when the last
// functional task that used them has run.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "devices/buffer.hpp"
#include "devices/numa_memory.hpp"
#include "devices/small_vector.hpp"

namespace nodeemu::detail {

class Engine;
using OpId = std::uint32_t;

struct BufferState : std::enable_shared_from_this<BufferState> {
  MemoryKind kind = MemoryKind::Device;
  int device = -1;
  int numa = -1;
  std::size_t bytes = 0;
  bool meta = false;
  // False for memory inside an accounted reservation (Device::workspace): never accounted again.
  bool accounted = true;
  std::vector<std::int64_t> shape;
  numa::Placement placement;  // ptr is null for meta buffers
  // Operations that used it and may still be running (engine-pruned). Inline: a buffer has a
  // few at a time, and every buffer's first use allocated (1.3 allocations per operation of a
  // meta step).
  boost::container::small_vector<OpId, 4> uses;
  int pool_track = -1;  // the stream whose pool it came from; -1: the compute stream
  ~BufferState() {
    if (placement.ptr) numa::recycle(placement);
  }
};

class BufferGuard {
 public:
  BufferGuard(std::shared_ptr<BufferState> s, std::weak_ptr<Engine> engine)
      : state_(std::move(s)), engine_(std::move(engine)) {}
  ~BufferGuard();
  BufferGuard(const BufferGuard&) = delete;
  BufferGuard& operator=(const BufferGuard&) = delete;
  const std::shared_ptr<BufferState>& state() const { return state_; }

 private:
  std::shared_ptr<BufferState> state_;
  std::weak_ptr<Engine> engine_;  // a Buffer may outlive its Node
};

}  // namespace nodeemu::detail
