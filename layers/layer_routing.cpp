// LayerPlan's router kernels (transformer_layer.hpp): the top-k choice of this rank's tokens and
// the load-balancing losses, split around an all-reduce of the balance counts under TP. Part of
// LayerPlan, split out by concern.
#include "layers/detail/layer_plan_state.hpp"
#include "layers/detail/op_launch.hpp"
#include "layers/router.hpp"
#include "layers/transformer_layer.hpp"

namespace nodeemu::layers {

// The router's top-k on this rank's tokens, into the dispatcher's inputs. With TP or CP, the
// load-balancing counts are summed over the TP x CP group between the choice and the losses
// (Megatron's router all-reduces tokens_per_expert over the TP x CP group for its aux losses;
// TP is the faster-varying of the two in that group).
void LayerPlan::route_tokens(Stream& s, const Tensor& logits, std::int64_t T) {
  const ModelConfig& c = L_.cfg_;
  State& st = *st_;
  ops::At at = at_(s);
  const std::int64_t E = c.num_moe_experts, k = c.router.topk;
  MoeTokens& io = st.dispatch->io;
  io.topk_idx = at.empty({T, k}, DType::I64);
  io.topk_probs = at.empty({T, k}, DType::F32);
  io.tokens_per_expert = at.empty({E}, DType::I64);
  st.routing = std::make_shared<Routing<float>>();
  View vl = view(logits), vb = L_.expert_bias_ ? view(L_.expert_bias_) : View{},
       vi = view(io.topk_idx), vp = view(io.topk_probs), vc = view(io.tokens_per_expert),
       vt = L_.local_tokens_per_expert_ ? view(L_.local_tokens_per_expert_) : View{};
  auto routing = st.routing;
  auto stats = stats_;
  const RouterConfig rc = c.router;
  const int span_rank = L_.cp_.rank * L_.tp_.size + L_.tp_.rank;
  // A sequence is every CP rank's positions of it (seq_aux_loss with CP needs micro-batches of
  // one sequence, so that the group's tokens are one sequence: validate checks it).
  const TokenSpan span{span_rank * T, T * L_.tp_.size * L_.cp_.size, st.seq * L_.cp_.size};
  const bool split = L_.tp_.on() || L_.cp_.on();
  auto publish = [=] {
    std::copy(routing->idx.begin(), routing->idx.end(), vi.as<std::int64_t>());
    std::copy(routing->probs.begin(), routing->probs.end(), vp.as<float>());
    std::copy(routing->tokens_per_expert.begin(), routing->tokens_per_expert.end(),
              vc.as<std::int64_t>());
    // The expert bias's step counts (Megatron's _apply_expert_bias adds each routing map).
    if (vt.data)
      for (std::size_t e = 0; e < routing->tokens_per_expert.size(); ++e)
        vt.as<float>()[e] += float(routing->tokens_per_expert[e]);
    stats->aux_loss = routing->aux_loss;
    stats->seq_aux_loss = routing->seq_aux_loss;
    stats->z_loss = routing->z_loss;
    stats->tokens_per_expert = routing->tokens_per_expert;
  };
  // The measured router series is keyed by its fp32 logits (profile.yaml memory_ops).
  const Work work{.flops = 12.0 * double(T * E),
                  .bytes = double(logits.bytes()),
                  .precision = Precision::FP32,
                  .shape = KernelShape::memory(MemoryOp::Router)};
  const bool balanced = rc.aux_loss_coeff > 0 && rc.load_balancing != LoadBalancing::None;
  if (!split || !balanced) {
    // Unfused routing (moe_router_fusion off, Megatron's default: moe_utils.py
    // topk_softmax_with_capacity): softmax, then torch.topk's two kernels (the layer anatomy's
    // trace, rows 21-23: 2.7, 28.4 and 6.3 us), priced together by the router series.
    static constexpr ops::detail::KernelPiece kPieces[] = {
        {".softmax", 2.7}, {".gather_topk", 28.4}, {"", 6.3}};
    ops::detail::launch_pieces(
        s, "router_topk", work, kPieces, false,
        [=] {
          *routing = split ? route_choice(rc, vl.as<const float>(), T, vb.as<const float>())
                           : route(rc, vl.as<const float>(), T, span.seq, vb.as<const float>());
          if (split) add_balance_losses(rc, vl.as<const float>(), *routing, span, {});
          publish();
        },
        {logits, L_.expert_bias_, io.topk_idx, io.topk_probs, io.tokens_per_expert,
         L_.local_tokens_per_expert_},
        ctx_.tally);
    return;
  }
  const std::int64_t n =
      span.total / (rc.load_balancing == LoadBalancing::SeqAuxLoss ? span.seq : span.total) * E;
  Tensor counts = at.empty({n}, DType::F32);  // fp32 sums of integers: exact below 2^24
  View vn = view(counts);
  launch(
      s, "router_topk", work,
      [=] {
        *routing = route_choice(rc, vl.as<const float>(), T, vb.as<const float>());
        const auto mine = balance_counts(rc, *routing, span);
        std::copy(mine.begin(), mine.end(), vn.as<float>());
      },
      {logits, L_.expert_bias_, counts}, ctx_.tally);
  Group counts_group = L_.cp_.on() ? L_.cp_.tp_cp : L_.tp_.group;
  counts_group.all_reduce(counts.buffer(), counts.buffer(), std::size_t(n), s,
                          {.async = true, .name = "router_balance_counts_allreduce"});
  launch(
      s, "router_aux_loss",
      Work{.flops = 4.0 * double(T * E),
           .bytes = double(logits.bytes()),
           .precision = Precision::FP32,
           .shape = KernelShape::memory(MemoryOp::Elementwise)},
      [=] {
        const float* summed = vn.as<const float>();
        add_balance_losses(rc, vl.as<const float>(), *routing, span,
                           std::vector<std::int64_t>(summed, summed + n));
        publish();
      },
      {logits, counts, io.topk_idx, io.topk_probs, io.tokens_per_expert,
       L_.local_tokens_per_expert_},
      ctx_.tally);
}

void TransformerLayer::update_expert_bias(Group group, Stream& s, WorkTally* tally) {
  if (!local_tokens_per_expert_) return;
  const std::int64_t E = cfg_.num_moe_experts;
  if (group.size() > 1)
    group.all_reduce(local_tokens_per_expert_.buffer(), local_tokens_per_expert_.buffer(),
                     std::size_t(E), s, {.async = true, .name = "router_expert_bias_allreduce"});
  const View vb = view(expert_bias_), vt = view(local_tokens_per_expert_);
  const double rate = cfg_.router.bias_update_rate;
  launch(
      s, "router_expert_bias_update",
      Work{.flops = 4.0 * double(E),
           .bytes = 3.0 * double(expert_bias_.bytes()),
           .precision = Precision::FP32,
           .shape = KernelShape::memory(MemoryOp::Elementwise)},
      [=] {
        float* counts = vt.as<float>();
        const std::vector<std::int64_t> step(counts, counts + E);
        layers::update_expert_bias(vb.as<float>(), step, rate);
      },
      {expert_bias_, local_tokens_per_expert_}, tally);
}

}  // namespace nodeemu::layers
