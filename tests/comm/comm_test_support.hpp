// Shared set-up for comm/ tests: nodes with a fabric whose figures make golden timings easy to
// work out by hand, and payloads that name their source.
#pragma once

#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#include "comm/communicator.hpp"
#include "devices/node.hpp"
#include "tests/support/test_node.hpp"

namespace nodeemu::testing {

// round_h100 with a round fabric: NVLink 100 GB/s, NIC 10 GB/s, both at full efficiency for
// every size, 1 us and 2 us latency; 20 SMs for NCCL-like kernels; one protocol with no base
// latency and no NVLink SHARP, so that a collective costs its ring's steps and bytes.
inline std::shared_ptr<const NodeTopology> round_fabric() {
  auto t = std::make_shared<NodeTopology>(*round_h100());
  t->nvlink.bytes_per_s = 100e9;
  t->nvlink.efficiency = 1;
  t->nvlink.half_bytes = 0;
  t->nvlink.latency_s = 1e-6;
  t->nic.bytes_per_s = 10e9;
  t->nic.efficiency = 1;
  t->nic.half_bytes = 0;
  t->nic.latency_s = 2e-6;
  t->nvlink.nvls_efficiency = 0;
  t->protocols = {{"simple", 0, 1, t->nic.latency_s}};
  t->comm.nccl_sms = 20;
  return t;
}

// `ranks` devices: one node of that many GPUs, or two 8-GPU nodes for 16.
inline NodeOptions comm_options(int ranks, Mode mode = Mode::Functional) {
  auto t = std::make_shared<NodeTopology>(*round_fabric());
  int nodes = 1;
  if (ranks > t->gpus) {
    nodes = ranks / t->gpus;
  } else {
    t->gpus = ranks;
    t->host.gpu_numa.resize(static_cast<size_t>(ranks));
    t->nic.per_node = ranks;
  }
  NodeOptions o = options(t, 8, 1, mode);
  o.nodes = nodes;
  return o;
}

// The byte that member `src` puts at position `i` of what it sends to member `dst`.
inline std::uint8_t payload(int src, int dst, std::size_t i) {
  std::uint64_t h = (static_cast<std::uint64_t>(src) * 1000003u) ^
                    (static_cast<std::uint64_t>(dst) * 7919u) ^ (i * 2654435761u);
  return static_cast<std::uint8_t>((h >> 7) ^ h);
}

}  // namespace nodeemu::testing
