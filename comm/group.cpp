// The collectives: each builds its party's plan (what goes to and comes from every peer, phase by
// phase) and hands it to CommState::issue, which does the rest.
#include "comm/group.hpp"

#include <algorithm>

#include "comm/comm_state.hpp"
#include "devices/check.hpp"
#include "devices/errors.hpp"
#include "devices/node.hpp"

namespace nodeemu {

using detail::Call;
using detail::ConstSegment;
using detail::Consume;
using detail::OpName;
using detail::PartyPhase;
using detail::Segment;

namespace {

bool functional(const Stream& s) {
  return s.device().node().mode() == Mode::Functional;
}

// A buffer of the caller's device holding at least `bytes`, or UsageError naming the op.
void check_buffer(const Buffer& b, std::size_t bytes, const Stream& s, const OpName& op,
                  const char* what) {
  if (bytes == 0) return;
  if (!b) throw UsageError(op.text() + ": the " + std::string(what) + " buffer is empty");
  if (b.kind() != MemoryKind::Device || b.device() != s.device().id())
    throw UsageError(op.text() + ": the " + std::string(what) + " buffer must be memory of " +
                     s.device().name() + ", the device of the stream");
  if (b.bytes() < bytes)
    throw UsageError(op.text() + ": the " + std::string(what) + " buffer has " +
                     std::to_string(b.bytes()) + " bytes but the call needs " +
                     std::to_string(bytes));
}

const std::byte* cptr(const Buffer& b, std::size_t offset) {
  return static_cast<const std::byte*>(b.data()) + offset;
}
std::byte* ptr(const Buffer& b, std::size_t offset) {
  return static_cast<std::byte*>(b.data()) + offset;
}

// A collective's latency, and for a symmetric one its loads on the caller's own links, as NCCL's
// default algorithm moves `bytes` (nccl-tests' size) under the fastest protocol
// (comm/collective_plan.hpp). All-to-all(v) and send/recv keep the loads of their messages.
CollectivePlan price_as_planned(Call& c, const Fabric& f, const GroupShape& shape, int my_rank,
                                Collective kind, std::size_t bytes, bool loads = true) {
  CollectivePlan p = plan_collective(kind, shape, static_cast<double>(bytes), f.figures());
  c.alpha_s = p.alpha_s;
  if (!loads) return p;
  std::vector<LinkLoad> out;
  f.add_plan(my_rank, p, out);
  c.loads = std::move(out);
  return p;
}
// A collective of the whole group, priced by its shape (kept by the group). A member that stands
// for skipped ones (representative ranks) puts the same plan on each of their links: the
// collective is symmetric.
void price_as_planned(Call& c, detail::CommState& comm, detail::GroupState& g, int me,
                      Collective kind, std::size_t bytes, bool loads = true) {
  const Fabric& f = comm.fabric;
  const CollectivePlan p =
      price_as_planned(c, f, g.shape(f), g.ranks[size_t(me)], kind, bytes, loads);
  if (!loads || comm.stands_for(g, me, {c.kind.c_str(), &g}).empty()) return;
  c.add_loads_of = [&f, &g, p](int member, std::vector<LinkLoad>& out) {
    f.add_plan(g.ranks[size_t(member)], p, out);
  };
}

std::vector<int> all_members(int n) {
  std::vector<int> v(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) v[size_t(i)] = i;
  return v;
}

// Whether `part` is `whole`'s block at byte `at`: a collective in place (Megatron's distributed
// optimizer reduce-scatters into, and all-gathers from, its own shard of a bucket). Buffers that
// share memory any other way are a UsageError.
bool in_place(const Buffer& whole, const Buffer& part, std::size_t at, int me, const OpName& op,
              const char* whole_name, const char* part_name) {
  if (!whole || !part || whole.state() != part.state()) return false;
  if (part.offset() != whole.offset() + at)
    throw UsageError(op.text() + ": " + whole_name + " and " + part_name + " share memory, but " +
                     part_name + " is not member " + std::to_string(me) + "'s block of " +
                     whole_name + "; use different buffers, or that block (in place)");
  return true;
}

std::size_t sum(const std::vector<std::size_t>& v) {
  std::size_t s = 0;
  for (auto x : v) s += x;
  return s;
}

}  // namespace

detail::OpName Group::op_name(const char* op) const {
  if (!g_)
    throw UsageError(std::string(op) +
                     ": the Group handle is empty; get one from a "
                     "Communicator");
  return {op, g_.get()};
}

const std::string& Group::name() const {
  return g_->name;
}
const std::vector<int>& Group::ranks() const {
  return g_->ranks;
}
int Group::size() const {
  return static_cast<int>(g_->ranks.size());
}
int Group::index_of(int device) const {
  auto it = std::find(g_->ranks.begin(), g_->ranks.end(), device);
  return it == g_->ranks.end() ? -1 : static_cast<int>(it - g_->ranks.begin());
}

const std::vector<int>& Group::stands_for(int member) const {
  return comm_->stands_for(*g_, member, op_name("stands_for"));
}

namespace {

// A reduction's element size, channel operation and name in traces and mismatch reports.
struct Reducing {
  std::size_t bytes;
  Consume consume;
  const char* name;
};

Reducing reducing(Reduction r) {
  switch (r) {
    case Reduction::SumBF16:
      return {2, Consume::AddBF16, "bf16 sum"};
    case Reduction::MaxF32:
      return {4, Consume::MaxF32, "f32 max"};
    case Reduction::SumF32:
      break;
  }
  return {4, Consume::AddF32, "f32 sum"};
}

}  // namespace

std::optional<Event> Group::all_to_all_v(const Buffer& send,
                                         const std::vector<std::size_t>& send_bytes,
                                         const Buffer& recv,
                                         const std::vector<std::size_t>& recv_bytes, Stream& stream,
                                         const CollOptions& o, const SendSizesOf& send_bytes_of) {
  const OpName op = op_name("all_to_all_v");
  const int me = comm_->caller_member(*g_, stream, op);
  const int n = size();
  if (static_cast<int>(send_bytes.size()) != n || static_cast<int>(recv_bytes.size()) != n)
    throw UsageError(op.text() + ": give one send and one receive size per member (" +
                     std::to_string(n) + ")");
  check_buffer(send, sum(send_bytes), stream, op, "send");
  check_buffer(recv, sum(recv_bytes), stream, op, "receive");
  Call c;
  c.kind = "all_to_all_v";
  c.text = [](const std::vector<PartyPhase>& plan) {
    return "all_to_all_v(send " + detail::sizes_text(plan[0].send_bytes) + " B, receive " +
           detail::sizes_text(plan[0].recv_bytes) + " B)";
  };
  c.parties = all_members(n);
  c.party = me;
  c.sms = comm_->nccl_sms;
  price_as_planned(c, *comm_, *g_, me, Collective::AllToAll, sum(send_bytes), false);
  if (send_bytes_of && !stands_for(me).empty())
    c.add_loads_of = [this, &send_bytes_of](int member, std::vector<LinkLoad>& out) {
      const std::vector<std::size_t> sizes = send_bytes_of(member);
      NE_CHECK(sizes.size() == g_->ranks.size(), "a skipped member's sizes, not one per member");
      for (std::size_t d = 0; d < sizes.size(); ++d)
        comm_->fabric.add_message(g_->ranks[size_t(member)], g_->ranks[d], double(sizes[d]), out);
    };
  PartyPhase p(static_cast<size_t>(n), functional(stream));
  p.send_bytes = send_bytes;
  p.recv_bytes = recv_bytes;
  if (functional(stream)) {
    auto so = detail::offsets_of(send_bytes), ro = detail::offsets_of(recv_bytes);
    for (int d = 0; d < n; ++d) {
      if (send_bytes[size_t(d)])
        p.send[size_t(d)] = {{cptr(send, so[size_t(d)]), send_bytes[size_t(d)]}};
      if (recv_bytes[size_t(d)])
        p.recv[size_t(d)] = {{ptr(recv, ro[size_t(d)]), recv_bytes[size_t(d)]}};
    }
  }
  c.plan.push_back(std::move(p));
  c.uses = {send, recv};
  return comm_->issue(*g_, std::move(c), stream, o);
}

std::optional<Event> Group::all_to_all(const Buffer& send, const Buffer& recv,
                                       std::size_t bytes_per_peer, Stream& stream,
                                       const CollOptions& o) {
  std::vector<std::size_t> v(size_t(size()), bytes_per_peer);
  return all_to_all_v(send, v, recv, v, stream, o);
}

std::optional<Event> Group::all_gather_v(const Buffer& send, std::size_t send_bytes,
                                         const Buffer& recv,
                                         const std::vector<std::size_t>& recv_bytes, Stream& stream,
                                         const CollOptions& o) {
  const OpName op = op_name("all_gather_v");
  const int me = comm_->caller_member(*g_, stream, op);
  const int n = size();
  if (static_cast<int>(recv_bytes.size()) != n)
    throw UsageError(op.text() + ": give one receive size per member (" + std::to_string(n) + ")");
  if (recv_bytes[size_t(me)] != send_bytes)
    throw UsageError(op.text() + ": this member sends " + std::to_string(send_bytes) +
                     " bytes but its own receive size is " +
                     std::to_string(recv_bytes[size_t(me)]));
  check_buffer(send, send_bytes, stream, op, "send");
  check_buffer(recv, sum(recv_bytes), stream, op, "receive");
  const auto ro = detail::offsets_of(recv_bytes);
  // In place, send is already where it goes.
  const bool inplace = in_place(recv, send, ro[size_t(me)], me, op, "receive", "send");
  Call c;
  c.kind = "all_gather_v";
  c.sizes_digest = detail::digest_of(recv_bytes);  // each sends its own receive size
  c.text = [send_bytes, recv_bytes](const std::vector<PartyPhase>&) {
    return "all_gather_v(send " + std::to_string(send_bytes) + " B, receive " +
           detail::sizes_text(recv_bytes) + " B)";
  };
  c.parties = all_members(n);
  c.party = me;
  c.sms = comm_->nccl_sms;
  price_as_planned(c, *comm_, *g_, me, Collective::AllGather, sum(recv_bytes));
  c.uses = {send, recv};
  if (!functional(stream)) {
    // Meta mode: checked by its digest, priced by its shape; no plan of n sizes is read.
    c.payload_bytes = double(n - 1) * double(send_bytes);
    c.plan.emplace_back(0, false);
    return comm_->issue(*g_, std::move(c), stream, o);
  }
  PartyPhase p(static_cast<size_t>(n), functional(stream));
  p.send_bytes.assign(size_t(n), send_bytes);
  p.recv_bytes = recv_bytes;
  if (inplace) p.send_bytes[size_t(me)] = p.recv_bytes[size_t(me)] = 0;  // nothing to move
  if (functional(stream)) {
    for (int d = 0; d < n; ++d) {
      if (p.send_bytes[size_t(d)]) p.send[size_t(d)] = {{cptr(send, 0), send_bytes}};
      if (p.recv_bytes[size_t(d)])
        p.recv[size_t(d)] = {{ptr(recv, ro[size_t(d)]), recv_bytes[size_t(d)]}};
    }
  }
  c.plan.push_back(std::move(p));
  return comm_->issue(*g_, std::move(c), stream, o);
}

std::optional<Event> Group::all_gather(const Buffer& send, const Buffer& recv, std::size_t bytes,
                                       Stream& stream, const CollOptions& o) {
  return all_gather_v(send, bytes, recv, std::vector<std::size_t>(size_t(size()), bytes), stream,
                      o);
}

std::optional<Event> Group::reduce_scatter(const Buffer& send, const Buffer& recv,
                                           const std::vector<std::size_t>& counts, Stream& stream,
                                           const CollOptions& o, Reduction red) {
  const OpName op = op_name("reduce_scatter");
  const int me = comm_->caller_member(*g_, stream, op);
  const int n = size();
  if (static_cast<int>(counts.size()) != n)
    throw UsageError(op.text() + ": give one element count per member (" + std::to_string(n) + ")");
  std::vector<std::size_t> bytes(counts.size());
  const Reducing how = reducing(red);
  for (size_t i = 0; i < counts.size(); ++i) bytes[i] = counts[i] * how.bytes;
  check_buffer(send, sum(bytes), stream, op, "send");
  check_buffer(recv, bytes[size_t(me)], stream, op, "receive");
  const auto so = detail::offsets_of(bytes);
  const bool inplace = in_place(send, recv, so[size_t(me)], me, op, "send", "receive");
  Call c;
  c.kind = std::string("reduce_scatter(") + how.name + ")";
  c.sizes_digest = detail::digest_of(counts);
  c.text = [name = how.name, counts](const std::vector<PartyPhase>&) {
    return std::string("reduce_scatter(") + name + ", counts " + detail::sizes_text(counts) + ")";
  };
  c.parties = all_members(n);
  c.party = me;
  c.sms = comm_->nccl_sms;
  price_as_planned(c, *comm_, *g_, me, Collective::ReduceScatter, sum(bytes));
  if (!functional(stream)) {
    // Meta mode: checked by its digest, priced by its shape. Its two phases (the reduction, and
    // in place the copy home, which moves nothing between members), with no plan of n sizes.
    c.payload_bytes = double(sum(bytes) - bytes[size_t(me)]);
    c.plan.emplace_back(0, false);
    c.plan.emplace_back(0, false);
    c.uses = {send, recv};
    return comm_->issue(*g_, std::move(c), stream, o);
  }
  PartyPhase p(static_cast<size_t>(n), functional(stream));
  p.send_bytes = bytes;
  p.recv_bytes.assign(size_t(n), bytes[size_t(me)]);
  // The fixed order: member 0's part is copied, the others are added to it one by one.
  p.ordered = true;
  p.consume.assign(size_t(n), how.consume);
  p.consume[0] = Consume::Copy;
  if (functional(stream)) {
    for (int d = 0; d < n; ++d) {
      if (bytes[size_t(d)]) p.send[size_t(d)] = {{cptr(send, so[size_t(d)]), bytes[size_t(d)]}};
      if (bytes[size_t(me)]) p.recv[size_t(d)] = {{ptr(recv, 0), bytes[size_t(me)]}};
    }
  }
  c.plan.push_back(std::move(p));
  // In place, the sum goes to scratch (NCCL's internal buffer) while this member's own part is
  // still being sent, then a second phase copies it home: a copy to itself, which the fabric does
  // not price, so the timing is the out-of-place call's. Every member has the phase (members may
  // differ in placement), empty when not in place.
  PartyPhase home(static_cast<size_t>(n), functional(stream));
  if (inplace) {
    home.send_bytes[size_t(me)] = home.recv_bytes[size_t(me)] = bytes[size_t(me)];
    if (functional(stream) && bytes[size_t(me)]) {
      const std::size_t mine = bytes[size_t(me)];
      auto scratch =
          std::make_shared<std::vector<float>>((mine + sizeof(float) - 1) / sizeof(float));
      auto* sc = reinterpret_cast<std::byte*>(scratch->data());
      for (int d = 0; d < n; ++d) c.plan[0].recv[size_t(d)] = {{sc, mine}};
      home.send[size_t(me)] = {{sc, mine}};
      home.recv[size_t(me)] = {{ptr(recv, 0), mine}};
      c.keep = std::move(scratch);
    }
  }
  c.plan.push_back(std::move(home));
  c.uses = {send, recv};
  return comm_->issue(*g_, std::move(c), stream, o);
}

std::optional<Event> Group::all_reduce(const Buffer& send, const Buffer& recv, std::size_t count,
                                       Stream& stream, const CollOptions& o, Reduction red) {
  const OpName op = op_name("all_reduce");
  const Reducing how = reducing(red);
  const int me = comm_->caller_member(*g_, stream, op);
  const int n = size();
  check_buffer(send, count * how.bytes, stream, op, "send");
  check_buffer(recv, count * how.bytes, stream, op, "receive");
  // Reduce-scatter into a private chunk, then all-gather the chunks: the ring algorithm's
  // traffic, and every member sums its chunk in member order, so all get the same bits. The
  // chunk goes to scratch memory so that send and recv may be the same buffer.
  auto chunk_of = [&](int i) {
    return (count / size_t(n) + (size_t(i) < count % size_t(n) ? 1 : 0)) * how.bytes;
  };
  const std::size_t mine = chunk_of(me);
  Call c;
  c.kind = std::string("all_reduce(") + how.name + ", " + std::to_string(count) + ")";
  c.sizes_digest = 0;  // the kind holds the count
  c.text = [name = how.name, count](const std::vector<PartyPhase>&) {
    return std::string("all_reduce(") + name + ", count " + std::to_string(count) + ")";
  };
  c.parties = all_members(n);
  c.party = me;
  c.sms = comm_->nccl_sms;
  price_as_planned(c, *comm_, *g_, me, Collective::AllReduce, count * how.bytes);
  c.uses = {send, recv};
  if (!functional(stream)) {
    // Meta mode: checked by its kind, priced by its shape; no plan of n sizes. It sends every
    // other member's chunk, then its own to each of them.
    c.payload_bytes = double(count * how.bytes - mine) + double(n - 1) * double(mine);
    c.plan.emplace_back(0, false);
    c.plan.emplace_back(0, false);
    return comm_->issue(*g_, std::move(c), stream, o);
  }
  std::vector<std::size_t> chunk(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) chunk[size_t(i)] = chunk_of(i);
  auto at = detail::offsets_of(chunk);
  PartyPhase rs(static_cast<size_t>(n), functional(stream)),
      ag(static_cast<size_t>(n), functional(stream));
  rs.send_bytes = chunk;
  rs.recv_bytes.assign(size_t(n), mine);
  rs.ordered = true;
  rs.consume.assign(size_t(n), how.consume);
  rs.consume[0] = Consume::Copy;
  ag.send_bytes.assign(size_t(n), mine);
  ag.recv_bytes = chunk;
  c.plan = {std::move(rs), std::move(ag)};
  if (functional(stream)) {
    for (int d = 0; d < n; ++d)
      if (chunk[size_t(d)])
        c.plan[0].send[size_t(d)] = {{cptr(send, at[size_t(d)]), chunk[size_t(d)]}};
    for (int d = 0; d < n; ++d)
      if (chunk[size_t(d)])
        c.plan[1].recv[size_t(d)] = {{ptr(recv, at[size_t(d)]), chunk[size_t(d)]}};
  }
  if (functional(stream) && mine) {
    // Host memory standing in for NCCL's internal buffer; the call's bodies keep it alive.
    auto scratch = std::make_shared<std::vector<float>>((mine + sizeof(float) - 1) / sizeof(float));
    auto* s = reinterpret_cast<std::byte*>(scratch->data());
    for (int d = 0; d < n; ++d) {
      c.plan[0].recv[size_t(d)] = {{s, mine}};
      c.plan[1].send[size_t(d)] = {{s, mine}};
    }
    c.keep = std::move(scratch);
  }
  return comm_->issue(*g_, std::move(c), stream, o);
}

std::optional<Event> Group::broadcast(const Buffer& buf, std::size_t bytes, int root,
                                      Stream& stream, const CollOptions& o) {
  const OpName op = op_name("broadcast");
  const int me = comm_->caller_member(*g_, stream, op);
  const int n = size();
  if (root < 0 || root >= n)
    throw UsageError(op.text() + ": root " + std::to_string(root) + " is not a member index (0.." +
                     std::to_string(n - 1) + ")");
  check_buffer(buf, bytes, stream, op, "data");
  Call c;
  c.kind = "broadcast(root " + std::to_string(root) + ")";
  c.text = [root, bytes](const std::vector<PartyPhase>&) {
    return "broadcast(root " + std::to_string(root) + ", " + std::to_string(bytes) + " B)";
  };
  c.parties = all_members(n);
  c.party = me;
  c.sms = comm_->nccl_sms;
  price_as_planned(c, *comm_, *g_, me, Collective::Broadcast, bytes);
  PartyPhase p(static_cast<size_t>(n), functional(stream));
  if (me == root) {
    for (int d = 0; d < n; ++d)
      if (d != root) p.send_bytes[size_t(d)] = bytes;
  } else {
    p.recv_bytes[size_t(root)] = bytes;
  }
  if (functional(stream) && bytes) {
    for (int d = 0; d < n; ++d) {
      if (p.send_bytes[size_t(d)]) p.send[size_t(d)] = {{cptr(buf, 0), bytes}};
      if (p.recv_bytes[size_t(d)]) p.recv[size_t(d)] = {{ptr(buf, 0), bytes}};
    }
  }
  c.plan.push_back(std::move(p));
  c.uses = {buf};
  return comm_->issue(*g_, std::move(c), stream, o);
}

std::optional<Event> Group::send_recv(int peer, const Buffer& send, std::size_t send_bytes,
                                      const Buffer& recv, std::size_t recv_bytes, Stream& stream,
                                      const CollOptions& o) {
  const OpName op = op_name("send_recv");
  const int me = comm_->caller_member(*g_, stream, op);
  if (peer < 0 || peer >= size() || peer == me)
    throw UsageError(op.text() + ": peer " + std::to_string(peer) +
                     " must be another member's index (0.." + std::to_string(size() - 1) + ")");
  check_buffer(send, send_bytes, stream, op, "send");
  check_buffer(recv, recv_bytes, stream, op, "receive");
  Call c;
  c.kind = "send_recv";
  c.text = [peer_rank = g_->ranks[size_t(peer)], send_bytes,
            recv_bytes](const std::vector<PartyPhase>&) {
    return "send_recv(peer rank " + std::to_string(peer_rank) + ", send " +
           std::to_string(send_bytes) + " B, receive " + std::to_string(recv_bytes) + " B)";
  };
  const int lo = std::min(me, peer), hi = std::max(me, peer);
  c.parties = {lo, hi};
  c.party = me == lo ? 0 : 1;
  const size_t other = size_t(1 - c.party);
  c.p2p_peer = peer;
  // NCCL runs point-to-point with one channel's worth of SMs; copy-engine p2p would take none.
  c.sms = std::max(1, comm_->nccl_sms / 8);
  price_as_planned(
      c, comm_->fabric, comm_->fabric.shape({g_->ranks[size_t(lo)], g_->ranks[size_t(hi)]}),
      g_->ranks[size_t(lo)], Collective::SendRecv, std::max(send_bytes, recv_bytes), false);
  PartyPhase p(2, functional(stream));
  p.send_bytes[other] = send_bytes;
  p.recv_bytes[other] = recv_bytes;
  if (functional(stream)) {
    if (send_bytes) p.send[other] = {{cptr(send, 0), send_bytes}};
    if (recv_bytes) p.recv[other] = {{ptr(recv, 0), recv_bytes}};
  }
  c.plan.push_back(std::move(p));
  c.uses = {send, recv};
  return comm_->issue(*g_, std::move(c), stream, o);
}

}  // namespace nodeemu
