// One rank's routing for one flex dispatch, shared by the dispatch and every call that reuses its
// handle (combine and both backwards). DeepEP's notify_dispatch (csrc/kernels/intranode.cu,
// internode.cu) works out the same figures on the GPU: rows per destination rank
// (num_tokens_per_rank), distinct tokens per destination node (num_tokens_per_rdma_rank, what
// crosses RDMA once per node before the forwarder fans it out over NVLink), and the received
// (token, expert) pairs per local expert, which the CPU reads back
// (num_recv_tokens_per_expert_list).
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

namespace nodeemu::detail {

struct FlexRouting {
  std::vector<int> node_of;                 // [member]: its node, numbered from 0 in member order
  std::vector<std::vector<int>> to;         // [member]: this rank's tokens sent there, ascending
  std::vector<std::size_t> rows_to;         // [member]: rows sent there (to[d].size())
  std::vector<std::size_t> tokens_to_node;  // [node]: distinct tokens sent to the node's members
  std::vector<int> from;                    // [member]: rows received from there
  std::vector<int> offset;                  // [member]: first received row from there
  int received = 0;
  std::vector<std::int64_t> recv_per_expert;  // [local expert]: pairs received
  // Representative ranks (meta mode): the routings of the skipped members this rank stands for
  // (by member index), estimated from the same counts: their traffic rides on this rank's calls.
  std::vector<int> stand_in_members;
  std::vector<FlexRouting> stand_ins;

  // Nodes of the members, from their nodes' indices on the emulated machine.
  void set_nodes(const std::vector<int>& machine_node_of_member);
  int nodes() const;
  // From this rank's top-k table (functional mode): every token once per destination rank and
  // once per destination node, however many of its experts live there.
  void route(const std::int64_t* topk_idx, int tokens, int topk, int experts_per_rank);
  // Rows received from each member, in member order.
  void receive(const std::vector<std::size_t>& rows);
  // Meta mode: from every member's tokens per expert (`counts`, member-major) and tokens. A token
  // reaches a set of experts with probability 1 - prod(1 - c_e / T) over the set, each expert
  // taken independently (exact for independent choices; top-k picks distinct experts, which
  // makes hits slightly more spread, so this slightly underestimates the distinct tokens).
  void estimate(const std::vector<std::int64_t>& counts, const std::vector<std::int64_t>& tokens,
                int me, int experts_per_rank);
};

}  // namespace nodeemu::detail
