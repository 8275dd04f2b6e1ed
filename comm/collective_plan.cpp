#include "comm/collective_plan.hpp"

#include <algorithm>
#include <cmath>

#include "devices/check.hpp"

namespace nodeemu {

std::string_view to_string(Collective c) {
  switch (c) {
    case Collective::AllToAll:
      return "all_to_all";
    case Collective::AllGather:
      return "all_gather";
    case Collective::ReduceScatter:
      return "reduce_scatter";
    case Collective::AllReduce:
      return "all_reduce";
    case Collective::Broadcast:
      return "broadcast";
    case Collective::SendRecv:
      return "send_recv";
  }
  return "?";
}

std::string_view to_string(CollAlgorithm a) {
  switch (a) {
    case CollAlgorithm::Direct:
      return "direct";
    case CollAlgorithm::Ring:
      return "ring";
    case CollAlgorithm::Nvls:
      return "nvls";
    case CollAlgorithm::NvlsTree:
      return "nvls_tree";
    case CollAlgorithm::P2p:
      return "p2p";
  }
  return "?";
}

GroupShape GroupShape::even(int ranks, int nodes, int gpus_per_node, int nics_per_node) {
  NE_CHECK(ranks >= 1 && nodes >= 1 && ranks % nodes == 0, "an even group has whole nodes");
  const int per_node = ranks / nodes;
  // Rail-optimised: GPU i of a node uses NIC i * nics / gpus (Fabric), so the first per_node
  // GPUs of a node share NICs only when there are fewer NICs than GPUs.
  const int gpus_per_nic = std::max(1, gpus_per_node / std::max(1, nics_per_node));
  return {ranks, nodes, per_node, per_node, std::min(per_node, gpus_per_nic)};
}

CollAlgorithm default_algorithm(Collective c, const GroupShape& s, const FabricFigures& f) {
  switch (c) {
    case Collective::AllToAll:
      return CollAlgorithm::Direct;
    case Collective::SendRecv:
      return CollAlgorithm::P2p;
    case Collective::AllReduce:
      // NVLS needs the members of a node on its NVSwitch, more than one of them.
      if (f.nvlink.nvls_efficiency > 0 && s.per_node > 1)
        return s.crosses_nodes() ? CollAlgorithm::NvlsTree : CollAlgorithm::Nvls;
      return CollAlgorithm::Ring;
    default:
      return CollAlgorithm::Ring;
  }
}

namespace {

// Bytes on the wire for `bytes` sent in messages of `message` bytes.
double wire(double bytes, double message, const EfficiencyCurve& curve) {
  return bytes > 0 ? bytes / curve.at(message) : 0.0;
}

// The plan under one protocol.
CollectivePlan plan_under(Collective c, const GroupShape& s, double bytes, const FabricFigures& f,
                          CollAlgorithm algorithm, int protocol_index) {
  const ProtocolSpec& protocol = f.protocols[size_t(protocol_index)];
  CollectivePlan p;
  p.algorithm = algorithm;
  p.protocol = protocol_index;
  const int n = s.ranks;
  double nvlink_steps = 0, nic_steps = 0;  // the steps over each kind of link, one after another
  auto one_step = [&] { (s.crosses_nodes() ? nic_steps : nvlink_steps) = 1; };
  const double share = protocol.bandwidth_share;
  // Direct and point-to-point calls move messages of a size, whose efficiency grows with it as
  // a lone message's does (half_kb, as Fabric::add_message prices them); a ring's or NVLS's
  // efficiency by size is its protocol's.
  const bool messages = algorithm == CollAlgorithm::Direct || algorithm == CollAlgorithm::P2p;
  const EfficiencyCurve nvl{f.nvlink.efficiency * share, messages ? f.nvlink.half_bytes : 0},
      nic{f.nic.efficiency * share, messages ? f.nic.half_bytes : 0},
      nvls{f.nvlink.nvls_efficiency * share, 0};
  const double block = bytes / n;  // one member's piece
  auto both = [](double& out, double& in, double v) { out = in = v; };
  switch (algorithm) {
    case CollAlgorithm::Direct: {
      const double local = double(s.per_node - 1) * block, remote = double(n - s.per_node) * block;
      both(p.nvlink_out, p.nvlink_in, wire(local, block, nvl));
      both(p.nic_out, p.nic_in, wire(remote, block, nic));
      one_step();
      break;
    }
    case CollAlgorithm::Ring: {
      // What a member forwards along the ring: every piece but one, twice for all-reduce
      // (reduce-scatter then all-gather); broadcast's pipelined ring forwards the buffer once.
      // A ring of n members over m nodes crosses between nodes on m of its n edges.
      double traffic = double(n - 1) * block;
      double steps = n - 1;
      if (c == Collective::AllReduce) {
        traffic *= 2;
        steps *= 2;
      } else if (c == Collective::Broadcast) {
        traffic = bytes;
      }
      const double crossing = s.crosses_nodes() ? double(s.nodes) / n : 0.0;
      nic_steps = steps * crossing;
      nvlink_steps = steps - nic_steps;
      const double message = c == Collective::Broadcast ? bytes : block;
      if (s.crosses_nodes()) {
        const double on_nic = traffic / s.rails;
        both(p.nic_out, p.nic_in, wire(on_nic, message, nic));
        both(p.nvlink_out, p.nvlink_in, wire(traffic - on_nic, message, nvl));
      } else {
        both(p.nvlink_out, p.nvlink_in, wire(traffic, message, nvl));
      }
      break;
    }
    case CollAlgorithm::Nvls:
    case CollAlgorithm::NvlsTree: {
      both(p.nvlink_out, p.nvlink_in, wire(bytes, block, nvls));
      nvlink_steps = 2;  // the switch's reduce, then its multicast
      if (algorithm == CollAlgorithm::NvlsTree) {
        const double passes = s.nodes == 2 ? 1.0 : 2.0;
        both(p.nic_out, p.nic_in, wire(passes * bytes / s.rails, block, nic));
        nic_steps = 2 * std::ceil(std::log2(double(s.nodes)));  // up the tree and down
      }
      break;
    }
    case CollAlgorithm::P2p: {
      if (s.crosses_nodes())
        both(p.nic_out, p.nic_in, wire(bytes, bytes, nic));
      else
        both(p.nvlink_out, p.nvlink_in, wire(bytes, bytes, nvl));
      one_step();
      break;
    }
  }
  p.alpha_s =
      protocol.base_latency_s + nvlink_steps * f.nvlink.latency_s + nic_steps * protocol.nic_step_s;
  return p;
}

}  // namespace

CollectivePlan plan_collective(Collective c, const GroupShape& s, double bytes,
                               const FabricFigures& f, std::optional<CollAlgorithm> algorithm) {
  NE_CHECK(s.ranks >= 1 && s.nodes >= 1 && s.rails >= 1 && s.per_node >= s.rails,
           "a group shape with members");
  NE_CHECK(!f.protocols.empty(), "a fabric has a protocol");
  const CollAlgorithm a = algorithm.value_or(default_algorithm(c, s, f));
  NE_CHECK(!algorithm || c == Collective::AllReduce ||
               (c != Collective::AllToAll && c != Collective::SendRecv &&
                *algorithm == CollAlgorithm::Ring),
           "a forced algorithm is Ring, or NVLS for all-reduce");
  if (s.ranks == 1 || bytes <= 0) {
    CollectivePlan none;
    none.algorithm = a;
    return none;
  }
  // All-to-all and send/recv are NCCL's point-to-point operations, which run the Simple
  // protocol (LL only below NCCL_P2P_LL_THRESHOLD, 16 KiB): they take the last protocol, simple.
  const bool p2p = a == CollAlgorithm::Direct || a == CollAlgorithm::P2p;
  const int first = p2p ? static_cast<int>(f.protocols.size()) - 1 : 0;
  CollectivePlan best;
  double best_s = 0;
  for (int i = first; i < static_cast<int>(f.protocols.size()); ++i) {
    const CollectivePlan p = plan_under(c, s, bytes, f, a, i);
    const double t = isolated_time_s(p, s, f);
    if (i == first || t < best_s) {
      best = p;
      best_s = t;
    }
  }
  return best;
}

double isolated_time_s(const CollectivePlan& p, const GroupShape& s, const FabricFigures& f) {
  const double nvl = std::max(p.nvlink_out, p.nvlink_in) / f.nvlink.bytes_per_s;
  const double nic = s.per_nic * std::max(p.nic_out, p.nic_in) / f.nic.bytes_per_s;
  return p.alpha_s + std::max(nvl, nic);
}

double bus_factor(Collective c, int ranks) {
  const double n = ranks;
  switch (c) {
    case Collective::AllReduce:
      return 2 * (n - 1) / n;
    case Collective::AllGather:
    case Collective::ReduceScatter:
    case Collective::AllToAll:
      return (n - 1) / n;
    case Collective::Broadcast:
    case Collective::SendRecv:
      return 1;
  }
  return 1;
}

}  // namespace nodeemu
