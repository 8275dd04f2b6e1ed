#include "devices/placement.hpp"

#include <algorithm>
#include <thread>

namespace nodeemu {

int default_thread_budget() {
  return std::max(1, HostTopology::real().pu_count());
}

std::vector<DevicePlacement> place_devices(const NodeTopology& topo, int nodes,
                                           const HostTopology& host, int thread_budget,
                                           int workers_per_device, bool bindpcie) {
  if (thread_budget <= 0) thread_budget = default_thread_budget();
  std::vector<DevicePlacement> out;
  const int numa_per_node = topo.host.numa_count();
  for (int n = 0; n < nodes; ++n) {
    for (int g = 0; g < topo.gpus; ++g) {
      DevicePlacement p;
      p.device = n * topo.gpus + g;
      p.node = n;
      p.local = g;
      p.emulated_numa = topo.host.gpu_numa[static_cast<size_t>(g)];
      p.emulated_socket = topo.host.numa_socket[static_cast<size_t>(p.emulated_numa)];
      // Emulated nodes take consecutive host NUMA nodes, so two emulated nodes on a 4-node
      // host do not pile onto the same two; a smaller host folds them round-robin.
      auto host_numa_of = [&](int emulated) {
        return (n * numa_per_node + emulated) % host.numa_count();
      };
      p.host_numa = host_numa_of(p.emulated_numa);
      const HostNuma& hn = host.numa(p.host_numa);
      p.real_numa = hn.real_os_index;
      p.host_pus = hn.pus;
      p.real_pus = hn.real_pus;
      p.process_bound = bindpcie;
      p.process_numa = bindpcie ? p.emulated_numa : g % numa_per_node;
      p.process_host_numa = host_numa_of(p.process_numa);
      const HostNuma& pn = host.numa(p.process_host_numa);
      p.process_real_numa = pn.real_os_index;
      if (bindpcie) p.process_real_pus = pn.real_pus;
      out.push_back(std::move(p));
    }
  }
  for (auto& p : out) {
    if (workers_per_device > 0) {
      p.workers = workers_per_device;
      continue;
    }
    int sharing =
        static_cast<int>(std::count_if(out.begin(), out.end(), [&](const DevicePlacement& q) {
          return q.host_numa == p.host_numa;
        }));
    int cores = std::min(static_cast<int>(p.real_pus.size()), thread_budget);
    p.workers = std::max(1, cores / sharing);
  }
  return out;
}

}  // namespace nodeemu
