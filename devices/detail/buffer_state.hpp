// Internal state behind a Buffer handle.
//
// Two lifetimes meet here. The user's handles (Buffer, counted in BufferHandles): when the last
// one goes, the device's virtual account releases the bytes once the last operation that used
// them completes. The state itself is shared with the operations (shared_ptr, through
// shared_from_this): the real bytes are freed when the last functional task that used them has
// run. The handles together hold one share of it (`kept_by_handles`).
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

struct BufferState : BufferHandles, std::enable_shared_from_this<BufferState> {
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
  int pool_track = -1;           // the stream whose pool it came from; -1: the compute stream
  std::weak_ptr<Engine> engine;  // whose account it is in; a Buffer may outlive its Node
  // The handles' share of the state, from the first handle until the last one is dropped.
  std::shared_ptr<BufferState> kept_by_handles;
  ~BufferState() {
    if (placement.ptr) numa::recycle(placement);
  }
};

}  // namespace nodeemu::detail
