// The fabric's timing model: which links a message between two emulated GPUs crosses and what it
// costs there. Every GPU has an NVLink port into the NVSwitch (one link per direction in the
// engine), and every NIC a link per direction; a message inside a node crosses the sender's
// NVLink egress and the receiver's ingress, a message between nodes the sender's rail NIC and
// the receiver's. The engine shares each link max-min fairly among the transfers crossing it,
// which is the contention on NVSwitch ports and NICs. Every figure comes from the topology.
#pragma once

#include <vector>

#include "comm/collective_plan.hpp"
#include "devices/multi_party.hpp"
#include "devices/topology.hpp"

namespace nodeemu {

class Node;

class Fabric {
 public:
  explicit Fabric(Node& node);

  int devices() const { return static_cast<int>(node_of_.size()); }
  bool same_node(int a, int b) const { return node_of_[size_t(a)] == node_of_[size_t(b)]; }
  int node_of(int device) const { return node_of_[size_t(device)]; }

  // Adds the loads of one message of `bytes` from src to dst, in the bytes the link must carry
  // at its raw rate: bytes / efficiency(message size). Nothing for src == dst (a local copy) or
  // zero bytes.
  void add_message(int src, int dst, double bytes, std::vector<LinkLoad>& out) const;
  // One step's latency between two devices (NVLink inside a node, the NIC's across).
  double latency_s(int src, int dst) const;

  // Where the members of a group (global ranks) live, for plan_collective.
  GroupShape shape(const std::vector<int>& ranks) const;
  const FabricFigures& figures() const { return figures_; }
  // One member's loads of a planned collective on its own links (its NVLink port, its NIC).
  void add_plan(int device, const CollectivePlan& plan, std::vector<LinkLoad>& out) const;

  int nvlink_tx(int device) const { return nvl_tx_[size_t(device)]; }
  int nvlink_rx(int device) const { return nvl_rx_[size_t(device)]; }
  int nic_tx(int device) const { return nic_tx_[size_t(nic_of_[size_t(device)])]; }
  int nic_rx(int device) const { return nic_rx_[size_t(nic_of_[size_t(device)])]; }
  // A device's expert-parallel communication kernels (DeepEP's, HybridEP's) as a link that
  // carries one unit per picosecond, so that a load on it is the picoseconds the kernels need at
  // their SM budget: a transfer ends no sooner than the fabric or its SMs allow.
  int ep_kernels(int device) const { return ep_kernels_[size_t(device)]; }

 private:
  const NodeTopology* topo_;
  FabricFigures figures_;
  std::vector<int> node_of_, nic_of_;
  std::vector<int> nvl_tx_, nvl_rx_, nic_tx_, nic_rx_, ep_kernels_;
};

}  // namespace nodeemu
