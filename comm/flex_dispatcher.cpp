#include "comm/flex_dispatcher.hpp"

#include <algorithm>
#include <cstring>

#include "comm/comm_state.hpp"
#include "devices/errors.hpp"
#include "devices/node.hpp"

namespace nodeemu {
namespace detail {

// One rank's routing for one dispatch: filled on the host after the sync, or on the rank's
// worker (capacity mode), and read by the combine that reuses the handle.
struct FlexRouting {
  std::vector<std::vector<int>> to;  // [member]: this rank's tokens that go there, ascending
  std::vector<int> from;             // [member]: tokens received from there
  std::vector<int> offset;           // [member]: first received row from there
  int received = 0;

  void route(const std::int64_t* topk_idx, int tokens, int topk, int experts_per_rank,
             int members) {
    to.assign(size_t(members), {});
    for (int t = 0; t < tokens; ++t) {
      // Once per destination rank, however many of the token's experts live there.
      int last = -1;
      std::vector<int> ranks;
      for (int k = 0; k < topk; ++k) {
        const std::int64_t e = topk_idx[size_t(t) * size_t(topk) + size_t(k)];
        if (e < 0) continue;  // a dropped slot
        ranks.push_back(static_cast<int>(e / experts_per_rank));
      }
      std::sort(ranks.begin(), ranks.end());
      for (int r : ranks)
        if (r != last) to[size_t(r)].push_back(t), last = r;
    }
  }
  void receive(const std::vector<std::size_t>& rows) {
    from.assign(rows.size(), 0);
    offset.assign(rows.size(), 0);
    received = 0;
    for (size_t s = 0; s < rows.size(); ++s) {
      from[s] = static_cast<int>(rows[s]);
      offset[s] = received;
      received += from[s];
    }
  }
};

}  // namespace detail

using detail::Call;
using detail::ConstSegment;
using detail::Consume;
using detail::FlexRouting;
using detail::PartyPhase;
using detail::Segment;

namespace {

const char* backend_name(FlexBackend b) {
  return b == FlexBackend::DeepEP ? "deepep" : "hybridep";
}

}  // namespace

FlexDispatcher::FlexDispatcher(Group ep, int num_experts, int hidden, int topk, FlexConfig config)
    : ep_(std::move(ep)),
      num_experts_(num_experts),
      hidden_(hidden),
      topk_(topk),
      local_experts_(0),
      config_(config),
      sms_(0) {
  const NodeTopology& t = ep_.comm().node->topology();
  const std::string file = "flex dispatcher";
  if (num_experts <= 0 || num_experts % ep_.size() != 0)
    throw ConfigError(file, "num_experts",
                      std::to_string(num_experts) + " experts do not divide over the " +
                          std::to_string(ep_.size()) + " ranks of group '" + ep_.name() + "'");
  if (hidden <= 0 || topk <= 0 || topk > num_experts)
    throw ConfigError(file, "topk", "need hidden > 0 and 0 < topk <= num_experts");
  local_experts_ = num_experts / ep_.size();
  sms_ = config.num_sms > 0                      ? config.num_sms
         : config.backend == FlexBackend::DeepEP ? t.comm.deepep_sms
                                                 : t.comm.hybridep_sms;
  if (sms_ > t.gpu.sms)
    throw ConfigError(file, "num_sms",
                      std::to_string(sms_) + " SMs but the GPU has " + std::to_string(t.gpu.sms));
  if (config.backend == FlexBackend::DeepEP && sms_ % 2 != 0)
    throw ConfigError(file, "num_sms",
                      std::to_string(sms_) +
                          " is odd; DeepEP forms num_sms/2 channels, use an "
                          "even number such as 20");
  if (config.backend == FlexBackend::DeepEP && t.gpus > 8)
    throw ConfigError(file, "backend",
                      "DeepEP normal mode needs an NVLink domain of at most 8 GPUs but '" + t.name +
                          "' has " + std::to_string(t.gpus) + "; use the hybridep backend");
  if (config.chunk_tokens <= 0) throw ConfigError(file, "chunk_tokens", "must be positive");
  if (config.capacity < 0) throw ConfigError(file, "capacity", "must be >= 0 (0 = host sync)");
}

void FlexDispatcher::describe_and_cost(detail::Call& c, int me) {
  // The last phase holds what the host knows this party sends: the real sizes after a sync,
  // the declared budget otherwise.
  const std::vector<std::size_t>& send = c.plan.back().send_bytes;
  for (auto b : send) bytes_sent_ += b;
  c.text = c.kind + "(send " + detail::sizes_text(send) + " B)";
  c.loads = loads(send, me);
}

std::vector<detail::LinkLoad> FlexDispatcher::loads(const std::vector<std::size_t>& send_bytes,
                                                    int me) const {
  // Both backends cross nodes as the real ones do: RDMA to the GPU with the sender's local
  // index on the receiver's node, then NVLink inside that node.
  std::vector<detail::LinkLoad> out;
  const Fabric& f = ep_.comm().fabric;
  for (size_t d = 0; d < send_bytes.size(); ++d)
    f.add_hierarchical_message(ep_.ranks()[size_t(me)], ep_.ranks()[d],
                               static_cast<double>(send_bytes[d]), out);
  return out;
}

FlexLayout FlexDispatcher::get_dispatch_layout(const Buffer& topk_idx, int num_tokens,
                                               Stream& stream, const CollOptions& o) {
  if (o.previous) stream.wait(*o.previous);
  Device& dev = stream.device();
  const int n = ep_.size();
  FlexLayout l{dev.allocate(size_t(n) * 4), dev.allocate(size_t(num_experts_) * 4),
               dev.allocate(std::max<size_t>(1, size_t(num_tokens) * size_t(n)))};
  std::function<void()> body;
  if (dev.node().mode() == Mode::Functional) {
    auto* idx = topk_idx.as<const std::int64_t>();
    auto* per_rank = l.tokens_per_rank.as<std::int32_t>();
    auto* per_expert = l.tokens_per_expert.as<std::int32_t>();
    auto* in_rank = l.token_in_rank.as<std::uint8_t>();
    body = [=, topk = topk_, epr = local_experts_, experts = num_experts_] {
      std::fill(per_rank, per_rank + n, 0);
      std::fill(per_expert, per_expert + experts, 0);
      for (int t = 0; t < num_tokens; ++t) {
        std::uint8_t* row = in_rank + size_t(t) * size_t(n);
        std::fill(row, row + n, 0);
        for (int k = 0; k < topk; ++k) {
          const std::int64_t e = idx[size_t(t) * size_t(topk) + size_t(k)];
          if (e < 0) continue;
          if (e >= experts) throw UsageError("get_dispatch_layout: expert index out of range");
          ++per_expert[e];
          row[e / epr] = 1;
        }
        for (int r = 0; r < n; ++r) per_rank[r] += row[r];
      }
    };
  }
  const double bytes = double(num_tokens) * (topk_ * 8.0 + n);
  stream.launch({"get_dispatch_layout",
                 Work{.bytes = bytes, .shape = KernelShape::memory(MemoryOp::Elementwise)},
                 std::move(body),
                 {topk_idx, l.tokens_per_rank, l.tokens_per_expert, l.token_in_rank}});
  return l;
}

FlexDispatched FlexDispatcher::dispatch(const Buffer& x, const Buffer& topk_idx,
                                        const Buffer& topk_weight, int num_tokens, Stream& stream,
                                        const CollOptions& o) {
  Device& dev = stream.device();
  Node& node = dev.node();
  const int n = ep_.size();
  const int me = ep_.index_of(dev.id());
  if (me < 0)
    throw UsageError("flex dispatch: " + dev.name() + " is not in group '" + ep_.name() + "'");
  const bool functional = node.mode() == Mode::Functional;
  const std::size_t row = size_t(hidden_) * 4 + size_t(topk_) * 12;  // x, idx, weight
  if (!functional && config_.capacity == 0)
    throw UsageError(
        "flex dispatch: meta mode has no routing to wait for; set FlexConfig::capacity");
  if (o.previous) stream.wait(*o.previous);

  auto routing = std::make_shared<FlexRouting>();
  FlexDispatched out;
  out.handle.num_tokens = num_tokens;
  out.handle.routing = routing;
  Call c;
  c.kind = std::string("flex_dispatch(") + backend_name(config_.backend) + ")";
  c.parties.resize(size_t(n));
  for (int i = 0; i < n; ++i) c.parties[size_t(i)] = i;
  c.party = me;
  c.sms = sms_;
  c.latency_steps = 2;  // RDMA hop + NVLink hop across nodes; counted once inside one
  const int epr = local_experts_;
  const int topk = topk_, hidden = hidden_;

  // Where token t's three pieces start on the sender, and the receiver's three regions.
  auto send_segments = [=](const FlexRouting& r, int d, std::vector<ConstSegment>& segs) {
    const auto* xb = static_cast<const std::byte*>(x.data());
    const auto* ib = static_cast<const std::byte*>(topk_idx.data());
    const auto* wb = static_cast<const std::byte*>(topk_weight.data());
    for (int t : r.to[size_t(d)])
      segs.push_back({xb + size_t(t) * size_t(hidden) * 4, size_t(hidden) * 4});
    for (int t : r.to[size_t(d)])
      segs.push_back({ib + size_t(t) * size_t(topk) * 8, size_t(topk) * 8});
    for (int t : r.to[size_t(d)])
      segs.push_back({wb + size_t(t) * size_t(topk) * 4, size_t(topk) * 4});
  };
  int rows_cap = config_.capacity;
  if (config_.capacity == 0) {
    // DeepEP's notify step: the counts go round and the CPU spins until it has them.
    FlexLayout l = get_dispatch_layout(topk_idx, num_tokens, stream);
    Buffer got = dev.allocate(size_t(n) * 4);
    ep_.all_to_all(l.tokens_per_rank, got, 4, stream, {.async = true, .name = "notify_dispatch"});
    Buffer host =
        node.allocate_host(size_t(n) * 4, dev.placement().emulated_numa, true, dev.node_index());
    stream.copy(host, got, size_t(n) * 4, "recv counts D2H");
    Event counted;
    stream.record(counted);
    counted.synchronize();
    routing->route(topk_idx.as<const std::int64_t>(), num_tokens, topk, epr, n);
    std::vector<std::size_t> rows(static_cast<size_t>(n));
    for (int s = 0; s < n; ++s) rows[size_t(s)] = size_t(host.as<std::int32_t>()[s]);
    routing->receive(rows);
    rows_cap = routing->received;
    out.handle.num_recv = routing->received;
  }
  out.x = dev.allocate(std::max<size_t>(1, size_t(rows_cap) * size_t(hidden) * 4));
  out.topk_idx = dev.allocate(std::max<size_t>(1, size_t(rows_cap) * size_t(topk) * 8));
  out.topk_weight = dev.allocate(std::max<size_t>(1, size_t(rows_cap) * size_t(topk) * 4));
  auto recv_segments = [=, rx = out.x, ri = out.topk_idx, rw = out.topk_weight](
                           const FlexRouting& r, int s, std::vector<Segment>& segs) {
    const size_t at = size_t(r.offset[size_t(s)]), cnt = size_t(r.from[size_t(s)]);
    segs.push_back(
        {static_cast<std::byte*>(rx.data()) + at * size_t(hidden) * 4, cnt * size_t(hidden) * 4});
    segs.push_back(
        {static_cast<std::byte*>(ri.data()) + at * size_t(topk) * 8, cnt * size_t(topk) * 8});
    segs.push_back(
        {static_cast<std::byte*>(rw.data()) + at * size_t(topk) * 4, cnt * size_t(topk) * 4});
  };

  PartyPhase p(static_cast<size_t>(n));
  if (config_.capacity == 0) {
    for (int d = 0; d < n; ++d) p.send_bytes[size_t(d)] = routing->to[size_t(d)].size() * row;
    for (int s = 0; s < n; ++s) p.recv_bytes[size_t(s)] = size_t(routing->from[size_t(s)]) * row;
    for (int d = 0; d < n; ++d) send_segments(*routing, d, p.send[size_t(d)]);
    for (int s = 0; s < n; ++s)
      if (routing->from[size_t(s)]) recv_segments(*routing, s, p.recv[size_t(s)]);
    c.plan.push_back(std::move(p));
  } else {
    // The budget, spread evenly: what the host declares and the timing plane charges.
    for (int d = 0; d < n; ++d)
      p.send_bytes[size_t(d)] = p.recv_bytes[size_t(d)] = size_t(rows_cap / n) * row;
    c.plan = {PartyPhase(static_cast<size_t>(n)), p};
    if (functional) {
      c.planner = [=, idx = topk_idx.as<const std::int64_t>()] {
        routing->route(idx, num_tokens, topk, epr, n);
        PartyPhase q(static_cast<size_t>(n));
        for (int d = 0; d < n; ++d) {
          q.send_bytes[size_t(d)] = routing->to[size_t(d)].size() * row;
          send_segments(*routing, d, q.send[size_t(d)]);
        }
        return q;
      };
      c.receiver = [=](const std::vector<std::size_t>& incoming) {
        std::vector<std::size_t> rows(incoming.size());
        for (size_t s = 0; s < rows.size(); ++s) rows[s] = incoming[s] / row;
        routing->receive(rows);
        if (routing->received > rows_cap)
          throw UsageError("flex dispatch: " + std::to_string(routing->received) +
                           " tokens arrived but the capacity is " + std::to_string(rows_cap) +
                           "; raise FlexConfig::capacity");
        PartyPhase q(rows.size());
        for (size_t s = 0; s < rows.size(); ++s) {
          q.recv_bytes[s] = incoming[s];
          if (rows[s]) recv_segments(*routing, int(s), q.recv[s]);
        }
        return q;
      };
    }
  }
  describe_and_cost(c, me);
  c.uses = {x, topk_idx, topk_weight, out.x, out.topk_idx, out.topk_weight};
  CollOptions oo = o;
  oo.previous.reset();
  oo.async = true;
  if (oo.name.empty()) oo.name = std::string(backend_name(config_.backend)) + " dispatch";
  ep_.comm().issue(ep_.state(), std::move(c), stream, oo);

  // The receiver's permute input wants local expert ids: -1 for the experts of other ranks.
  std::function<void()> body;
  if (functional) {
    auto* ri = out.topk_idx.as<std::int64_t>();
    body = [=] {
      const int rows = routing->received;
      const std::int64_t lo = std::int64_t(me) * epr, hi = lo + epr;
      for (size_t i = 0; i < size_t(rows) * size_t(topk); ++i)
        ri[i] = (ri[i] >= lo && ri[i] < hi) ? ri[i] - lo : -1;
    };
  }
  stream.launch({"dispatch_local_ids",
                 Work{.bytes = double(rows_cap) * topk * 16.0,
                      .shape = KernelShape::memory(MemoryOp::Gather)},
                 std::move(body),
                 {out.topk_idx}});
  Event done;
  stream.record(done);
  if (o.async) {
    out.done = done;
  } else {
    done.synchronize();
  }
  return out;
}

std::optional<Event> FlexDispatcher::move_rows(const Buffer& src, const Buffer& dst,
                                               const FlexHandle& h, bool forward, Stream& stream,
                                               const CollOptions& o, const char* what) {
  Device& dev = stream.device();
  const int n = ep_.size();
  const int me = ep_.index_of(dev.id());
  const bool functional = dev.node().mode() == Mode::Functional;
  const std::size_t row = size_t(hidden_) * 4;
  auto routing = h.routing;
  const int hidden = hidden_;
  // forward (combine): received rows go back to their source and are summed there, in member
  // order, into zeroed token rows. backward of combine: token rows go out again along `to`.
  auto sender = [=](PartyPhase& q) {
    const auto* sb = static_cast<const std::byte*>(src.data());
    for (int d = 0; d < n; ++d) {
      if (forward) {
        const size_t cnt = size_t(routing->from[size_t(d)]);
        q.send_bytes[size_t(d)] = cnt * row;
        if (cnt) q.send[size_t(d)] = {{sb + size_t(routing->offset[size_t(d)]) * row, cnt * row}};
      } else {
        q.send_bytes[size_t(d)] = routing->to[size_t(d)].size() * row;
        for (int t : routing->to[size_t(d)])
          q.send[size_t(d)].push_back({sb + size_t(t) * row, row});
      }
    }
  };
  auto receiver = [=](PartyPhase& q) {
    auto* db = static_cast<std::byte*>(dst.data());
    if (forward) q.ordered = true;
    for (int s = 0; s < n; ++s) {
      if (forward) {
        q.recv_bytes[size_t(s)] = routing->to[size_t(s)].size() * row;
        q.consume[size_t(s)] = Consume::AddF32;
        for (int t : routing->to[size_t(s)])
          q.recv[size_t(s)].push_back({db + size_t(t) * row, row});
      } else {
        const size_t cnt = size_t(routing->from[size_t(s)]);
        q.recv_bytes[size_t(s)] = cnt * row;
        if (cnt) q.recv[size_t(s)] = {{db + size_t(routing->offset[size_t(s)]) * row, cnt * row}};
      }
    }
  };
  Call c;
  c.kind = std::string(what) + "(" + backend_name(config_.backend) + ")";
  c.parties.resize(size_t(n));
  for (int i = 0; i < n; ++i) c.parties[size_t(i)] = i;
  c.party = me;
  c.sms = sms_;
  c.latency_steps = 2;
  if (forward && functional) {
    // Combine sums into zeroed rows; the zeroing is part of the combine kernel.
    auto* db = dst.as<float>();
    const size_t count = size_t(h.num_tokens) * size_t(hidden);
    stream.launch(
        {std::string(what) + " zero",
         Work{.bytes = double(count) * 4, .shape = KernelShape::memory(MemoryOp::Elementwise)},
         [db, count] { std::fill(db, db + count, 0.0f); },
         {dst}});
  }
  const bool known = h.num_recv >= 0;  // the host knows the routing (it synchronised)
  if (known) {
    // Known only after a sync, which needs functional mode (meta mode requires a capacity).
    PartyPhase q(static_cast<size_t>(n));
    sender(q);
    receiver(q);
    c.plan.push_back(std::move(q));
  } else {
    PartyPhase declared(static_cast<size_t>(n));
    for (int d = 0; d < n; ++d)
      declared.send_bytes[size_t(d)] = declared.recv_bytes[size_t(d)] =
          size_t(config_.capacity / n) * row;
    c.plan = {PartyPhase(static_cast<size_t>(n)), declared};
    if (functional) {
      c.planner = [=] {
        PartyPhase q(static_cast<size_t>(n));
        sender(q);
        return q;
      };
      c.receiver = [=](const std::vector<std::size_t>&) {
        PartyPhase q(static_cast<size_t>(n));
        receiver(q);
        return q;
      };
    }
  }
  describe_and_cost(c, me);
  c.uses = {src, dst};
  CollOptions oo = o;
  if (oo.name.empty()) oo.name = std::string(backend_name(config_.backend)) + " " + what;
  return ep_.comm().issue(ep_.state(), std::move(c), stream, oo);
}

Buffer FlexDispatcher::combine(const Buffer& y, const FlexHandle& handle, Stream& stream,
                               const CollOptions& o, std::optional<Event>* done) {
  Buffer out = stream.device().allocate(
      std::max<size_t>(1, size_t(handle.num_tokens) * size_t(hidden_) * 4));
  auto ev = move_rows(y, out, handle, true, stream, o, "combine");
  if (done) *done = ev;
  return out;
}

Buffer FlexDispatcher::combine_backward(const Buffer& grad_out, const FlexHandle& handle,
                                        Stream& stream, const CollOptions& o,
                                        std::optional<Event>* done) {
  const int rows = handle.num_recv >= 0 ? handle.num_recv : config_.capacity;
  Buffer g = stream.device().allocate(std::max<size_t>(1, size_t(rows) * size_t(hidden_) * 4));
  auto ev = move_rows(grad_out, g, handle, false, stream, o, "combine_backward");
  if (done) *done = ev;
  return g;
}

}  // namespace nodeemu
