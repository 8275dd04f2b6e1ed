// Where each emulated GPU lives on the real host: which emulated NUMA node its PCIe is local to
// (from the topology), which host NUMA node stands for it (folded when the host has fewer), the
// real cores its worker pool is pinned to, and how many workers it gets.
#pragma once

#include <string>
#include <vector>

#include "devices/host_topology.hpp"
#include "devices/topology.hpp"

namespace nodeemu {

struct DevicePlacement {
  int device = 0;         // global id: node * gpus + local
  int node = 0;           // emulated node
  int local = 0;          // index within the node
  int emulated_numa = 0;  // NUMA node local to the GPU's PCIe, in the topology
  int emulated_socket = 0;
  int host_numa = 0;  // logical NUMA node of the host topology (real or synthetic)
  int real_numa = 0;  // real NUMA node the memory goes to
  std::vector<int> host_pus;
  std::vector<int> real_pus;
  int workers = 1;
  // The host process that drives this GPU: its CPU thread (the host actor) and its pinned host
  // memory. With bindpcie it sits on the GPU's PCIe-local NUMA node (Megatron's
  // set_ideal_affinity_for_current_gpu). Without, it sits where an unbound launcher leaves it:
  // the OS spreads the ranks over the sockets, modelled deterministically as round-robin by local
  // rank over the emulated NUMA nodes, which puts half of a DGX's ranks on the far socket. The
  // worker pool is the GPU itself (its SMs and copy engines) and stays on the GPU's node.
  bool process_bound = false;
  int process_numa = 0;               // emulated NUMA node
  int process_host_numa = 0;          // host-topology NUMA node standing for it
  int process_real_numa = 0;          // real NUMA node its memory goes to
  std::vector<int> process_real_pus;  // what the host actor is bound to (bindpcie), else empty
};

// `thread_budget` <= 0 means the real hardware threads. `workers_per_device` <= 0 means: share
// the cores of each host NUMA node among the devices placed on it, at least one each.
std::vector<DevicePlacement> place_devices(const NodeTopology& topo, int nodes,
                                           const HostTopology& host, int thread_budget,
                                           int workers_per_device, bool bindpcie = false);

int default_thread_budget();

}  // namespace nodeemu
