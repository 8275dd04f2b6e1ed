// NUMA-placed memory through libnuma, with the placement checked rather than trusted:
// numa_alloc_onnode on a node that does not exist still hands back node-0 memory and only
// prints "mbind: Invalid argument", so every allocation is touched and its pages' real node is
// read back with move_pages.
#pragma once

#include <cstddef>
#include <string>

namespace nodeemu::numa {

bool available();  // libnuma usable on this kernel
int node_count();  // real NUMA nodes with memory (>= 1)
bool node_exists(int node);

struct Placement {
  void* ptr = nullptr;
  std::size_t bytes = 0;     // asked for
  std::size_t capacity = 0;  // mapped (bytes rounded up to the block cache's size class)
  int requested_node = -1;
  int actual_node = -1;  // where the first page really is; -1 if unknown
  bool locked = false;   // pinned (mlock) for pinned host memory
};

// Allocates `bytes` on real NUMA node `node`, zero-filled. Throws HostError if the node does not
// exist, and OutOfMemory-like HostError if the host has no memory left. When libnuma is not
// usable, falls back to ordinary page-aligned memory and reports actual_node = -1.
//
// Recycled unpinned blocks are kept (up to 1 GiB, by node and size class, the oldest given up
// first: devices/detail/block_cache.hpp) and handed out again, as a caching allocator would:
// faulting in and checking fresh pages costs several times the copy that fills them.
// `zeroed = false` skips the zero-fill of a reused block, for memory the caller overwrites at
// once (a reload's destination).
Placement allocate_on_node(std::size_t bytes, int node, bool zeroed = true);
// The same, then mlock()ed: pinned host memory for copy engines. Failing to lock is not an
// error (RLIMIT_MEMLOCK); `locked` says what happened.
Placement allocate_pinned_on_node(std::size_t bytes, int node);
void release(const Placement& p);
// Like release, but an unpinned block may be kept for allocate_on_node to hand out again.
void recycle(const Placement& p);
// The bytes of released blocks kept for reuse: the most held at once since the last
// reset_kept_peak() (a run's report bounds their share of its peak host memory by it).
std::size_t kept_peak_bytes();
void reset_kept_peak();

// The real NUMA node of the page holding `addr`, or -1 if the kernel cannot say.
int node_of(const void* addr);

// The last warning libnuma printed (captured instead of going to stderr), or "".
std::string last_warning();

}  // namespace nodeemu::numa
