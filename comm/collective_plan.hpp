// How NCCL moves a collective across the fabric, as the timing plane prices it: the algorithm
// NCCL picks by default on the group's layout, and the bytes one member puts on each class of
// link (its NVLink port out and in, its NIC out and in) after the link's efficiency at the
// message size. Group's symmetric collectives charge these loads to the engine's links (where
// concurrent traffic shares them); `nodeemu comm` prints them, and the fabric fit
// (emu/fabric_fit.hpp) prices public nccl-tests points with the same plan, so what is fitted is
// what runs. For a collective alone on the fabric the engine's time is isolated_time_s (a test
// holds the two together).
//
// The algorithms (NCCL's defaults on NVSwitch nodes with rail-optimised NICs, NCCL >= 2.18):
//  - Direct: every member sends each peer its block (all-to-all; NCCL's alltoall is a grouped
//    send/recv, with PXN across nodes through the sender's rail NIC).
//  - Ring: all-gather, reduce-scatter and broadcast, and all-reduce where NVLS is not
//    available. Inside a node a ring over NVSwitch puts the same bytes on every port as sending
//    each peer its block. Across nodes NCCL runs one ring per rail (channel), each leaving a node
//    through a different GPU's NIC, so a GPU's NIC carries 1/g of the ring's traffic (g members
//    per node) and its NVLink port the rest: the node's NICs together carry it.
//  - Nvls: all-reduce inside one node on an NVSwitch with NVLink SHARP (H100 and later): the
//    switch reduces and multicasts, so a member sends its buffer once and receives the result
//    once (nccl-tests#212: busbw ~480 GB/s on 8 H100s, above a ring's ~370).
//  - NvlsTree: all-reduce across nodes with NVLS inside them: NVLS in the node, a tree over the
//    NICs between nodes; each GPU's NIC carries its 1/g slice of the buffer once each way with
//    two nodes, twice (up from its children and down to them) with more.
//  - P2p: send/recv.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "devices/topology.hpp"

namespace nodeemu {

enum class Collective { AllToAll, AllGather, ReduceScatter, AllReduce, Broadcast, SendRecv };
enum class CollAlgorithm { Direct, Ring, Nvls, NvlsTree, P2p };

std::string_view to_string(Collective c);
std::string_view to_string(CollAlgorithm a);

// Where a group's members live: `ranks` members over `nodes` nodes, at most `per_node` on one
// node, at least `rails` on every node that has any (how many rails a ring can use), and at most
// `per_nic` of them behind one NIC.
struct GroupShape {
  int ranks = 1;
  int nodes = 1;
  int per_node = 1;
  int rails = 1;
  int per_nic = 1;
  // `ranks` members spread evenly over `nodes` nodes of `gpus_per_node` GPUs and `nics` NICs.
  static GroupShape even(int ranks, int nodes, int gpus_per_node, int nics_per_node);
  bool crosses_nodes() const { return nodes > 1; }
};

// The figures of the fabric a plan is priced with: the topology's (a fit varies them).
struct FabricFigures {
  NvlinkSpec nvlink;
  NicSpec nic;
  std::vector<ProtocolSpec> protocols;
  static FabricFigures of(const NodeTopology& t) { return {t.nvlink, t.nic, t.protocols}; }
};

// The wire bytes (bytes over the link's efficiency under the protocol) one member puts on its
// links, and the latency before they flow.
struct CollectivePlan {
  CollAlgorithm algorithm = CollAlgorithm::Direct;
  int protocol = 0;  // the fastest of the figures' protocols for this call (an index)
  double nvlink_out = 0, nvlink_in = 0, nic_out = 0, nic_in = 0;
  // The protocol's base latency, then its latency per step over every step (each over NVLink or
  // a NIC: a ring across nodes crosses a NIC on one edge of every node's segment).
  double alpha_s = 0;
};

// NCCL's default algorithm for the collective on this group.
CollAlgorithm default_algorithm(Collective c, const GroupShape& shape, const FabricFigures& f);

// The plan of a collective of `bytes`, counted as nccl-tests counts its size: the buffer for
// all-reduce and broadcast, the whole output for all-gather, the whole input for reduce-scatter
// and all-to-all, one direction for send/recv. `algorithm`: NCCL_ALGO as a user forces it
// (Ring or the NVLS ones for all-reduce); none: the default.
CollectivePlan plan_collective(Collective c, const GroupShape& shape, double bytes,
                               const FabricFigures& f,
                               std::optional<CollAlgorithm> algorithm = std::nullopt);

// The time of the collective alone on the fabric: its latency, then the busiest link at its raw
// rate (a NIC carries every member behind it). Launch overhead is not included: like nccl-tests'
// average over back-to-back calls, it hides behind the previous call.
double isolated_time_s(const CollectivePlan& p, const GroupShape& shape, const FabricFigures& f);

// nccl-tests' bus bandwidth factor: busbw = algbw * factor (nccl-tests doc/PERFORMANCE.md).
double bus_factor(Collective c, int ranks);

}  // namespace nodeemu
