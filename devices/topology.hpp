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
  // All-reduce through NVLink SHARP (the switch reduces and multicasts): the achievable fraction
  // of bytes_per_s; 0 for a switch without it (NVSwitch before Hopper).
  double nvls_efficiency = 0;
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

// One of NCCL's protocols as the fabric fit sees it (NCCL's tuning model, src/graph/tuning.cc:
// a base latency per protocol, a latency per step by link, a share of the link's bandwidth).
// NCCL picks, per call, the protocol its model predicts fastest; the timing plane picks the one
// that is. A step over NVLink costs the link's latency_s under every protocol (no public point
// tells them apart); a step across nodes costs the protocol's own.
struct ProtocolSpec {
  std::string name;            // ll, ll128, simple
  double base_latency_s = 0;   // before the first step
  double bandwidth_share = 1;  // of the link's efficiency
  double nic_step_s = 0;       // a step across nodes (the loader's default: the NIC's latency_s)
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
  // NCCL's protocols (the `protocols` map); without one, a single protocol at the links' figures
  // (no base latency, the NIC's latency_s per step across nodes).
  std::vector<ProtocolSpec> protocols;

  // Throws ConfigError("<file>", "<dotted.key>", "<what>") on any problem, including an
  // unreadable file (key "file") and YAML syntax errors (key "yaml", with line and column).
  static NodeTopology from_file(const std::string& path);
  static NodeTopology from_yaml(const std::string& text, const std::string& file_for_errors);
};

}  // namespace nodeemu
