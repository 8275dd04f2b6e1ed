// Internal: what a Communicator owns, and the one path every collective, point-to-point and
// dispatcher call takes: order check, rendezvous, channels and link costs.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <unordered_map>
#include <vector>

#include "comm/channel.hpp"
#include "comm/communicator.hpp"
#include "comm/exchange.hpp"
#include "comm/fabric.hpp"
#include "comm/group.hpp"
#include "devices/multi_party.hpp"

namespace nodeemu::detail {

struct OpName;

struct GroupState {
  GroupState(int group_id, std::string group_name, std::vector<int> member_ranks);
  int id = 0;
  std::string name;
  std::vector<int> ranks;
  std::vector<std::uint64_t> next_seq;                    // per member: its next collective
  std::map<std::pair<int, int>, std::uint64_t> p2p_next;  // (member, peer): next transfer
  // "'ep0' (ranks 0,1,2,3)"; a group of more than 16 ranks names its first eight, its last and
  // how many: every collective's rendezvous is named with it.
  const std::string& label() const { return label_; }
  // Its shape on the fabric (Fabric::shape), worked out on the first collective that prices
  // by it: every member's call of a group of n ranks would otherwise walk the n ranks again.
  const GroupShape& shape(const Fabric& f);

  // Representative ranks (Communicator::represent): the members that run, and per member the
  // skipped members it stands for. Null where every member runs.
  struct Standing {
    int simulated = 0;
    std::vector<std::vector<int>> stands_for;  // [member]: member indices
  };
  // Worked out on the group's first call from a member that runs; `op` names the call in the
  // UsageError for a skipped member whose representative is not in the group (its link loads
  // would then have no one to carry them).
  const Standing* standing(const std::vector<int>& representative_of, const OpName& op);

 private:
  std::string label_;  // built once
  std::optional<GroupShape> shape_;
  std::optional<Standing> standing_;
  bool standing_known_ = false;
};

// An operation's name for its errors, "all_to_all_v on group 'ep0' (ranks 0,1)", rendered only
// when one is thrown: a call that succeeds builds no text (issue 19: report texts were 7 % of
// a 64-byte all-to-all on 8 ranks).
struct OpName {
  const char* op;
  const GroupState* group;
  std::string text() const { return std::string(op) + " on group " + group->label(); }
};

// One party's call, as the group methods and the dispatchers build it.
struct Call {
  // The call as a mismatch or a misuse reports it, the kind with this party's sizes: rendered
  // from the party's plan (its sizes) and whatever else the call captured, only for a report.
  using Text = std::function<std::string(const std::vector<PartyPhase>& plan)>;
  std::string kind;  // what must match across parties: "all_to_all_v", "broadcast(root 2)"
  Text text;
  std::vector<int> parties;      // members taking part (all of them, or a p2p pair), party order
  int party = 0;                 // the caller's index in `parties`
  std::vector<PartyPhase> plan;  // one per phase, each sized parties.size()
  int sms = 0;
  int latency_steps = 1;  // alpha is this many times the slowest hop's latency
  // The latency of an NCCL-like call as its plan prices it (comm/collective_plan.hpp), instead.
  std::optional<double> alpha_s;
  // The caller's link loads; when unset, each phase's sends are costed as direct messages.
  std::optional<std::vector<LinkLoad>> loads;
  std::vector<Buffer> uses;
  std::shared_ptr<void> keep;  // host-side memory the call's functional work needs
  // Functional mode, routing the host never saw: plan = {zeros, declared sizes}, and this
  // computes the real phase-1 plan on the party's worker (see Exchange::set_deferred).
  Exchange::Planner planner;
  Exchange::Receiver receiver;
  int p2p_peer = -1;  // member index of the peer for point-to-point calls
  // Set where every party's sizes follow from its kind and this digest of the sizes it was given
  // (an all-reduce's count, a reduce-scatter's counts per member): parties agree when their kinds
  // and digests do. The order checker then compares each party with the first one alone, and
  // meta mode keeps no party's plan: checked pair by pair, a group of n ranks cost n^2 per call
  // in time and, with every plan kept until the last party joined, in memory (issue 53: a
  // data-parallel group of 4,096 ranks took 6 GiB).
  std::optional<std::uint64_t> sizes_digest;
  // What this party sends to the others over every phase, for the trace, where its plan does
  // not say (a digested call in meta mode builds none); else summed from the plan.
  std::optional<double> payload_bytes;
  // Representative ranks: adds the link loads of `member`, a skipped member this caller stands
  // for, to `out`. Needed where `loads` is set; without `loads`, a skipped member's messages are
  // the caller's own, turned to its peers (member m sends to m + j what the caller sends to
  // party + j).
  std::function<void(int member, std::vector<LinkLoad>& out)> add_loads_of;
};

// A digest of a call's sizes, for Call::sizes_digest.
std::uint64_t digest_of(const std::vector<std::size_t>& sizes);

struct OpenCall {
  RendezvousId rv;
  std::shared_ptr<Exchange> exchange;
  std::vector<std::string> kinds;  // per party, "" until it joined (calls checked pair by pair)
  std::vector<Call::Text> texts;   // per party, rendered from exchange->plan(party)
  int joined = 0;
  // Calls with a sizes digest are checked against the first party that joined, whose kind,
  // digest and text these keep; `in` says who has joined.
  std::vector<char> in;
  int first = -1;
  std::string first_kind;
  std::uint64_t first_digest = 0;
  Call::Text first_text;
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
  // The groups by name, for Communicator::group: every rank asks for each of its groups, and a
  // scan of all groups per ask grew with the square of the ranks.
  std::unordered_map<std::string, std::vector<std::shared_ptr<GroupState>>> groups_by_name;
  // Calls some party has issued and some has not: (group, pair low, pair high, sequence).
  std::map<std::tuple<int, int, int, std::uint64_t>, OpenCall> open;
  std::map<std::pair<int, int>, FlexBuffers> flex_buffers;  // (device, backend)
  // Communicator::represent: per rank, the rank that runs in its place (itself if it runs);
  // empty: every rank runs.
  std::vector<int> representative_of;

  // The skipped members `me` stands for in g (empty when every member runs).
  const std::vector<int>& stands_for(GroupState& g, int me, const OpName& op);

  // The member index of the calling host in g, or UsageError naming `op`.
  int caller_member(const GroupState& g, const Stream& s, const OpName& op) const;
  std::optional<Event> issue(GroupState& g, Call c, Stream& s, const CollOptions& o);
};

// Sizes of a contiguous layout: offsets[i] = sum of sizes[0..i).
std::vector<std::size_t> offsets_of(const std::vector<std::size_t>& sizes);
std::string sizes_text(const std::vector<std::size_t>& v);

}  // namespace nodeemu::detail
