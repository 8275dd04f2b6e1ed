#include "comm/communicator.hpp"

#include <algorithm>

#include "comm/comm_state.hpp"
#include "comm/errors.hpp"
#include "devices/check.hpp"
#include "devices/node.hpp"

namespace nodeemu {
namespace detail {

namespace {

std::vector<int> real_numa_of(Node& node) {
  std::vector<int> out;
  for (int d = 0; d < node.device_count(); ++d) out.push_back(node.device(d).placement().real_numa);
  return out;
}

}  // namespace

CommState::CommState(Node& n, CommOptions o)
    : node(&n),
      multi_party(n),
      options(o),
      fabric(n),
      channels(real_numa_of(n), o.slot_bytes, o.slots),
      nccl_sms(o.nccl_sms > 0 ? o.nccl_sms : n.topology().comm.nccl_sms) {
  if (nccl_sms > n.topology().gpu.sms)
    throw ConfigError("comm options", "nccl_sms",
                      std::to_string(nccl_sms) + " is more SMs than the GPU has (" +
                          std::to_string(n.topology().gpu.sms) + ")");
}

GroupState::GroupState(int group_id, std::string group_name, std::vector<int> member_ranks)
    : id(group_id),
      name(std::move(group_name)),
      ranks(std::move(member_ranks)),
      next_seq(ranks.size(), 0) {
  // A long group's label keeps its first eight ranks and its last: the label is part of every
  // rendezvous name, and a data-parallel group of thousands of ranks would make each one kilobytes.
  constexpr std::size_t kListed = 16, kHead = 8;
  std::string r;
  for (std::size_t i = 0; i < ranks.size(); ++i) {
    if (ranks.size() > kListed && i == kHead) {
      r += ",...," + std::to_string(ranks.back()) + "; " + std::to_string(ranks.size()) + " in all";
      break;
    }
    r += (r.empty() ? "" : ",") + std::to_string(ranks[i]);
  }
  label_ = "'" + name + "' (ranks " + r + ")";
}

const GroupShape& GroupState::shape(const Fabric& f) {
  if (!shape_) shape_ = f.shape(ranks);
  return *shape_;
}

std::uint64_t digest_of(const std::vector<std::size_t>& sizes) {
  // Word by word, each mixed by splitmix64's finaliser before it is folded in.
  std::uint64_t h = sizes.size();
  for (std::size_t v : sizes) {
    std::uint64_t z = v + 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    h = (h ^ (z ^ (z >> 31))) * 0x100000001b3ull;
  }
  return h;
}

std::vector<std::size_t> offsets_of(const std::vector<std::size_t>& sizes) {
  std::vector<std::size_t> out(sizes.size());
  std::size_t at = 0;
  for (size_t i = 0; i < sizes.size(); ++i) out[i] = at, at += sizes[i];
  return out;
}

std::string sizes_text(const std::vector<std::size_t>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? "," : "") + std::to_string(v[i]);
  return s + "]";
}

int CommState::caller_member(const GroupState& g, const Stream& s, const OpName& op) const {
  const int rank = node->host().rank();
  if (rank < 0)
    throw UsageError(op.text() +
                     ": called from the main program; collectives are issued by the ranks' host "
                     "programs inside Node::run");
  auto it = std::find(g.ranks.begin(), g.ranks.end(), rank);
  if (it == g.ranks.end())
    throw UsageError(op.text() + ": rank " + std::to_string(rank) + " is not a member of group " +
                     g.label());
  if (!s.state() || s.device().id() != rank)
    throw UsageError(op.text() + ": rank " + std::to_string(rank) +
                     " must issue it on a stream of its own device");
  return static_cast<int>(it - g.ranks.begin());
}

std::optional<Event> CommState::issue(GroupState& g, Call c, Stream& s, const CollOptions& o) {
  MultiParty& e = multi_party;
  NE_CHECK(static_cast<bool>(c.text), "a collective's Call without its report text");
  const int parties = static_cast<int>(c.parties.size());
  const int phases = static_cast<int>(c.plan.size());
  const int member = c.parties[size_t(c.party)];
  // Representative ranks: the call completes when the members that run have joined, and this one
  // carries the traffic of the skipped members it stands for. A transfer's peer must run.
  const OpName op{c.kind.c_str(), &g};
  // A transfer carries its own pair's bytes only: the skipped members' transfers are between
  // skipped ranks, on links no running rank uses.
  static const std::vector<int> kNobody;
  const std::vector<int>& stands_for = c.p2p_peer >= 0 ? kNobody : this->stands_for(g, member, op);
  int waiting = parties;
  if (!representative_of.empty()) {
    if (c.p2p_peer >= 0) {
      const int peer_rank = g.ranks[size_t(c.p2p_peer)];
      if (representative_of[size_t(peer_rank)] != peer_rank)
        throw UsageError(c.text(c.plan) + " on group " + g.label() + ": its peer rank " +
                         std::to_string(peer_rank) +
                         " does not run (representative ranks); run every rank "
                         "(emulator.ranks: all)");
    } else if (const GroupState::Standing* st = g.standing(representative_of, op)) {
      NE_CHECK(parties == int(g.ranks.size()), "a group call of some members only");
      waiting = st->simulated;
    }
  }
  // Point-to-point transfers are matched per pair, collectives per group.
  std::tuple<int, int, int, std::uint64_t> key;
  std::uint64_t seq;
  if (c.p2p_peer >= 0) {
    seq = g.p2p_next[{member, c.p2p_peer}]++;
    key = {g.id, std::min(member, c.p2p_peer), std::max(member, c.p2p_peer), seq};
  } else {
    seq = g.next_seq[size_t(member)]++;
    key = {g.id, -1, -1, seq};
  }
  auto it = open.find(key);
  if (it == open.end()) {
    std::vector<int> devices;
    for (int m : c.parties) devices.push_back(g.ranks[size_t(m)]);
    std::string label =
        c.kind.substr(0, c.kind.find('(')) + " #" + std::to_string(seq) + " on group " + g.label();
    OpenCall oc{e.open(waiting, phases, std::move(label), g.name),
                std::make_shared<Exchange>(parties, phases, devices)};
    if (c.sizes_digest) {
      oc.in.assign(size_t(parties), 0);
    } else {
      oc.kinds.resize(size_t(parties));
      oc.texts.resize(size_t(parties));
    }
    it = open.emplace(key, std::move(oc)).first;
  }
  OpenCall& oc = it->second;
  const bool digested = c.sizes_digest.has_value();
  auto undo_sequence = [&] {
    --(c.p2p_peer >= 0 ? g.p2p_next[{member, c.p2p_peer}] : g.next_seq[size_t(member)]);
  };
  // The order checker: this call must agree with every peer that has already issued its own; a
  // digested call, with the first (agreement is transitive there). A digested call and one
  // checked pair by pair are different calls.
  if (digested != !oc.in.empty()) {
    int j = oc.first;
    for (int k = 0; j < 0 && k < parties; ++k)
      if (!oc.kinds[size_t(k)].empty()) j = k;
    NE_CHECK(j >= 0, "an open call has a party that joined");
    const std::string other =
        digested ? oc.texts[size_t(j)](oc.exchange->plan(j)) : oc.first_text({});
    undo_sequence();
    throw CollectiveMismatchError(g.label(), seq, g.ranks[size_t(c.parties[size_t(j)])], other,
                                  g.ranks[size_t(member)], c.text(c.plan));
  }
  if (digested && oc.first >= 0 &&
      (oc.first_kind != c.kind || oc.first_digest != *c.sizes_digest)) {
    undo_sequence();
    throw CollectiveMismatchError(g.label(), seq, g.ranks[size_t(c.parties[size_t(oc.first)])],
                                  oc.first_text({}), g.ranks[size_t(member)], c.text(c.plan));
  }
  for (int j = 0; !digested && j < parties; ++j) {
    if (oc.kinds[size_t(j)].empty() || j == c.party) continue;
    bool ok = oc.kinds[size_t(j)] == c.kind;
    const auto& other = oc.exchange->plan(j);
    for (int k = 0; ok && k < phases; ++k) {
      const PartyPhase& a = c.plan[size_t(k)];
      const PartyPhase& b = other[size_t(k)];
      ok = a.send_bytes[size_t(j)] == b.recv_bytes[size_t(c.party)] &&
           b.send_bytes[size_t(c.party)] == a.recv_bytes[size_t(j)];
    }
    if (!ok) {
      undo_sequence();
      throw CollectiveMismatchError(g.label(), seq, g.ranks[size_t(c.parties[size_t(j)])],
                                    oc.texts[size_t(j)](other), g.ranks[size_t(member)],
                                    c.text(c.plan));
    }
  }
  if (digested ? oc.in[size_t(c.party)] != 0 : !oc.kinds[size_t(c.party)].empty())
    throw UsageError(c.text(c.plan) + ": rank " + std::to_string(g.ranks[size_t(member)]) +
                     " joined the same call twice");
  // Timing: this party's share of the link loads and of the latency.
  std::vector<LinkLoad> loads;
  const bool priced_by_loads = c.loads.has_value();
  if (priced_by_loads) {
    loads = std::move(*c.loads);
  } else {
    loads.reserve(c.plan.size() * std::size_t(parties) * 2);  // a path is one or two links
    for (const PartyPhase& p : c.plan)
      for (int d = 0; d < parties; ++d)
        fabric.add_message(g.ranks[size_t(member)], g.ranks[size_t(c.parties[size_t(d)])],
                           static_cast<double>(p.send_bytes[size_t(d)]), loads);
  }
  for (int m : stands_for) {
    if (c.add_loads_of) {
      c.add_loads_of(m, loads);
      continue;
    }
    NE_CHECK(!priced_by_loads, "a call priced by its loads without its skipped members' loads");
    for (const PartyPhase& p : c.plan)
      for (int d = 0; d < parties; ++d)
        fabric.add_message(g.ranks[size_t(m)],
                           g.ranks[size_t((d - member + m + parties) % parties)],
                           static_cast<double>(p.send_bytes[size_t(d)]), loads);
  }
  double alpha = 0;
  if (c.alpha_s) {
    alpha = *c.alpha_s;
  } else {
    double hop = 0;
    for (int d : c.parties)
      if (d != member)
        hop = std::max(hop, fabric.latency_s(g.ranks[size_t(member)], g.ranks[size_t(d)]));
    alpha = hop * c.latency_steps;
  }

  // What the trace says this party sends: its blocks for the other members, every phase.
  double payload = c.payload_bytes.value_or(0);
  if (!c.payload_bytes)
    for (const PartyPhase& p : c.plan)
      for (int d = 0; d < parties; ++d)
        if (d != c.party) payload += static_cast<double>(p.send_bytes[size_t(d)]);
  if (digested) {
    oc.in[size_t(c.party)] = 1;
    if (oc.first < 0) {
      oc.first = c.party;
      oc.first_kind = c.kind;
      oc.first_digest = *c.sizes_digest;
      oc.first_text = std::move(c.text);
    }
  } else {
    oc.kinds[size_t(c.party)] = c.kind;
    oc.texts[size_t(c.party)] = std::move(c.text);
  }
  if (digested && e.mode() == Mode::Meta) {
    // Nothing reads a meta call's plan once checked: no party's is kept.
  } else if (c.planner && e.mode() == Mode::Functional) {
    oc.exchange->set_deferred(c.party, std::move(c.plan[1]), std::move(c.planner),
                              std::move(c.receiver));
  } else {
    oc.exchange->set(c.party, std::move(c.plan));
  }
  const bool last = ++oc.joined == waiting;
  if (last && e.mode() == Mode::Functional) oc.exchange->build(channels);

  if (o.previous) s.wait(*o.previous);
  std::vector<std::function<void()>> bodies;
  if (e.mode() == Mode::Functional) {
    for (int k = 0; k < phases; ++k)
      bodies.push_back([ex = oc.exchange, keep = c.keep, p = c.party, k] { ex->run(p, k); });
  }
  const GpuSpec& spec = s.device().spec();
  const std::string name = o.name.empty() ? c.kind.substr(0, c.kind.find('(')) : o.name;
  e.join(oc.rv, s,
         {.name = name,
          .sms = o.num_sms > 0 ? o.num_sms : c.sms,
          .host_cost_s = spec.kernel_launch_host_s,
          .latency_s = spec.launch_latency_s,
          .alpha_s = alpha,
          .loads = std::move(loads),
          .phase_bodies = std::move(bodies),
          .uses = std::move(c.uses),
          .payload_bytes = payload});
  if (last) open.erase(it);

  Event done;
  s.record(done);
  if (o.async) return done;
  done.synchronize();
  return std::nullopt;
}

}  // namespace detail

