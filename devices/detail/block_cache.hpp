// Internal (devices/numa_memory.cpp): the unpinned host blocks that emulated device memory let go
// of, kept to be handed out again, as a caching allocator keeps freed device memory.
//
// Why: a fresh block costs its page faults (every page is touched to check its placement) and a
// munmap at the end. A functional training step frees and allocates the same activation sizes
// every micro-batch; with blocks kept only at their exact size and refused once the cache was
// full, the mid-size functional run (bench_emu BM_FunctionalMidSize) still mapped 5.5 GiB afresh:
// the cache had filled with the odd sizes of experts' buffers (a different token count each
// micro-batch), and faulting was a third of the run's samples.
//
// So blocks are kept by size class (capacity_for: at most 1/8 more than asked), and a block that
// would take the cache past its cap makes room by unmapping the blocks released longest ago.
#pragma once

#include <cstddef>
#include <functional>
#include <list>
#include <map>
#include <mutex>
#include <utility>
#include <vector>

#include "devices/numa_memory.hpp"

namespace nodeemu::numa::detail {

// The size a block asked for `bytes` is mapped with: whole pages, and above 16 pages rounded up
// to an eighth of its power of two, so that a block is reused for any size of its class.
std::size_t capacity_for(std::size_t bytes, std::size_t page);

class BlockCache {
 public:
  // `release` unmaps a block the cache gives up (called without the cache's lock held).
  BlockCache(std::size_t cap_bytes, std::function<void(const Placement&)> release);
  BlockCache(const BlockCache&) = delete;
  BlockCache& operator=(const BlockCache&) = delete;

  // A kept block of `capacity` bytes on `node`, the one released last; false when none is kept.
  bool take(int node, std::size_t capacity, Placement& out);
  // Keeps `p` (by p.requested_node and p.capacity). False, keeping nothing, when it alone is
  // larger than the cap; otherwise the oldest kept blocks are released until it fits.
  bool keep(const Placement& p);
  std::size_t cached_bytes() const;
  // The most the cache held at once since it was made or since reset_peak() (which restarts it
  // from what it holds now): its share of a run's peak host memory is at most this.
  std::size_t peak_bytes() const;
  void reset_peak();

 private:
  using Key = std::pair<int, std::size_t>;
  const std::size_t cap_;
  const std::function<void(const Placement&)> release_;
  mutable std::mutex mu_;
  std::list<Placement> oldest_first_;  // every kept block, in the order they were released
  std::map<Key, std::vector<std::list<Placement>::iterator>> by_key_;  // each list oldest first
  std::size_t cached_ = 0;
  std::size_t peak_ = 0;
};

}  // namespace nodeemu::numa::detail
