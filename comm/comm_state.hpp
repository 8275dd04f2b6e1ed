// Internal: what a Communicator owns, and the one path every collective, point-to-point and
// dispatcher call takes: order check, rendezvous, channels and link costs.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "comm/channel.hpp"
#include "comm/communicator.hpp"
#include "comm/exchange.hpp"
#include "comm/fabric.hpp"
#include "comm/group.hpp"
#include "devices/multi_party.hpp"

namespace nodeemu::detail {

struct GroupState {
  int id = 0;
  std::string name;
  std::vector<int> ranks;
  std::vector<std::uint64_t> next_seq;                    // per member: its next collective
  std::map<std::pair<int, int>, std::uint64_t> p2p_next;  // (member, peer): next transfer
  std::string label() const;                              // "ep0 (ranks 0,1,2,3)"
};

// One party's call, as the group methods and the dispatchers build it.
struct Call {
  std::string kind;          // what must match across parties: "all_to_all_v", "broadcast(root 2)"
  std::string text;          // the kind with this party's sizes, for reports
  std::vector<int> parties;  // members taking part (all of them, or a p2p pair), party order
  int party = 0;             // the caller's index in `parties`
  std::vector<PartyPhase> plan;  // one per phase, each sized parties.size()
  int sms = 0;
  int latency_steps = 1;  // alpha is this many times the slowest hop's latency
  // The caller's link loads; when unset, each phase's sends are costed as direct messages.
  std::optional<std::vector<LinkLoad>> loads;
  std::vector<Buffer> uses;
  std::shared_ptr<void> keep;  // host-side memory the call's functional work needs
  // Functional mode, routing the host never saw: plan = {zeros, declared sizes}, and this
  // computes the real phase-1 plan on the party's worker (see Exchange::set_deferred).
  Exchange::Planner planner;
  Exchange::Receiver receiver;
  int p2p_peer = -1;  // member index of the peer for point-to-point calls
};

struct OpenCall {
  RendezvousId rv;
  std::shared_ptr<Exchange> exchange;
  std::vector<std::string> kinds, texts;  // per party, "" until it joined
  int joined = 0;
};

// The persistent buffers of one GPU's DeepEP or HybridEP Buffer: Megatron holds one per process
// and backend, shared by every layer (fused_a2a.py get_buffer), made on the first dispatch and
// made again when a call needs more.
struct FlexBuffers {
  Buffer memory;
  std::uint64_t bytes = 0;
};

struct CommState {
  CommState(Node& n, CommOptions o);

  Node* node;
  MultiParty multi_party;
  CommOptions options;
  Fabric fabric;
  ChannelPool channels;
  int nccl_sms;
  std::vector<std::shared_ptr<GroupState>> groups;
  // Calls some party has issued and some has not: (group, pair low, pair high, sequence).
  std::map<std::tuple<int, int, int, std::uint64_t>, OpenCall> open;
  std::map<std::pair<int, int>, FlexBuffers> flex_buffers;  // (device, backend)

  // The member index of the calling host in g, or UsageError naming `op`.
  int caller_member(const GroupState& g, const Stream& s, const std::string& op) const;
  std::optional<Event> issue(GroupState& g, Call c, Stream& s, const CollOptions& o);
};

// Sizes of a contiguous layout: offsets[i] = sum of sizes[0..i).
std::vector<std::size_t> offsets_of(const std::vector<std::size_t>& sizes);
std::string sizes_text(const std::vector<std::size_t>& v);

}  // namespace nodeemu::detail
