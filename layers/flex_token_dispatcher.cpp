// The flex dispatcher (MoEFlexTokenDispatcher) on comm/'s DeepEP-like or HybridEP-like backend:
// each token goes once to every rank that holds one of its experts, the receiver groups the
// rows by local expert itself, and combine sums at the source. Rows travel in fp32 (a bf16
// model's rows are widened first, exactly, so the experts see the same values). The backward of
// dispatch carries the probabilities' gradients in `topk` extra columns of each row: the rank
// that owns a choice is the only one with a non-zero entry there, so the sum at the source
// delivers each exactly.
#include <optional>

#include "comm/flex_dispatcher.hpp"
#include "devices/errors.hpp"
#include "layers/token_dispatcher.hpp"
#include "layers/token_permute.hpp"

namespace nodeemu::layers::detail {

namespace {

class FlexTokenDispatcher final : public TokenDispatcher {
 public:
  FlexTokenDispatcher(const ModelConfig& cfg, Group ep, Mode mode, int rank)
      : TokenDispatcher(cfg, ep, rank),
        cfg_(cfg),
        rows_(ep, cfg.num_moe_experts, cfg.hidden_size, cfg.router.topk,
              {.backend = cfg.moe_flex_dispatcher_backend}),
        packed_(ep, cfg.num_moe_experts, cfg.hidden_size + cfg.router.topk, cfg.router.topk,
                {.backend = cfg.moe_flex_dispatcher_backend}) {
    if (mode == Mode::Meta)
      throw ConfigError("model", "moe_token_dispatcher_type",
                        "the flex dispatcher needs routing data and meta mode has none; use "
                        "alltoall with moe_router_force_load_balancing=true in meta mode");
  }
  std::unique_ptr<DispatchPlan> plan(std::int64_t tokens, std::int64_t, int) override;
  const ModelConfig cfg_;
  FlexDispatcher rows_;    // [tokens][hidden] rows
  FlexDispatcher packed_;  // [tokens][hidden + topk]: gradients and the probs' gradients
};

class FlexPlan final : public DispatchPlan {
 public:
  FlexPlan(FlexTokenDispatcher& d, std::int64_t tokens) : d_(d), tokens_(tokens) {}

  void preprocess(ops::At at) override {
    x32_ = io.hidden.dtype() == DType::F32
               ? io.hidden
               : ops::cast(at, "flex_preprocess", io.hidden, DType::F32);
  }

  void dispatch(ops::At at) override {
    const auto& c = d_.cfg_;
    const int k = c.router.topk;
    FlexDispatched got =
        d_.rows_.dispatch(x32_.buffer(), io.topk_idx.buffer(), io.topk_probs.buffer(), int(tokens_),
                          at.stream, {.async = true, .name = "moe_dispatch_flex"});
    handle_ = got.handle;
    const std::int64_t recv = handle_.num_recv;
    recv_x_ = Tensor(got.x, {recv, c.hidden_size}, DType::F32);
    recv_idx_ = Tensor(got.topk_idx, {recv, k}, DType::I64);
    recv_w_ = Tensor(got.topk_weight, {recv, k}, DType::F32);
    x32_ = Tensor();
    // DeepEP hands the host the received counts per local expert (the CPU spins on them).
    at.stream.synchronize();
    io.rows_per_expert =
        count_per_expert(recv_idx_.data<std::int64_t>(), recv, k, 0, d_.local_experts());
    rows_ = 0;
    for (auto n : io.rows_per_expert) rows_ += n;
  }

  void sort(ops::At at) override {
    Sorted s = sort_by_expert(at, "flex_permute", recv_x_, recv_idx_, recv_w_, d_.cfg_.router.topk,
                              0, d_.local_experts(), 0, rows_);
    io.expert_in = s.rows;
    io.expert_probs = s.probs;
    slots_ = s.slots;
    recv_x_ = recv_idx_ = recv_w_ = Tensor();
  }

  void unsort(ops::At at) override {
    y_rows_ = unpermute(at, "flex_unpermute", io.expert_out, Tensor(), slots_, d_.cfg_.router.topk,
                        handle_.num_recv);
  }

  void combine(ops::At at) override {
    Buffer out = d_.rows_.combine(y_rows_.buffer(), handle_, at.stream,
                                  {.async = true, .name = "moe_combine_flex"});
    io.moe_out = Tensor(out, {tokens_, d_.cfg_.hidden_size}, DType::F32);
    y_rows_ = Tensor();
  }

  void combine_backward(ops::At at) override {
    const Tensor g = io.grad_moe_out.dtype() == DType::F32
                         ? io.grad_moe_out
                         : ops::cast(at, "flex_combine_bwd_cast", io.grad_moe_out, DType::F32);
    Buffer rows = d_.rows_.combine_backward(g.buffer(), handle_, at.stream,
                                            {.async = true, .name = "moe_combine_bwd_flex"});
    g_rows_ = Tensor(rows, {handle_.num_recv, d_.cfg_.hidden_size}, DType::F32);
  }

  void unsort_backward(ops::At at) override {
    io.grad_expert_out =
        gather_rows(at, "flex_unpermute_bwd", g_rows_, slots_, d_.cfg_.router.topk);
    g_rows_ = Tensor();
  }

  void sort_backward(ops::At at) override {
    packed_rows_ = unpermute(at, "flex_permute_bwd", io.grad_expert_in, io.grad_expert_probs,
                             slots_, d_.cfg_.router.topk, handle_.num_recv);
  }

  void dispatch_backward(ops::At at) override {
    Buffer out = d_.packed_.dispatch_backward(packed_rows_.buffer(), handle_, at.stream,
                                              {.async = true, .name = "moe_dispatch_bwd_flex"});
    packed_ = Tensor(out, {tokens_, d_.cfg_.hidden_size + d_.cfg_.router.topk}, DType::F32);
    packed_rows_ = Tensor();
  }

  void preprocess_backward(ops::At at) override {
    const auto& c = d_.cfg_;
    split_packed(at, "flex_bwd_split", packed_, c.hidden_size, c.router.topk, c.dtype,
                 io.grad_hidden, io.grad_probs);
    packed_ = slots_ = Tensor();
  }

 private:
  FlexTokenDispatcher& d_;
  std::int64_t tokens_, rows_ = 0;
  FlexHandle handle_;
  Tensor x32_, recv_x_, recv_idx_, recv_w_, slots_, y_rows_, g_rows_, packed_rows_, packed_;
};

std::unique_ptr<DispatchPlan> FlexTokenDispatcher::plan(std::int64_t tokens, std::int64_t, int) {
  return std::make_unique<FlexPlan>(*this, tokens);
}

}  // namespace

std::unique_ptr<TokenDispatcher> make_flex(const ModelConfig& cfg, Group ep, Mode mode, int rank) {
  return std::make_unique<FlexTokenDispatcher>(cfg, std::move(ep), mode, rank);
}

}  // namespace nodeemu::layers::detail