Communicator::Communicator(Node& node, CommOptions options)
    : state_(std::make_shared<detail::CommState>(node, options)) {}

Communicator::~Communicator() {
  // Operations still queued read this communicator's channels: let them run out first.
  state_->multi_party.drain_functional();
}

Group Communicator::group(std::vector<int> ranks, const std::string& name) {
  if (ranks.empty()) throw UsageError("group '" + name + "': no ranks given");
  std::vector<int> sorted = ranks;
  std::sort(sorted.begin(), sorted.end());
  for (size_t i = 0; i < sorted.size(); ++i) {
    if (sorted[i] < 0 || sorted[i] >= state_->node->device_count())
      throw UsageError("group '" + name + "': rank " + std::to_string(sorted[i]) +
                       " is not a device of this node (0.." +
                       std::to_string(state_->node->device_count() - 1) + ")");
    if (i > 0 && sorted[i] == sorted[i - 1])
      throw UsageError("group '" + name + "': rank " + std::to_string(sorted[i]) +
                       " is listed twice");
  }
  auto& named = state_->groups_by_name[name];
  for (auto& g : named)
    if (g->ranks == ranks) return Group(state_, g);
  auto g = std::make_shared<detail::GroupState>(static_cast<int>(state_->groups.size()), name,
                                                std::move(ranks));
  state_->groups.push_back(g);
  named.push_back(g);
  return Group(state_, g);
}

Group Communicator::group_of(const ProcessGroups& pg, GroupKind kind, int rank) {
  if (pg.layout().world != state_->node->device_count())
    throw ConfigError("parallel layout", "world",
                      std::to_string(pg.layout().world) + " ranks but the node has " +
                          std::to_string(state_->node->device_count()) +
                          " devices; use a layout whose world size is the device count");
  return group(pg.group_of(kind, rank),
               std::string(to_string(kind)) + std::to_string(pg.group_index(kind, rank)));
}

Node& Communicator::node() const {
  return *state_->node;
}
const Fabric& Communicator::fabric() const {
  return state_->fabric;
}
detail::ChannelPool& Communicator::channels() const {
  return state_->channels;
}
int Communicator::nccl_sms() const {
  return state_->nccl_sms;
}

}  // namespace nodeemu
