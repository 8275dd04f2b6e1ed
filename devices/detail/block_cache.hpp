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
// So blocks are kept by size class (capacity_for: at most 1/8 more than asked), a request may take
// a kept block of a larger class below twice its own (a bf16 and an fp32 tensor of one shape),
// and a block that would take the cache past its budget makes room by unmapping the blocks
// released longest ago.
//
// The budget is the larger of a fixed cap and what keeps the blocks in use plus the kept ones
// within the most ever in use at once (the high-water mark). With the cap alone, the end of an
// iteration (activations and gradients freed together) overflowed it, and every later iteration
// mapped the same ~0.85 GiB afresh: the mid-size run mapped 5.1 GiB over four iterations, 3.1 GiB
// now, of which 2.8 GiB in the first (bench/README.md, "Host blocks kept to the high-water
// mark"). Held blocks never exceed what the old rule allowed: in use + kept stays within
// max(in use + cap, high-water mark), and the mark is at most the peak in use.
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

  // A kept block of `capacity` bytes on `node`, the one released last, now in use; false when
  // none is kept.
  bool take(int node, std::size_t capacity, Placement& out);
  // A block of `capacity` bytes mapped afresh is in use (kept blocks beyond the budget are
  // released).
  void mapped(std::size_t capacity);
  // Keeps `p` (by p.requested_node and p.capacity), no longer in use. False, keeping nothing and
  // `p` still counted in use, when it alone is larger than the budget; otherwise the oldest kept
  // blocks are released until it fits.
  bool keep(const Placement& p);
  // A block of `capacity` bytes in use is unmapped without the cache (pinned, or refused by keep).
  void unmapped(std::size_t capacity);
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
  // Releases the oldest kept blocks, into `victims`, until `incoming` more fit the budget.
  void make_room(std::size_t incoming, std::vector<Placement>& victims);
  std::size_t budget() const;

  std::size_t cached_ = 0;
  std::size_t peak_ = 0;
  // Bytes of blocks handed out and not yet returned, and the most at once. A block kept or
  // unmapped that was never counted (tests drive the cache directly) does not take it below 0.
  std::size_t in_use_ = 0;
  std::size_t in_use_peak_ = 0;
};

}  // namespace nodeemu::numa::detail
