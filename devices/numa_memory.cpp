// When libnuma is not usable (numa_available() < 0: a kernel without NUMA support, or a seccomp
// profile that forbids get_mempolicy), memory comes from a plain anonymous mmap: page-aligned and
// zero like libnuma's, but with no placement, so actual_node is -1 and the only node is 0.
#include "devices/numa_memory.hpp"

#include <numa.h>
#include <numaif.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <vector>

#include "devices/detail/block_cache.hpp"
#include "devices/errors.hpp"
#include "devices/units.hpp"

namespace nodeemu::numa {
namespace {

// libnuma can warn from its own constructor, before this file's dynamic initialisers have run,
// so the capture state must be constant-initialised (constinit checks that) and never destroyed.
constinit std::mutex g_warning_mutex;
constinit char g_last_warning[512] = {};

void record_warning(const char* text) {
  std::lock_guard<std::mutex> lock(g_warning_mutex);
  std::snprintf(g_last_warning, sizeof g_last_warning, "%s", text);
  // libnuma's messages end in a newline meant for stderr; last_warning() is one line.
  size_t len = std::strlen(g_last_warning);
  while (len > 0 && (g_last_warning[len - 1] == '\n' || g_last_warning[len - 1] == '\r'))
    g_last_warning[--len] = '\0';
}

std::size_t page_size() {
  static const std::size_t size = static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
  return size;
}

// The nodes a caller may place memory on: allowed by this process's cpuset (Mems_allowed) and
// holding memory. CPU-only nodes are left out because numa_alloc_onnode cannot honour them.
// Read once: memory hot-plug during a run is not something the emulator follows.
std::vector<int> discover_nodes() {
  if (!available()) return {0};
  std::vector<int> nodes;
  const int max_node = numa_max_node();
  for (int n = 0; n <= max_node; ++n) {
    if (!numa_bitmask_isbitset(numa_all_nodes_ptr, static_cast<unsigned>(n))) continue;
    if (numa_node_size64(n, nullptr) <= 0) continue;
    nodes.push_back(n);
  }
  // Without a readable /sys the sizes are unknown; node 0 is where the kernel's default policy
  // puts memory anyway, and node_count() promises at least one node.
  if (nodes.empty()) nodes.push_back(0);
  return nodes;
}

const std::vector<int>& nodes() {
  static const std::vector<int> all = discover_nodes();
  return all;
}

std::string describe_nodes() {
  const std::vector<int>& all = nodes();
  if (all.size() == 1) return "only node " + std::to_string(all[0]);
  if (all.back() - all.front() + 1 == static_cast<int>(all.size()))
    return "nodes " + std::to_string(all.front()) + ".." + std::to_string(all.back());
  std::string out = "nodes ";
  for (size_t i = 0; i < all.size(); ++i) out += (i > 0 ? "," : "") + std::to_string(all[i]);
  return out;
}

}  // namespace

bool available() {
  static const bool usable = numa_available() >= 0;
  return usable;
}

int node_count() {
  return static_cast<int>(nodes().size());
}

bool node_exists(int node) {
  for (int n : nodes())
    if (n == node) return true;
  return false;
}

namespace {

void unmap(const Placement& p) {
  if (p.ptr == nullptr) return;
  if (p.locked) munlock(p.ptr, p.capacity);
  // available() cannot change during a run, so it tells which allocator made p.
  if (available())
    numa_free(p.ptr, p.capacity);
  else
    munmap(p.ptr, p.capacity);
}

// Released unpinned blocks: see allocate_on_node and detail/block_cache.hpp.
numa::detail::BlockCache& block_cache() {
  // Never destroyed: released blocks may outlive statics.
  static auto* c = new numa::detail::BlockCache(std::size_t(1) << 30, unmap);
  return *c;
}

}  // namespace

Placement allocate_on_node(std::size_t bytes, int node, bool zeroed) {
  // Checked before libnuma sees the node: it would bind to nothing, hand back node-0 memory and
  // only complain on stderr.
  if (!node_exists(node))
    throw HostError("numa: node " + std::to_string(node) + " does not exist on this host (" +
                    describe_nodes() +
                    "); use a node below numa::node_count() or a HostNuma's real_os_index");
  Placement p;
  p.bytes = bytes;
  p.requested_node = node;
  // Like cudaMallocHost(0): nothing to place, a null pointer that release() accepts.
  if (bytes == 0) return p;
  p.capacity = detail::capacity_for(bytes, page_size());
  if (block_cache().take(node, p.capacity, p)) {
    p.bytes = bytes;
    if (zeroed) std::memset(p.ptr, 0, bytes);
    return p;
  }

  void* ptr = nullptr;
  if (available()) {
    ptr = numa_alloc_onnode(p.capacity, node);
  } else {
    ptr = mmap(nullptr, p.capacity, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (ptr == MAP_FAILED) ptr = nullptr;
  }
  if (ptr == nullptr)
    throw HostError("numa: allocating " + format_bytes(bytes) + " on node " + std::to_string(node) +
                    " failed: out of host memory; free host buffers or shrink the request");
  // Every page is faulted in under the node's policy, so that the placement read back below is
  // real. MADV_POPULATE_WRITE (Linux 5.14) does it in one call, which in a VM with shadow page
  // tables halves what first touches cost (64 MiB: 215-256 ms page by page, 13 ms to populate
  // and then 110-126 ms for the program's first stores, which still trap once a page; bench/
  // README.md, "Functional mode: where the bf16 rounding's time goes"). An older kernel refuses
  // the advice, and a byte of every page is written instead. The pages are fresh anonymous ones,
  // which the kernel hands out zero-filled: a memset of every byte would add nothing but its own
  // cost (under GCC's ThreadSanitizer, shadow writes and copy-on-write faults for every byte, ~8 %
  // of a tensor-parallel test's time, mostly for channel rings of which a small run uses a few
  // KiB). If the node runs out of memory here the kernel's OOM handling applies; there is no
  // error to return.
  if (madvise(ptr, p.capacity, MADV_POPULATE_WRITE) != 0) {
    const std::size_t page = page_size();
    for (std::size_t offset = 0; offset < p.capacity; offset += page)
      static_cast<volatile unsigned char*>(ptr)[offset] = 0;
  }
  p.ptr = ptr;
  p.actual_node = available() ? node_of(ptr) : -1;
  block_cache().mapped(p.capacity);
  return p;
}

Placement allocate_pinned_on_node(std::size_t bytes, int node) {
  Placement p = allocate_on_node(bytes, node);
  if (p.ptr != nullptr) p.locked = mlock(p.ptr, p.capacity) == 0;
  return p;
}

void recycle(const Placement& p) {
  if (p.ptr != nullptr && !p.locked && block_cache().keep(p)) return;
  release(p);
}

std::size_t kept_peak_bytes() {
  return block_cache().peak_bytes();
}

void reset_kept_peak() {
  block_cache().reset_peak();
}

void release(const Placement& p) {
  if (p.ptr == nullptr) return;
  block_cache().unmapped(p.capacity);
  unmap(p);
}

int node_of(const void* addr) {
  if (addr == nullptr) return -1;
  const auto a = reinterpret_cast<std::uintptr_t>(addr);
  void* page = reinterpret_cast<void*>(a - a % page_size());
  int status = -1;
  // With no target nodes move_pages moves nothing and only reports where the page lives (or a
  // negative errno, e.g. -ENOENT for a page never touched).
  if (move_pages(0, 1, &page, nullptr, &status, 0) != 0) return -1;
  return status >= 0 ? status : -1;
}

std::string last_warning() {
  std::lock_guard<std::mutex> lock(g_warning_mutex);
  return g_last_warning;
}

}  // namespace nodeemu::numa

// libnuma declares these two weak and calls them instead of printing; defining them here keeps
// its messages off stderr (an emulator's output is for the user's program) and makes them
// available through numa::last_warning(). numa_exit_on_error/numa_exit_on_warn are ignored on
// purpose: a library callback must not end the process; failures reach callers as HostError.
extern "C" {

void numa_error(char* where) {
  const int saved = errno;
  char reason[256];
  char line[512];
  std::snprintf(line, sizeof line, "%s: %s", where, strerror_r(saved, reason, sizeof reason));
  nodeemu::numa::record_warning(line);
  errno = saved;
}

void numa_warn(int /*num*/, char* fmt, ...) {
  const int saved = errno;
  char line[512];
  va_list args;
  va_start(args, fmt);
  std::vsnprintf(line, sizeof line, fmt, args);
  va_end(args);
  nodeemu::numa::record_warning(line);
  errno = saved;
}

}  // extern "C"
