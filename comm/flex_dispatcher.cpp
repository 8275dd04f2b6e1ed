#include "comm/flex_dispatcher.hpp"

#include <algorithm>
#include <cstring>

#include "comm/comm_state.hpp"
#include "comm/detail/flex_routing.hpp"
#include "comm/flex_kernel_speed.hpp"
#include "devices/check.hpp"
#include "devices/errors.hpp"
#include "devices/node.hpp"

namespace nodeemu {

using detail::Call;
using detail::ConstSegment;
using detail::FlexRouting;
using detail::PartyPhase;
using detail::Segment;

namespace {

const char* backend_name(FlexBackend b) {
  return b == FlexBackend::DeepEP ? "deepep" : "hybridep";
}

// n may be 0 (a rank with no tokens), and then a pointer may be null: no call at all.
void widen(const RowFormat& f, const void* src, float* dst, std::size_t n) {
  if (n == 0) return;
  if (f.widen)
    f.widen(src, dst, n);
  else
    std::memcpy(dst, src, n * 4);
}

void narrow(const RowFormat& f, const float* src, void* dst, std::size_t n) {
  if (n == 0) return;
  if (f.narrow)
    f.narrow(src, dst, n);
  else
    std::memcpy(dst, src, n * 4);
}

// The declared sizes are captured: a deferred (functional) plan replaces them on the worker.
Call::Text send_text(const std::string& kind, const std::vector<std::size_t>& send_bytes) {
  return [kind, send_bytes](const std::vector<PartyPhase>&) {
    return kind + "(send " + detail::sizes_text(send_bytes) + " B)";
  };
}

Call make_call(const std::string& kind, int members, int me, int sms, bool across_nodes) {
  Call c;
  c.kind = kind;
  c.parties.resize(size_t(members));
  for (int i = 0; i < members; ++i) c.parties[size_t(i)] = i;
  c.party = me;
  c.sms = sms;
  c.latency_steps = across_nodes ? 2 : 1;  // RDMA hop + NVLink hop across nodes
  return c;
}

}  // namespace

FlexDispatcher::FlexDispatcher(Group ep, int num_experts, int hidden, int topk, FlexConfig config)
    : ep_(std::move(ep)),
      num_experts_(num_experts),
      hidden_(hidden),
      topk_(topk),
      local_experts_(0),
      config_(config),
      sms_(0),
      kernel_bytes_per_s_(0) {
  Node& node = *ep_.comm().node;
  const NodeTopology& t = node.topology();
  const std::string file = "flex dispatcher";
  if (num_experts <= 0 || num_experts % ep_.size() != 0)
    throw ConfigError(file, "num_experts",
                      std::to_string(num_experts) + " experts do not divide over the " +
                          std::to_string(ep_.size()) + " ranks of group '" + ep_.name() + "'");
  if (hidden <= 0 || topk <= 0 || topk > num_experts)
    throw ConfigError(file, "topk", "need hidden > 0 and 0 < topk <= num_experts");
  if (config.rows.elem_bytes == 0 || (config.rows.elem_bytes != 4 && !config.rows.widen) ||
      static_cast<bool>(config.rows.widen) != static_cast<bool>(config.rows.narrow))
    throw ConfigError(file, "rows", "a row format other than fp32 needs widen and narrow");
  local_experts_ = num_experts / ep_.size();
  for (int r : ep_.ranks()) machine_node_of_.push_back(node.device(r).node_index());
  const bool one_domain = std::all_of(machine_node_of_.begin(), machine_node_of_.end(),
                                      [&](int n) { return n == machine_node_of_.front(); });
  across_nodes_ = !one_domain;
  sms_ = config.num_sms > 0                      ? config.num_sms
         : config.backend == FlexBackend::DeepEP ? t.comm.deepep_sms
         : one_domain                            ? 24
                                                 : 8;
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
  // MAX_NUM_OF_RANKS_PER_NODE, "up to 72 (GB200) ranks per node" (csrc/hybrid_ep/config.cuh).
  if (config.backend == FlexBackend::HybridEP && t.gpus > 72)
    throw ConfigError(file, "backend",
                      "HybridEP handles NVLink domains of up to 72 GPUs but '" + t.name + "' has " +
                          std::to_string(t.gpus));
  if (config.preprocessing_sms <= 0)
    throw ConfigError(file, "preprocessing_sms", "must be positive (HybridEP's default is 108)");
  config_.preprocessing_sms = std::min(config.preprocessing_sms, t.gpu.sms);
  kernel_bytes_per_s_ = flex_kernel_bytes_per_s(config.backend, sms_);
}

void FlexDispatcher::cost(Call& c, const FlexRouting& r, std::size_t per_row, bool to_sources) {
  std::vector<LinkLoad> out;
  add_loads(r, size_t(c.party), per_row, to_sources, out, &traffic_);
  c.loads = std::move(out);
  if (r.stand_ins.empty()) return;
  // Called inside CommState::issue, while r (the handle's routing) lives.
  c.add_loads_of = [this, &r, per_row, to_sources](int member, std::vector<LinkLoad>& loads) {
    const auto it = std::find(r.stand_in_members.begin(), r.stand_in_members.end(), member);
    NE_CHECK(it != r.stand_in_members.end(), "a flex call without a skipped member's routing");
    add_loads(r.stand_ins[size_t(it - r.stand_in_members.begin())], size_t(member), per_row,
              to_sources, loads, nullptr);
  };
}

void FlexDispatcher::add_loads(const FlexRouting& r, std::size_t mi, std::size_t per_row,
                               bool to_sources, std::vector<LinkLoad>& out,
                               FlexTraffic* traffic) const {
  const Fabric& f = ep_.comm().fabric;
  const auto& ranks = ep_.ranks();
  const int me = ranks[mi];
  double kernel_bytes = 0;
  // The relays are the group's members, matched by position among their node's members (the
  // kernels pick forwarders by rank within the group: the same local rank on the far node).
  const size_t members = ranks.size();
  std::vector<std::vector<size_t>> on_node(size_t(r.nodes()));
  std::vector<size_t> position(members);
  for (size_t d = 0; d < members; ++d) {
    auto& list = on_node[size_t(r.node_of[d])];
    position[d] = list.size();
    list.push_back(d);
  }
  auto relay = [&](int node, size_t pos) {
    const auto& list = on_node[size_t(node)];
    return list[pos % list.size()];
  };
  for (size_t d = 0; d < members; ++d) {
    if (d == mi) continue;
    // Rows this party moves to (dispatch) or back from its experts to (combine) member d.
    const double rows = to_sources ? double(r.from[d]) : double(r.rows_to[d]);
    const double bytes = rows * double(per_row);
    kernel_bytes += bytes;
    // Across nodes: dispatch forwards from the relay on d's node to d; combine sends to the
    // relay on this node that reduces d's tokens before they cross.
    const size_t a = r.node_of[d] == r.node_of[mi] ? mi
                     : to_sources                  ? mi
                                                   : relay(r.node_of[d], position[mi]);
    const size_t b = r.node_of[d] == r.node_of[mi] ? d
                     : to_sources                  ? relay(r.node_of[mi], position[d])
                                                   : d;
    if (a == b) continue;
    f.add_message(ranks[a], ranks[b], bytes, out);
    if (traffic) traffic->nvlink_bytes += std::uint64_t(bytes);
  }
  // RDMA once per token and far node, between this rank and its relay there: dispatch sends its
  // tokens out; combine's relays send this rank its tokens' reduced rows (counted here, at the
  // rank whose tokens they are).
  for (int node = 0; node < r.nodes(); ++node) {
    if (node == r.node_of[mi]) continue;
    const size_t peer = relay(node, position[mi]);
    const double bytes = double(r.tokens_to_node[size_t(node)]) * double(per_row);
    if (to_sources)
      f.add_message(ranks[peer], me, bytes, out);
    else
      f.add_message(me, ranks[peer], bytes, out);
    if (traffic) traffic->rdma_bytes += std::uint64_t(bytes);
  }
  if (kernel_bytes > 0)
    out.push_back({f.ep_kernels(me), kernel_bytes / kernel_bytes_per_s_ * 1e12});
}

FlexDispatched FlexDispatcher::dispatch(const Buffer& x, const Buffer& topk_idx,
                                        const Buffer& topk_weight, int num_tokens, Stream& stream,
                                        const CollOptions& o,
                                        const std::vector<std::int64_t>& meta_counts,
                                        const std::vector<std::int64_t>& meta_tokens,
                                        int capacity) {
  Device& dev = stream.device();
  Node& node = dev.node();
  const int n = ep_.size();
  const int me = ep_.index_of(dev.id());
  if (me < 0)
    throw UsageError("flex dispatch: " + dev.name() + " is not in group '" + ep_.name() + "'");
  const bool functional = node.mode() == Mode::Functional;
  const std::size_t xrow = row_bytes(), row = xrow + size_t(topk_) * 12;  // x, idx, weight
  if (capacity < 0) throw UsageError("flex dispatch: capacity must be >= 0 (0 = host sync)");
  if (capacity > 0 && config_.backend != FlexBackend::HybridEP)
    throw UsageError(
        "flex dispatch: DeepEP's normal mode always waits for its counts on the host; the "
        "sync-free capacity is HybridEP's (use the hybridep backend)");
  if (!functional && meta_counts.empty())
    throw UsageError(
        "flex dispatch: meta mode has no routing; pass every member's tokens per expert");
  if (o.previous) stream.wait(*o.previous);
  reserve_buffers(dev, num_tokens);
  Stream ks = kernel_stream(stream);

  auto routing = std::make_shared<FlexRouting>();
  routing->set_nodes(machine_node_of_);
  FlexDispatched out;
  out.handle.num_tokens = num_tokens;
  out.handle.capacity = capacity;
  out.handle.routing = routing;
  Call c = make_call(std::string("flex_dispatch(") + backend_name(config_.backend) + ")", n, me,
                     sms_, across_nodes());
  const int epr = local_experts_;
  const int topk = topk_;

  // Where token t's three pieces start on the sender, and the receiver's three regions. Raw
  // pointers: in capacity mode these run, and are destroyed, on the workers; c.uses holds the
  // buffers. (Meta mode has no data, and never runs them.)
  const auto* xb = functional ? static_cast<const std::byte*>(x.data()) : nullptr;
  const auto* ib = functional ? static_cast<const std::byte*>(topk_idx.data()) : nullptr;
  const auto* wb = functional ? static_cast<const std::byte*>(topk_weight.data()) : nullptr;
  auto send_segments = [=](const FlexRouting& r, int d, detail::ConstSegments& segs) {
    for (int t : r.to[size_t(d)]) segs.push_back({xb + size_t(t) * xrow, xrow});
    for (int t : r.to[size_t(d)])
      segs.push_back({ib + size_t(t) * size_t(topk) * 8, size_t(topk) * 8});
    for (int t : r.to[size_t(d)])
      segs.push_back({wb + size_t(t) * size_t(topk) * 4, size_t(topk) * 4});
  };
  // The rows the receive buffers hold: the received count once the host knows it; without a
  // host sync, every row that can arrive, inside HybridEP's persistent buffer (so not accounted
  // again: reserve_buffers sized it for this many).
  // Meta mode prices what the device would move, from the caller's counts, whether or not the
  // host waits for them (the routing is the model's input there, not the host program's); only
  // a functional sync-free dispatch leaves the routing to the device.
  const bool priced_by_routing = capacity == 0 || !functional;
  int rows_cap = receive_bound(num_tokens);
  if (priced_by_routing) {
    if (!functional) routing->estimate(meta_counts, meta_tokens, me, epr);
    if (capacity == 0) notify(topk_idx, num_tokens, ks, *routing, out.handle);
    // Representative ranks: the skipped members this rank stands for get routings of their own
    // from the same counts, and this rank's experts are sized for the busiest of them, so that
    // the combine every member waits for starts when the slowest member's experts are done.
    const FlexRouting* busiest = routing.get();
    if (!functional)
      for (int m : ep_.stands_for(me)) {
        FlexRouting& r = routing->stand_ins.emplace_back();
        routing->stand_in_members.push_back(m);
        r.node_of = routing->node_of;
        r.estimate(meta_counts, meta_tokens, m, epr);
        r.to = {};  // meta mode lists no tokens
      }
    for (const FlexRouting& r : routing->stand_ins)
      if (r.received > busiest->received) busiest = &r;
    out.handle.num_recv = busiest->received;
    out.handle.recv_per_expert = busiest->recv_per_expert;
    rows_cap = busiest->received;
  }
  auto receive_buffer = [&](size_t bytes) {
    bytes = std::max<size_t>(1, bytes);
    return capacity == 0 ? dev.allocate(bytes) : dev.workspace(bytes);
  };
  out.x = receive_buffer(size_t(rows_cap) * xrow);
  out.topk_idx = receive_buffer(size_t(rows_cap) * size_t(topk) * 8);
  out.topk_weight = receive_buffer(size_t(rows_cap) * size_t(topk) * 4);
  auto* rx = functional ? static_cast<std::byte*>(out.x.data()) : nullptr;
  auto* ri = functional ? static_cast<std::byte*>(out.topk_idx.data()) : nullptr;
  auto* rw = functional ? static_cast<std::byte*>(out.topk_weight.data()) : nullptr;
  auto recv_segments = [=](const FlexRouting& r, int s, detail::Segments& segs) {
    const size_t at = size_t(r.offset[size_t(s)]), cnt = size_t(r.from[size_t(s)]);
    segs.push_back({rx + at * xrow, cnt * xrow});
    segs.push_back({ri + at * size_t(topk) * 8, cnt * size_t(topk) * 8});
    segs.push_back({rw + at * size_t(topk) * 4, cnt * size_t(topk) * 4});
  };

  PartyPhase p(static_cast<size_t>(n), functional);
  if (priced_by_routing) {
    for (int d = 0; d < n; ++d) p.send_bytes[size_t(d)] = routing->rows_to[size_t(d)] * row;
    for (int s = 0; s < n; ++s) p.recv_bytes[size_t(s)] = size_t(routing->from[size_t(s)]) * row;
    if (functional) {
      for (int d = 0; d < n; ++d) send_segments(*routing, d, p.send[size_t(d)]);
      for (int s = 0; s < n; ++s)
        if (routing->from[size_t(s)]) recv_segments(*routing, s, p.recv[size_t(s)]);
    }
    c.plan.push_back(std::move(p));
    cost(c, *routing, row, false);
  } else {
    // The budget, spread evenly: what the host declares and the timing plane charges.
    const size_t charged = size_t(capacity / n);
    for (int d = 0; d < n; ++d) p.send_bytes[size_t(d)] = p.recv_bytes[size_t(d)] = charged * row;
    c.plan = {PartyPhase(static_cast<size_t>(n), functional), p};
    FlexRouting budget = *routing;
    budget.rows_to.assign(size_t(n), charged);
    budget.tokens_to_node.assign(size_t(budget.nodes()), charged);
    cost(c, budget, row, false);
    if (functional) {
      c.planner = [=, idx = topk_idx.as<const std::int64_t>()] {
        routing->route(idx, num_tokens, topk, epr);
        PartyPhase q(static_cast<size_t>(n));
        for (int d = 0; d < n; ++d) {
          q.send_bytes[size_t(d)] = routing->rows_to[size_t(d)] * row;
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
                           " rows arrived but HybridEP's buffer holds " + std::to_string(rows_cap) +
                           "; every member must pass the same token count, or set "
                           "FlexConfig::max_tokens_per_rank to the largest");
        PartyPhase q(rows.size());
        for (size_t s = 0; s < rows.size(); ++s) {
          q.recv_bytes[s] = incoming[s];
          if (rows[s]) recv_segments(*routing, int(s), q.recv[s]);
        }
        return q;
      };
    }
  }
  c.text = send_text(c.kind, c.plan.back().send_bytes);
  c.uses = {x, topk_idx, topk_weight, out.x, out.topk_idx, out.topk_weight};
  CollOptions oo = o;
  oo.previous.reset();
  oo.async = true;
  if (oo.name.empty()) oo.name = std::string(backend_name(config_.backend)) + " dispatch";
  ep_.comm().issue(ep_.state(), std::move(c), ks, oo);

  // The receiver's permute input wants local expert ids: -1 for the experts of other ranks.
  std::function<void()> body;
  if (functional) {
    // Rows past the received ones (a receive buffer sized by its bound) get -1 too: no expert.
    body = [=, ids = out.topk_idx.as<std::int64_t>()] {
      const size_t used = size_t(routing->received) * size_t(topk);
      const std::int64_t lo = std::int64_t(me) * epr, hi = lo + epr;
      for (size_t i = 0; i < used; ++i) ids[i] = (ids[i] >= lo && ids[i] < hi) ? ids[i] - lo : -1;
      std::fill(ids + used, ids + size_t(rows_cap) * size_t(topk), std::int64_t(-1));
    };
  }
  ks.launch({"dispatch_local_ids",
             Work{.bytes = double(rows_cap) * topk * 16.0,
                  .shape = KernelShape::memory(MemoryOp::Gather)},
             std::move(body),
             {out.topk_idx}});
  rejoin(stream, ks);
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
                                               const Buffer& wsrc, const Buffer& wdst,
                                               const FlexHandle& h, bool forward, Stream& stream,
                                               const CollOptions& o, const char* what) {
  Device& dev = stream.device();
  const int n = ep_.size();
  const int me = ep_.index_of(dev.id());
  const bool functional = dev.node().mode() == Mode::Functional;
  const std::size_t xrow = row_bytes(), wrow = wsrc ? size_t(topk_) * 4 : 0;
  // The lambdas below may run later, on the worker (capacity mode), and are destroyed off the
  // host threads: they hold raw pointers, and the call's uses hold the buffers.
  // (Meta mode has no data: null pointers, and the lambdas never run.)
  const auto* sb = functional ? static_cast<const std::byte*>(src.data()) : nullptr;
  auto* db = functional ? static_cast<std::byte*>(dst.data()) : nullptr;
  const auto* wsb = functional && wsrc ? static_cast<const std::byte*>(wsrc.data()) : nullptr;
  auto* wdb = functional && wdst ? static_cast<std::byte*>(wdst.data()) : nullptr;
  const std::size_t row = xrow + wrow;
  auto routing = h.routing;
  const bool known = h.num_recv >= 0;  // the host knows the routing (it synchronised)
  Call c = make_call(std::string(what) + "(" + backend_name(config_.backend) + ")", n, me, sms_,
                     across_nodes());
  // Combine (forward): the received rows go back to their sources, which stage them, member by
  // member, in `to` order, and reduce them afterwards. Backward of combine: token rows go out
  // again along `to` into the received order.
  auto sender = [=](PartyPhase& q) {
    for (int d = 0; d < n; ++d) {
      if (forward) {
        const size_t cnt = size_t(routing->from[size_t(d)]),
                     at = size_t(routing->offset[size_t(d)]);
        q.send_bytes[size_t(d)] = cnt * row;
        if (!cnt) continue;
        q.send[size_t(d)].push_back({sb + at * xrow, cnt * xrow});
        if (wsb) q.send[size_t(d)].push_back({wsb + at * wrow, cnt * wrow});
      } else {
        q.send_bytes[size_t(d)] = routing->rows_to[size_t(d)] * row;
        for (int t : routing->to[size_t(d)])
          q.send[size_t(d)].push_back({sb + size_t(t) * xrow, xrow});
      }
    }
  };
  auto receiver = [=](PartyPhase& q) {
    size_t staged = 0;
    for (int s = 0; s < n; ++s) {
      if (forward) {
        const size_t cnt = routing->rows_to[size_t(s)];
        q.recv_bytes[size_t(s)] = cnt * row;
        if (cnt) {
          q.recv[size_t(s)].push_back({db + staged * xrow, cnt * xrow});
          if (wdb) q.recv[size_t(s)].push_back({wdb + staged * wrow, cnt * wrow});
        }
        staged += cnt;
      } else {
        const size_t cnt = size_t(routing->from[size_t(s)]);
        q.recv_bytes[size_t(s)] = cnt * row;
        if (cnt) q.recv[size_t(s)] = {{db + size_t(routing->offset[size_t(s)]) * xrow, cnt * xrow}};
      }
    }
  };
  if (known) {
    PartyPhase q(static_cast<size_t>(n), functional);
    if (functional) {
      sender(q);
      receiver(q);
    } else {
      for (int d = 0; d < n; ++d) {
        q.send_bytes[size_t(d)] =
            (forward ? size_t(routing->from[size_t(d)]) : routing->rows_to[size_t(d)]) * row;
        q.recv_bytes[size_t(d)] =
            (forward ? routing->rows_to[size_t(d)] : size_t(routing->from[size_t(d)])) * row;
      }
    }
    c.plan.push_back(std::move(q));
    cost(c, *routing, row, forward);
  } else {
    PartyPhase declared(static_cast<size_t>(n));
    for (int d = 0; d < n; ++d)
      declared.send_bytes[size_t(d)] = declared.recv_bytes[size_t(d)] =
          size_t(h.capacity / n) * row;
    c.plan = {PartyPhase(static_cast<size_t>(n)), declared};
    FlexRouting budget;
    budget.set_nodes(machine_node_of_);
    budget.rows_to.assign(size_t(n), size_t(h.capacity / n));
    budget.from.assign(size_t(n), h.capacity / n);
    budget.tokens_to_node.assign(size_t(budget.nodes()), size_t(h.capacity / n));
    cost(c, budget, row, forward);
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
  c.text = send_text(c.kind, c.plan.back().send_bytes);
  c.uses = {src, dst};
  if (wsrc) c.uses.push_back(wsrc);
  if (wdst) c.uses.push_back(wdst);
  CollOptions oo = o;
  if (oo.name.empty()) oo.name = std::string(backend_name(config_.backend)) + " " + what;
  return ep_.comm().issue(ep_.state(), std::move(c), stream, oo);
}

FlexCombined FlexDispatcher::combine(const Buffer& y, const FlexHandle& handle, Stream& stream,
                                     const CollOptions& o, const Buffer* topk_weight) {
  Device& dev = stream.device();
  const FlexRouting& r = *handle.routing;
  // Without a host sync (capacity mode) the rows are known only on the device: stage for the
  // most a token can send back, once per member holding one of its experts.
  size_t staged_rows = size_t(handle.num_tokens) * size_t(std::min(ep_.size(), topk_));
  if (handle.num_recv >= 0) {
    staged_rows = 0;
    for (auto v : r.rows_to) staged_rows += v;
  }
  const size_t xrow = row_bytes(), wrow = size_t(topk_) * 4, tokens = size_t(handle.num_tokens);
  // The rows arrive into a staging area (DeepEP's receive buffer), then each token's rows are
  // summed in member order, in fp32, and stored once in the row format.
  Buffer sx = dev.allocate(std::max<size_t>(1, staged_rows * xrow));
  Buffer sw = topk_weight ? dev.allocate(std::max<size_t>(1, staged_rows * wrow)) : Buffer();
  FlexCombined out;
  out.x = dev.allocate(std::max<size_t>(1, tokens * xrow));
  if (topk_weight) out.topk_weight = dev.allocate(std::max<size_t>(1, tokens * wrow));
  CollOptions oo = o;
  oo.async = true;
  if (oo.previous) stream.wait(*oo.previous);
  oo.previous.reset();
  Stream ks = kernel_stream(stream);
  move_rows(y, sx, topk_weight ? *topk_weight : Buffer(), sw, handle, true, ks, oo, "combine");
  std::function<void()> reduce;
  if (dev.node().mode() == Mode::Functional) {
    // Raw pointers: the buffers stay alive through the kernel's uses.
    reduce = [=, fmt = config_.rows, routing = handle.routing, hidden = size_t(hidden_),
              topk = size_t(topk_), sxb = static_cast<const std::byte*>(sx.data()),
              swf = topk_weight ? sw.as<const float>() : nullptr, ox = out.x.data(),
              ow = topk_weight ? out.topk_weight.data() : nullptr] {
      std::vector<float> acc(tokens * hidden, 0.0f), row(hidden);
      std::vector<float> wacc(swf ? tokens * topk : 0, 0.0f);
      size_t i = 0;
      for (const auto& list : routing->to)
        for (int t : list) {
          widen(fmt, sxb + i * hidden * fmt.elem_bytes, row.data(), hidden);
          float* a = acc.data() + size_t(t) * hidden;
          for (size_t j = 0; j < hidden; ++j) a[j] += row[j];
          if (swf)
            for (size_t k = 0; k < topk; ++k) wacc[size_t(t) * topk + k] += swf[i * topk + k];
          ++i;
        }
      narrow(fmt, acc.data(), ox, tokens * hidden);
      if (swf && !wacc.empty()) std::memcpy(ow, wacc.data(), wacc.size() * 4);
    };
  }
  KernelBuffers uses = {sx, out.x};
  if (topk_weight) uses.insert(uses.end(), {sw, out.topk_weight});
  ks.launch({"combine_reduce",
             Work{.flops = double(staged_rows * size_t(hidden_)),
                  .bytes = double(staged_rows * (xrow + (topk_weight ? wrow : 0)) +
                                  tokens * (xrow + (topk_weight ? wrow : 0))),
                  .shape = KernelShape::memory(MemoryOp::Scatter)},
             std::move(reduce), std::move(uses)});
  rejoin(stream, ks);
  Event done;
  stream.record(done);
  if (o.async)
    out.done = done;
  else
    done.synchronize();
  return out;
}

Buffer FlexDispatcher::combine_backward(const Buffer& grad_out, const FlexHandle& handle,
                                        Stream& stream, const CollOptions& o,
                                        std::optional<Event>* done) {
  const bool known = handle.num_recv >= 0;
  const int rows = known ? handle.num_recv : receive_bound(handle.num_tokens);
  const size_t bytes = std::max<size_t>(1, size_t(rows) * row_bytes());
  Buffer g = known ? stream.device().allocate(bytes) : stream.device().workspace(bytes);
  CollOptions oo = o;
  if (oo.previous) stream.wait(*oo.previous);
  oo.previous.reset();
  oo.async = true;
  Stream ks = kernel_stream(stream);
  move_rows(grad_out, g, Buffer(), Buffer(), handle, false, ks, oo, "combine_backward");
  rejoin(stream, ks);
  Event after;
  stream.record(after);
  if (done) *done = after;
  if (!o.async) after.synchronize();
  return g;
}

}  // namespace nodeemu
