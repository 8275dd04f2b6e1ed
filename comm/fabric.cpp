#include "comm/fabric.hpp"

#include <algorithm>
#include <map>
#include <string>

#include "devices/check.hpp"
#include "devices/node.hpp"

namespace nodeemu {

Fabric::Fabric(Node& node) : topo_(&node.topology()), figures_(FabricFigures::of(*topo_)) {
  MultiParty e(node);
  const NodeTopology& t = *topo_;
  for (int d = 0; d < node.device_count(); ++d) {
    const Device& dev = node.device(d);
    node_of_.push_back(dev.node_index());
    const std::string name = dev.name();
    // What leaves through the port is read from this GPU's HBM, what comes in is written there.
    nvl_tx_.push_back(e.add_link(name + " NVLink out", t.nvlink.bytes_per_s, {d}));
    nvl_rx_.push_back(e.add_link(name + " NVLink in", t.nvlink.bytes_per_s, {d}));
    ep_kernels_.push_back(e.add_link(name + " EP kernels", 1e12));
    // Rail-optimised: GPU g of a node uses NIC g * nics / gpus (one NIC per GPU on a DGX).
    const int nic = dev.node_index() * t.nic.per_node + dev.local_index() * t.nic.per_node / t.gpus;
    nic_of_.push_back(nic);
  }
  const int nics = node.options().nodes * t.nic.per_node;
  std::vector<std::vector<int>> behind(static_cast<size_t>(nics));  // GPUDirect RDMA: GPU memory
  for (int d = 0; d < node.device_count(); ++d) behind[size_t(nic_of_[size_t(d)])].push_back(d);
  for (int n = 0; n < nics; ++n) {
    const std::string name =
        "node " + std::to_string(n / t.nic.per_node) + " NIC " + std::to_string(n % t.nic.per_node);
    nic_tx_.push_back(e.add_link(name + " out", t.nic.bytes_per_s, behind[size_t(n)]));
    nic_rx_.push_back(e.add_link(name + " in", t.nic.bytes_per_s, behind[size_t(n)]));
  }
}

void Fabric::add_message(int src, int dst, double bytes, std::vector<LinkLoad>& out) const {
  if (src == dst || bytes <= 0) return;
  if (same_node(src, dst)) {
    const double wire = bytes / topo_->nvlink.curve().at(bytes);
    out.push_back({nvlink_tx(src), wire});
    out.push_back({nvlink_rx(dst), wire});
  } else {
    const double wire = bytes / topo_->nic.curve().at(bytes);
    out.push_back({nic_tx(src), wire});
    out.push_back({nic_rx(dst), wire});
  }
}

GroupShape Fabric::shape(const std::vector<int>& ranks) const {
  NE_CHECK(!ranks.empty(), "a group has members");
  std::map<int, int> per_node, per_nic;
  for (int r : ranks) {
    ++per_node[node_of(r)];
    ++per_nic[nic_of_[size_t(r)]];
  }
  GroupShape s;
  s.ranks = static_cast<int>(ranks.size());
  s.nodes = static_cast<int>(per_node.size());
  s.per_node = s.rails = per_node.begin()->second;
  for (const auto& [node, n] : per_node) {
    s.per_node = std::max(s.per_node, n);
    s.rails = std::min(s.rails, n);
  }
  s.per_nic = 1;
  for (const auto& [nic, n] : per_nic) s.per_nic = std::max(s.per_nic, n);
  return s;
}

void Fabric::add_plan(int device, const CollectivePlan& p, std::vector<LinkLoad>& out) const {
  const std::pair<int, double> loads[] = {{nvlink_tx(device), p.nvlink_out},
                                          {nvlink_rx(device), p.nvlink_in},
                                          {nic_tx(device), p.nic_out},
                                          {nic_rx(device), p.nic_in}};
  for (const auto& [link, bytes] : loads)
    if (bytes > 0) out.push_back({link, bytes});
}

double Fabric::latency_s(int src, int dst) const {
  return same_node(src, dst) ? topo_->nvlink.latency_s : topo_->nic.latency_s;
}

}  // namespace nodeemu
