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
  std::size_t bytes = 0;
  int requested_node = -1;
  int actual_node = -1;  // where the first page really is; -1 if unknown
  bool locked = false;   // pinned (mlock) for pinned host memory
};

// Allocates `bytes` on real NUMA node `node`, zero-filled. Throws HostError if the node does not
// exist, and OutOfMemory-like HostError if the host has no memory left. When libnuma is not
// usable, falls back to ordinary page-aligned memory and reports actual_node = -1.
Placement allocate_on_node(std::size_t bytes, int node);
// The same, then mlock()ed: pinned host memory for copy engines. Failing to lock is not an
// error (RLIMIT_MEMLOCK); `locked` says what happened.
Placement allocate_pinned_on_node(std::size_t bytes, int node);
void release(const Placement& p);

// The real NUMA node of the page holding `addr`, or -1 if the kernel cannot say.
int node_of(const void* addr);

// The last warning libnuma printed (captured instead of going to stderr), or "".
std::string last_warning();

}  // namespace nodeemu::numa
