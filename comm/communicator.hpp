// The communication layer of one Node: its fabric's links, the channels between its devices,
// its process groups, and the order checker that matches every rank's collective calls.
//
//   Node node(...);
//   Communicator comm(node);
//   ProcessGroups pg({.world = 8, .ep = 8});
//   node.run([&](Host& host) {
//     Group ep = comm.group_of(pg, GroupKind::EP, host.rank());
//     Stream s = host.device().create_stream(Priority::High, "comm");
//     std::optional<Event> done = ep.all_to_all_v(send, splits, recv, recv_splits, s,
//                                                 {.async = true});
//     host.device().default_stream().wait(*done);
//   });
//
// Create the Communicator after the Node and destroy it first (declare it after): operations
// still in flight read its channels.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "comm/fabric.hpp"
#include "comm/group.hpp"
#include "comm/parallel_layout.hpp"

namespace nodeemu {

class Node;
namespace detail {
class ChannelPool;
struct CommState;
}  // namespace detail

struct CommOptions {
  int nccl_sms = 0;  // SMs of NCCL-like kernels; 0 = comm_kernels.nccl_sms
  // Channel rings (see comm/channel.hpp): 16 x 64 KiB, 1 MiB per device pair that talks. More
  // slots help only when a sender's and a receiver's worker pump a ring at once.
  std::size_t slot_bytes = 64 << 10;
  int slots = 16;
};

class Communicator {
 public:
  explicit Communicator(Node& node, CommOptions options = {});
  ~Communicator();
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  // The group of these global ranks. Asking again for the same ranks and name (from any rank's
  // host) gives the same group, with the same call sequence. Throws UsageError for a rank that
  // is not a device of the node, a repeated rank or an empty list.
  Group group(std::vector<int> ranks, const std::string& name);
  // Megatron's group of `kind` holding `rank`, named like "ep0" (the group's index).
  Group group_of(const ProcessGroups& pg, GroupKind kind, int rank);

  // Representative ranks (meta mode): `representative_of[r]` is the rank that runs in rank r's
  // place, r itself if r runs. Only running ranks call collectives; a collective completes when
  // its running members have joined, and each running member's call also puts on the fabric the
  // link loads of the skipped members of that group it stands for (from their own sizes where
  // the caller knows them: the dispatchers' routing, a symmetric collective's plan). A group
  // whose members all are skipped is never called. Call before Node::run. Throws UsageError in
  // functional mode (the skipped ranks' bytes would not exist), for a list that is not one entry
  // per device, or for a representative that does not run itself.
  void represent(std::vector<int> representative_of);
  // Whether `rank` runs (always, unless represent() skipped it).
  bool runs(int rank) const;

  Node& node() const;
  const Fabric& fabric() const;
  detail::ChannelPool& channels() const;
  int nccl_sms() const;

 private:
  std::shared_ptr<detail::CommState> state_;
};

}  // namespace nodeemu
