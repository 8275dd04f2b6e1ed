// The fp32 router's math (Megatron-Core router.py / moe_utils.py semantics): gating, top-k with an
// optional group limit and expert bias, the load-balancing losses, and capacity dropping. It
// runs inside one device kernel on a layer's compute stream; templated on the compute type so
// the gradient tests can run it in fp64.
#pragma once
#include <cstdint>
#include <vector>

#include "layers/router_config.hpp"

namespace nodeemu::layers {

// Which tokens the load-balancing losses are taken over, and where this rank's sit among them:
// with sequence parallelism the TP group's tokens, of which this rank routes rows
// [first, first + tokens). `seq` is the sequence length (seq_aux_loss's span).
struct TokenSpan {
  std::int64_t first = 0, total = 0, seq = 0;
};

template <class T>
struct Routing {
  std::int64_t tokens = 0;
  int topk = 0;
  // [tokens][topk]: the top-k choice, by descending score (as torch.topk returns it).
  std::vector<std::int64_t> chosen;
  // The same after capacity dropping: -1 where the capacity dropped the choice.
  std::vector<std::int64_t> idx;
  // [tokens][topk]: the probability each kept choice is weighted with; 0 where dropped.
  std::vector<T> probs;
  // [experts]: kept (token, expert) pairs per expert, before any padding.
  std::vector<std::int64_t> tokens_per_expert;
  T aux_loss = 0, seq_aux_loss = 0, z_loss = 0;  // already multiplied by their coefficients
  // The losses' tokens, and their counts of top-k choices per span and expert
  // ([spans][experts]; one span for aux_loss, one per sequence for seq_aux_loss), summed over
  // every rank of the span (Megatron all-reduces them over the TP x CP group).
  TokenSpan span;
  std::vector<std::int64_t> balance_counts;
};

// logits: [tokens][experts], tokens in sequence order for `batch` sequences of `seq` tokens
// (the seq-aux loss is per sequence). expert_bias: [experts] or null.
template <class T>
Routing<T> route(const RouterConfig& cfg, const T* logits, std::int64_t tokens, std::int64_t seq,
                 const T* expert_bias);

// The same in three steps, for tokens split over ranks: the choice (top-k, probabilities,
// capacity) of this rank's tokens; this rank's share of the balance counts (to be summed over
// the span's ranks); and the losses' shares, given the summed counts. The z-loss is averaged
// over the span's tokens too, so the shares add up to the whole's losses.
template <class T>
Routing<T> route_choice(const RouterConfig& cfg, const T* logits, std::int64_t tokens,
                        const T* expert_bias);
template <class T>
std::vector<std::int64_t> balance_counts(const RouterConfig& cfg, const Routing<T>& r,
                                         TokenSpan span);
template <class T>
void add_balance_losses(const RouterConfig& cfg, const T* logits, Routing<T>& r, TokenSpan span,
                        std::vector<std::int64_t> counts);

// The gradient of (sum_i dprobs . probs + loss_scale * (aux + seq_aux + z)) with respect to the
// logits: dlogits [tokens][experts], overwritten. dprobs: [tokens][topk].
template <class T>
void route_backward(const RouterConfig& cfg, const T* logits, const Routing<T>& r, const T* dprobs,
                    double loss_scale, T* dlogits);

// Megatron's aux-loss-free balancing step (moe_router_enable_expert_bias): each expert's bias
// moves by rate * sign(mean load - its load).
void update_expert_bias(float* bias, const std::vector<std::int64_t>& tokens_per_expert,
                        double rate);

}  // namespace nodeemu::layers
