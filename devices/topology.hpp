// A node as the topology YAML describes it: the GPU spec, the host's sockets and NUMA nodes with
// the GPU->NUMA map, and the fabric (NVLink/NVSwitch, PCIe, NICs). Loading is strict: an unknown,
// missing or badly typed key is a ConfigError naming the file and the dotted key.
#pragma once

#include <string>
#include <vector>

#include "devices/gpu_spec.hpp"

namespace nodeemu {

struct HostSpec {
  int sockets = 0;
  int cores_per_socket = 0;
  // numa_socket[i] is the socket of NUMA node i.
  std::vector<int> numa_socket;
  double numa_mem_bytes_per_s = 0;  // DRAM bandwidth of one NUMA node
  std::vector<int> gpu_numa;        // gpu_numa[g] = NUMA node local to GPU g's PCIe
  int numa_count() const { return static_cast<int>(numa_socket.size()); }
};

struct NvlinkSpec {
  int links = 0;            // per GPU
  double bytes_per_s = 0;   // per direction per GPU, all links together
  double efficiency = 1.0;  // achievable fraction for large messages
  double half_bytes = 0;    // message size at which half of `efficiency` is reached
  double latency_s = 0;     // alpha
  EfficiencyCurve curve() const { return {efficiency, half_bytes}; }
};

// The host side of PCIe. Copy rates by size, pinned or pageable, come from the GPU profile.
struct PcieSpec {
  int generation = 0;
  double remote_numa_factor = 1.0;  // rate multiplier when the host buffer is on the far socket
};

struct NicSpec {
  int per_node = 0;        // NICs in the node (one per GPU on DGX)
  double bytes_per_s = 0;  // per direction per NIC
  double efficiency = 1.0;
  double half_bytes = 0;  // message size at which half of `efficiency` is reached
  double latency_s = 0;
  EfficiencyCurve curve() const { return {efficiency, half_bytes}; }
};

// SMs the communication kernels hold while they run (taken from compute).
struct CommKernelSpec {
  int nccl_sms = 0;    // NCCL-like collectives (all-to-all, all-gather, reduce-scatter, ...)
  int deepep_sms = 0;  // DeepEP-like normal-mode dispatch/combine; even (num_sms/2 channels)
};

struct NodeTopology {
  std::string name;  // "dgx_h100"
  std::string file;  // where it was loaded from ("<string>" for inline text)
  int gpus = 0;      // GPUs per node
  GpuSpec gpu;
  HostSpec host;
  NvlinkSpec nvlink;
  PcieSpec pcie;
  NicSpec nic;
  CommKernelSpec comm;

  // Throws ConfigError("<file>", "<dotted.key>", "<what>") on any problem, including an
  // unreadable file (key "file") and YAML syntax errors (key "yaml", with line and column).
  static NodeTopology from_file(const std::string& path);
  static NodeTopology from_yaml(const std::string& text, const std::string& file_for_errors);
};

}  // namespace nodeemu
