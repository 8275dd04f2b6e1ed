// How a flex dispatch learns its counts: DeepEP's layout and notify_dispatch, HybridEP's
// routing-map all-gather and metadata preprocessing, and the one host wait for them.
#include <algorithm>

#include "comm/comm_state.hpp"
#include "comm/detail/flex_routing.hpp"
#include "comm/flex_dispatcher.hpp"
#include "devices/errors.hpp"
#include "devices/node.hpp"

namespace nodeemu {

using detail::FlexRouting;

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

void FlexDispatcher::exchange_counts(const Buffer& topk_idx, int num_tokens, Stream& stream,
                                     const Buffer& got) {
  Device& dev = stream.device();
  const bool functional = dev.node().mode() == Mode::Functional;
  const int n = ep_.size(), epr = local_experts_, me = ep_.index_of(dev.id());
  const size_t per_peer = size_t(1 + epr) * 4;
  if (config_.backend == FlexBackend::DeepEP) {
    // notify_dispatch (intranode.cu / internode.cu): the layout's counts per rank and per
    // expert, each member's slice to that member.
    FlexLayout l = get_dispatch_layout(topk_idx, num_tokens, stream);
    Buffer sent = dev.allocate(size_t(n) * per_peer);
    std::function<void()> pack;
    if (functional)
      pack = [=, pr = l.tokens_per_rank.as<const std::int32_t>(),
              pe = l.tokens_per_expert.as<const std::int32_t>(), o = sent.as<std::int32_t>()] {
        for (int d = 0; d < n; ++d) {
          o[d * (1 + epr)] = pr[d];
          std::copy(pe + d * epr, pe + (d + 1) * epr, o + d * (1 + epr) + 1);
        }
      };
    stream.launch({"notify_dispatch",
                   Work{.bytes = double(n) * double(per_peer) * 2,
                        .shape = KernelShape::memory(MemoryOp::Elementwise)},
                   std::move(pack),
                   {l.tokens_per_rank, l.tokens_per_expert, sent}});
    ep_.all_to_all(sent, got, per_peer, stream, {.async = true, .name = "notify_dispatch"});
    return;
  }
  // HybridEP (metadata_preprocessing): every rank's routing map [tokens][experts] is
  // all-gathered (Executor::allgather_routing_map), then one kernel on preprocessing_sms SMs
  // works out what every member sends here. Every member has the same tokens (HybridEP pads
  // uneven inputs: moe_hybridep_pad_uneven_dispatch_inputs).
  const int E = num_experts_, topk = topk_;
  const size_t map_bytes = std::max<size_t>(1, size_t(num_tokens) * size_t(E));
  Buffer map = dev.allocate(map_bytes), all = dev.allocate(map_bytes * size_t(n));
  std::function<void()> fill;
  if (functional)
    fill = [=, idx = topk_idx.as<const std::int64_t>(), m = map.as<std::uint8_t>()] {
      for (int t = 0; t < num_tokens; ++t)
        for (int k = 0; k < topk; ++k) {
          const std::int64_t e = idx[size_t(t) * size_t(topk) + size_t(k)];
          if (e >= E) throw UsageError("flex dispatch: expert index out of range");
          if (e >= 0) m[size_t(t) * size_t(E) + size_t(e)] = 1;
        }
    };
  // The router hands Megatron's HybridEP manager this map; here it is made from the indices.
  stream.launch({"routing_map",
                 Work{.bytes = double(map_bytes), .shape = KernelShape::memory(MemoryOp::Scatter)},
                 std::move(fill),
                 {topk_idx, map}});
  ep_.all_gather(map, all, map_bytes, stream, {.async = true, .name = "allgather_routing_map"});
  std::function<void()> pre;
  if (functional)
    pre = [=, m = all.as<const std::uint8_t>(), o = got.as<std::int32_t>()] {
      for (int s = 0; s < n; ++s) {
        std::int32_t* row = o + s * (1 + epr);
        std::fill(row, row + 1 + epr, 0);
        for (int t = 0; t < num_tokens; ++t) {
          const std::uint8_t* r = m + (size_t(s) * size_t(num_tokens) + size_t(t)) * size_t(E) +
                                  size_t(me) * size_t(epr);
          bool any = false;
          for (int j = 0; j < epr; ++j)
            if (r[j]) row[1 + j] += 1, any = true;
          row[0] += any;
        }
      }
    };
  stream.launch({"metadata_preprocessing",
                 Work{.bytes = double(map_bytes) * n + double(n) * double(per_peer),
                      .sms = config_.preprocessing_sms,
                      .shape = KernelShape::memory(MemoryOp::Elementwise)},
                 std::move(pre),
                 {all, got}});
}

// The counts each member sends this one reach the host, which waits for them: DeepEP's CPU spin
// on moe_recv_counter after notify_dispatch, HybridEP's stream synchronize in
// metadata_preprocessing. The one host sync of a dispatch.
void FlexDispatcher::notify(const Buffer& topk_idx, int num_tokens, Stream& stream, FlexRouting& r,
                            FlexHandle& h) {
  Device& dev = stream.device();
  Node& node = dev.node();
  const int n = ep_.size(), epr = local_experts_;
  const size_t per_peer = size_t(1 + epr) * 4;
  Buffer got = dev.allocate(size_t(n) * per_peer);
  exchange_counts(topk_idx, num_tokens, stream, got);
  Buffer host = node.allocate_host(size_t(n) * per_peer, dev.placement().emulated_numa, true,
                                   dev.node_index());
  stream.copy(host, got, size_t(n) * per_peer, "recv counts D2H");
  Event counted;
  stream.record(counted);
  counted.synchronize();
  if (node.mode() != Mode::Functional) return;  // meta: the caller's counts stand
  r.route(topk_idx.as<const std::int64_t>(), num_tokens, topk_, epr);
  std::vector<std::size_t> rows(static_cast<size_t>(n));
  r.recv_per_expert.assign(size_t(epr), 0);
  const auto* c = host.as<const std::int32_t>();
  for (int s = 0; s < n; ++s) {
    rows[size_t(s)] = size_t(c[s * (1 + epr)]);
    for (int j = 0; j < epr; ++j) r.recv_per_expert[size_t(j)] += c[s * (1 + epr) + 1 + j];
  }
  r.receive(rows);
  h.num_recv = r.received;
  h.recv_per_expert = r.recv_per_expert;
}

}  // namespace nodeemu
