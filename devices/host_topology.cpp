#include "devices/host_topology.hpp"

#include <hwloc.h>
#include <hwloc/export.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <iterator>
#include <memory>
#include <new>

#include "devices/check.hpp"
#include "devices/errors.hpp"

namespace nodeemu {
namespace {

struct TopologyDeleter {
  void operator()(hwloc_topology* t) const { hwloc_topology_destroy(t); }
};
using TopologyPtr = std::unique_ptr<hwloc_topology, TopologyDeleter>;

struct BitmapDeleter {
  void operator()(hwloc_bitmap_s* b) const { hwloc_bitmap_free(b); }
};
using BitmapPtr = std::unique_ptr<hwloc_bitmap_s, BitmapDeleter>;

BitmapPtr new_bitmap() {
  hwloc_bitmap_t b = hwloc_bitmap_alloc();
  if (b == nullptr) throw std::bad_alloc();
  return BitmapPtr(b);
}

std::string errno_text(int err) {
  char buf[256];
  // GNU strerror_r: thread-safe, unlike strerror, and may return a static string instead of buf.
  return strerror_r(err, buf, sizeof buf);
}

std::string join(const std::vector<int>& values) {
  std::string out;
  for (size_t i = 0; i < values.size(); ++i) {
    if (i > 0) out += ',';
    out += std::to_string(values[i]);
  }
  return out;
}

std::vector<int> sorted_union(const std::vector<int>& a, const std::vector<int>& b) {
  std::vector<int> out;
  std::set_union(a.begin(), a.end(), b.begin(), b.end(), std::back_inserter(out));
  return out;
}

// OS indices of the PUs inside `set` that this process may use, ascending. Going through PU
// objects rather than raw cpuset bits keeps a synthetic topology's own OS indices.
std::vector<int> pus_inside(hwloc_topology_t topo, hwloc_const_cpuset_t set) {
  BitmapPtr usable = new_bitmap();
  if (hwloc_bitmap_and(usable.get(), set, hwloc_topology_get_allowed_cpuset(topo)) != 0)
    throw std::bad_alloc();
  std::vector<int> pus;
  hwloc_obj_t pu = nullptr;
  while ((pu = hwloc_get_next_obj_inside_cpuset_by_type(topo, usable.get(), HWLOC_OBJ_PU, pu)))
    pus.push_back(static_cast<int>(pu->os_index));
  std::sort(pus.begin(), pus.end());
  return pus;
}

hwloc_topology_t load_real_topology() {
  hwloc_topology_t raw = nullptr;
  if (hwloc_topology_init(&raw) != 0)
    throw HostError("hwloc: initialising the host topology failed: " + errno_text(errno) +
                    "; check that hwloc is installed correctly");
  TopologyPtr topo(raw);
  if (hwloc_topology_load(raw) != 0)
    throw HostError("hwloc: reading this host's topology failed: " + errno_text(errno) +
                    "; check that /sys and /proc are mounted and readable");
  // HWLOC_XMLFILE, HWLOC_SYNTHETIC or HWLOC_FSROOT in the environment replace the real machine
  // with a description of another one, on which binding would silently do the wrong thing.
  if (!hwloc_topology_is_thissystem(raw))
    throw HostError(
        "hwloc: the host topology does not describe this machine; unset HWLOC_XMLFILE, "
        "HWLOC_SYNTHETIC and HWLOC_FSROOT (use HostTopology::synthetic for a made-up host)");
  return topo.release();
}

// The process-wide real topology, loaded on first use (a function-local static is initialised
// once even when threads race for it, and a throw leaves it to be retried). It is deliberately
// never destroyed: threads may still bind while static destructors run at exit. Once loaded it
// is only read, which hwloc allows from several threads at once.
hwloc_topology_t real_topology() {
  static hwloc_topology_t topo = load_real_topology();
  return topo;
}

// The real NUMA nodes that can run a thread, each folded onto itself. Memory-only nodes (CXL
// expanders, HBM in flat mode) are left out because a HostNuma promises PUs to bind to.
std::vector<HostNuma> real_nodes(hwloc_topology_t topo) {
  std::vector<HostNuma> nodes;
  const int count = hwloc_get_nbobjs_by_type(topo, HWLOC_OBJ_NUMANODE);
  for (int i = 0; i < count; ++i) {
    hwloc_obj_t obj = hwloc_get_obj_by_type(topo, HWLOC_OBJ_NUMANODE, static_cast<unsigned>(i));
    NE_CHECK(obj != nullptr, "hwloc counted a NUMA node it cannot return");
    HostNuma node;
    node.index = static_cast<int>(obj->logical_index);
    node.os_index = static_cast<int>(obj->os_index);
    node.pus = pus_inside(topo, obj->cpuset);
    if (node.pus.empty()) continue;
    node.real_os_index = node.os_index;
    node.real_pus = node.pus;
    nodes.push_back(std::move(node));
  }
  if (nodes.empty()) {
    // No NUMA object (a non-NUMA kernel or an old hwloc backend): the machine is one node 0,
    // which is also what libnuma reports there.
    HostNuma whole;
    whole.pus = pus_inside(topo, hwloc_topology_get_topology_cpuset(topo));
    if (whole.pus.empty())
      throw HostError("hwloc: this process may not run on any PU of this host; check its cpuset");
    whole.real_pus = whole.pus;
    nodes.push_back(std::move(whole));
  }
  return nodes;
}

std::string export_description(hwloc_topology_t topo) {
  char buf[1024];
  // Asymmetric machines cannot be written as a synthetic string; a label is still better than "".
  if (hwloc_topology_export_synthetic(topo, buf, sizeof buf, 0) < 0) return "this host";
  return buf;
}

}  // namespace

HostTopology HostTopology::real() {
  hwloc_topology_t topo = real_topology();
  HostTopology host;
  host.synthetic_ = false;
  host.description_ = export_description(topo);
  host.numa_ = real_nodes(topo);
  return host;
}

HostTopology HostTopology::synthetic(const std::string& description) {
  hwloc_topology_t raw = nullptr;
  if (hwloc_topology_init(&raw) != 0)
    throw HostError("hwloc: initialising synthetic topology '" + description +
                    "' failed: " + errno_text(errno) + "; check that hwloc is installed correctly");
  TopologyPtr topo(raw);
  if (hwloc_topology_set_synthetic(raw, description.c_str()) != 0)
    throw HostError("hwloc: synthetic topology '" + description + "' is not valid (" +
                    errno_text(errno) +
                    "); write levels from the top, e.g. 'package:2 numa:1 core:4 pu:1'");
  if (hwloc_topology_load(raw) != 0)
    throw HostError("hwloc: loading synthetic topology '" + description +
                    "' failed: " + errno_text(errno) + "; simplify the description");
  const int count = hwloc_get_nbobjs_by_type(raw, HWLOC_OBJ_NUMANODE);
  if (count <= 0)
    throw HostError("hwloc: synthetic topology '" + description +
                    "' has no NUMA node; add a level such as 'numa:1' below 'package'");

  // Folding keeps synthetic node i on real node i mod R, so consecutive synthetic nodes spread
  // over the real ones and a 1-node host carries them all.
  const std::vector<HostNuma> real = real_nodes(real_topology());
  HostTopology host;
  host.synthetic_ = true;
  host.description_ = description;
  for (int i = 0; i < count; ++i) {
    hwloc_obj_t obj = hwloc_get_obj_by_type(raw, HWLOC_OBJ_NUMANODE, static_cast<unsigned>(i));
    NE_CHECK(obj != nullptr, "hwloc counted a NUMA node it cannot return");
    const HostNuma& target = real[static_cast<size_t>(i) % real.size()];
    HostNuma node;
    node.index = static_cast<int>(obj->logical_index);
    node.os_index = static_cast<int>(obj->os_index);
    node.pus = pus_inside(raw, obj->cpuset);
    node.real_os_index = target.os_index;
    node.real_pus = target.pus;
    host.numa_.push_back(std::move(node));
  }
  return host;
}

// PUs are counted once even when NUMA nodes share them (memory-only nodes attached to a package
// carry the package's cpuset; several synthetic nodes fold onto one real node).
int HostTopology::pu_count() const {
  std::vector<int> all;
  for (const HostNuma& n : numa_) all = sorted_union(all, n.pus);
  return static_cast<int>(all.size());
}

int HostTopology::real_pu_count() const {
  std::vector<int> all;
  for (const HostNuma& n : numa_) all = sorted_union(all, n.real_pus);
  return static_cast<int>(all.size());
}

void HostTopology::bind_current_thread(const std::vector<int>& real_pus) {
  if (real_pus.empty())
    throw HostError("bind_current_thread: no PU given; pass the real_pus of a HostNuma");
  hwloc_topology_t topo = real_topology();
  hwloc_const_cpuset_t allowed = hwloc_topology_get_allowed_cpuset(topo);
  BitmapPtr set = new_bitmap();
  for (int pu : real_pus) {
    // Checked here because the kernel would quietly bind to the valid subset of a mixed list.
    if (pu < 0 || !hwloc_bitmap_isset(allowed, static_cast<unsigned>(pu))) {
      std::vector<int> ok = pus_inside(topo, allowed);
      throw HostError("bind_current_thread: PU " + std::to_string(pu) +
                      " is not one this process may run on (allowed: " + join(ok) +
                      "); take PUs from HostNuma::real_pus");
    }
    if (hwloc_bitmap_set(set.get(), static_cast<unsigned>(pu)) != 0) throw std::bad_alloc();
  }
  if (hwloc_set_cpubind(topo, set.get(), HWLOC_CPUBIND_THREAD) != 0)
    throw HostError("bind_current_thread: the kernel refused to bind this thread to PUs " +
                    join(real_pus) + ": " + errno_text(errno) +
                    "; check the process's cpuset (taskset, cgroups)");
}

std::vector<int> HostTopology::current_thread_binding() {
  hwloc_topology_t topo = real_topology();
  BitmapPtr set = new_bitmap();
  if (hwloc_get_cpubind(topo, set.get(), HWLOC_CPUBIND_THREAD) != 0)
    throw HostError("current_thread_binding: reading this thread's binding failed: " +
                    errno_text(errno) + "; check that /proc is mounted");
  // The kernel may report CPUs that are not present; only real PUs mean anything to callers,
  // and the intersection also keeps the loop below finite.
  if (hwloc_bitmap_and(set.get(), set.get(), hwloc_topology_get_complete_cpuset(topo)) != 0)
    throw std::bad_alloc();
  std::vector<int> pus;
  unsigned id = 0;
  hwloc_bitmap_foreach_begin(id, set.get()) {
    pus.push_back(static_cast<int>(id));
  }
  hwloc_bitmap_foreach_end();
  return pus;
}

}  // namespace nodeemu
