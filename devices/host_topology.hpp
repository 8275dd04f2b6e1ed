// The real host under the emulator, read with hwloc, or a synthetic hwloc host used to lay out
// devices as if the machine were bigger (tests use "2 sockets x 4 cores" on a 1-NUMA box).
//
// A synthetic topology cannot bind anything: it is not "this system". So every synthetic NUMA
// node and processing unit is folded onto a real one here, and binding always goes through the
// real topology.
#pragma once

#include <memory>
#include <string>
#include <vector>

namespace nodeemu {

struct HostNuma {
  int index = 0;              // logical index within this topology
  int os_index = 0;           // OS (physical) index within this topology
  std::vector<int> pus;       // OS indices of its processing units within this topology
  int real_os_index = 0;      // the real NUMA node it is folded onto
  std::vector<int> real_pus;  // real OS PU indices it is folded onto (non-empty)
};

class HostTopology {
 public:
  // This machine, through hwloc. Never fails on a machine without NUMA: that is one node.
  static HostTopology real();
  // An hwloc synthetic description, e.g. "package:2 numa:1 core:4 pu:1".
  // Throws HostError naming the string when hwloc rejects it or it has no NUMA node.
  static HostTopology synthetic(const std::string& description);

  bool is_synthetic() const { return synthetic_; }
  const std::string& description() const { return description_; }
  int numa_count() const { return static_cast<int>(numa_.size()); }
  const HostNuma& numa(int i) const { return numa_.at(static_cast<size_t>(i)); }
  int pu_count() const;
  int real_pu_count() const;

  // Binds the calling thread to these real OS PU indices (hwloc_set_cpubind on the real
  // topology). Throws HostError if the kernel refuses.
  static void bind_current_thread(const std::vector<int>& real_pus);
  // The real OS PU indices the calling thread is bound to (hwloc_get_cpubind).
  static std::vector<int> current_thread_binding();

 private:
  bool synthetic_ = false;
  std::string description_;
  std::vector<HostNuma> numa_;
};

}  // namespace nodeemu
