// The flex dispatcher (MoEFlexTokenDispatcher, megatron/core/transformer/moe/token_dispatcher.py)
// on comm/'s DeepEP-like or HybridEP-like backend: each token goes once to every rank that holds
// one of its experts, the receiver groups the rows by local expert itself, and combine sums at
// the source. Rows travel in the model's dtype, as DeepEP's bf16 rows do; the probabilities
// travel in fp32 (fused_a2a.py converts them), and combine sums in fp32 and stores the dtype.
// The backward of dispatch is a combine that carries the probabilities' gradients beside the
// rows (DeepEP's combine reduces topk_weights): the rank that owns a choice is the only one with
// a non-zero entry there, so the fp32 sum at the source delivers each exactly.
//
// The host waits once per dispatch, for the counts notify_dispatch exchanges (the CPU spin in
// DeepEP's Buffer::dispatch); it then knows the rows per local expert, and nothing after it
// blocks. In meta mode every EP rank's tokens per expert come from the meta routing.
//
// HybridEP permutes inside its dispatch and unpermutes inside its combine
// (hybrid_ep_buffer.py dispatch_with_permute / combine_with_unpermute, _HybridEPManager), so its
// permute kernels run in the dispatch and combine nodes, on their stream, and the mlp node's
// sort and unsort do nothing; DeepEP's permute runs in the mlp node (the flex dispatcher's
// dispatch_postprocess, like the alltoall dispatcher's sort by local expert).
#include <optional>

#include "comm/flex_dispatcher.hpp"
#include "devices/errors.hpp"
#include "layers/token_dispatcher.hpp"
#include "layers/token_permute.hpp"

namespace nodeemu::layers::detail {

namespace {

RowFormat row_format(DType t) {
  switch (t) {
    case DType::BF16:
      return {2, [](const void* s, float* d, std::size_t n) { to_f32(DType::BF16, s, d, n); },
              [](const float* s, void* d, std::size_t n) { from_f32(DType::BF16, s, d, n); }};
    case DType::F16:
      return {2, [](const void* s, float* d, std::size_t n) { to_f32(DType::F16, s, d, n); },
              [](const float* s, void* d, std::size_t n) { from_f32(DType::F16, s, d, n); }};
    default:
      return {};
  }
}

FlexConfig flex_config(const ModelConfig& cfg) {
  FlexConfig f{.backend = cfg.moe_flex_dispatcher_backend,
               .num_sms = cfg.moe_flex_dispatcher_num_sms,
               .rows = row_format(cfg.dtype)};
  if (cfg.moe_hybridep_num_sms_preprocessing > 0)
    f.preprocessing_sms = cfg.moe_hybridep_num_sms_preprocessing;
  return f;
}

class FlexTokenDispatcher final : public TokenDispatcher {
 public:
  FlexTokenDispatcher(const ModelConfig& cfg, Group ep, Mode mode, int rank)
      : TokenDispatcher(cfg, ep, rank),
        cfg_(cfg),
        mode_(mode),
        ep_size_(ep.size()),
        comm_(ep, cfg.num_moe_experts, cfg.hidden_size, cfg.router.topk, flex_config(cfg)) {
    if (mode == Mode::Meta && !cfg.meta_routing && !cfg.router.force_load_balancing)
      throw ConfigError("model", "moe_router_force_load_balancing",
                        "meta mode has no routing data: the flex dispatcher needs "
                        "moe_router_force_load_balancing=true, emulator.routing_trace or "
                        "emulator.routing_skew to know what each rank sends");
  }
  std::unique_ptr<DispatchPlan> plan(std::int64_t tokens, std::int64_t, int microbatch) override;
  const ModelConfig cfg_;
  const Mode mode_;
  const int ep_size_;
  FlexDispatcher comm_;
};

class FlexPlan final : public DispatchPlan {
 public:
  FlexPlan(FlexTokenDispatcher& d, std::int64_t tokens, std::vector<std::int64_t> meta_counts)
      : d_(d), tokens_(tokens), meta_counts_(std::move(meta_counts)) {}

  // setup_metadata needs no kernel of its own here: the indices and fp32 probabilities are the
  // router's outputs already.
  void preprocess(ops::At) override {}

  void dispatch(ops::At at) override {
    const auto& c = d_.cfg_;
    const int k = c.router.topk;
    FlexDispatched got = d_.comm_.dispatch(
        io.hidden.buffer(), io.topk_idx.buffer(), io.topk_probs.buffer(), int(tokens_), at.stream,
        {.async = true, .name = "moe_dispatch_flex"}, meta_counts_,
        std::vector<std::int64_t>(std::size_t(d_.ep_size_), tokens_));
    handle_ = got.handle;
    const std::int64_t recv = handle_.num_recv;
    recv_x_ = Tensor(got.x, {recv, c.hidden_size}, c.dtype);
    recv_idx_ = Tensor(got.topk_idx, {recv, k}, DType::I64);
    recv_w_ = Tensor(got.topk_weight, {recv, k}, DType::F32);
    // The counts per local expert reached the host with the one sync (the handle's
    // num_recv_tokens_per_expert_list).
    io.rows_per_expert = handle_.recv_per_expert;
    rows_ = 0;
    for (auto n : io.rows_per_expert) rows_ += n;
    if (in_kernel()) permute(at, "hybridep_permute");
  }

  void sort(ops::At at) override {
    if (!in_kernel()) permute(at, "flex_permute");
  }

  void permute(ops::At at, const char* name) {
    Sorted s = sort_by_expert(at, name, recv_x_, recv_idx_, recv_w_, d_.cfg_.router.topk, 0,
                              d_.local_experts(), 0, rows_);
    io.expert_in = s.rows;
    io.expert_probs = s.probs;
    slots_ = s.slots;
    recv_x_ = recv_idx_ = recv_w_ = Tensor();
  }

  // The mlp node lets go of the experts' output after unsort: HybridEP's combine holds it.
  void unsort(ops::At at) override {
    expert_out_ = io.expert_out;
    if (!in_kernel()) unpermute_rows(at, "flex_unpermute");
  }

  void unpermute_rows(ops::At at, const char* name) {
    y_rows_ = unpermute(at, name, expert_out_, Tensor(), slots_, d_.cfg_.router.topk,
                        handle_.num_recv, d_.cfg_.dtype);
    expert_out_ = Tensor();
  }

  void combine(ops::At at) override {
    if (in_kernel()) unpermute_rows(at, "hybridep_unpermute");
    FlexCombined out = d_.comm_.combine(y_rows_.buffer(), handle_, at.stream,
                                        {.async = true, .name = "moe_combine_flex"});
    io.moe_out = Tensor(out.x, {tokens_, d_.cfg_.hidden_size}, d_.cfg_.dtype);
    y_rows_ = Tensor();
  }

  void combine_backward(ops::At at) override {
    Buffer rows = d_.comm_.combine_backward(io.grad_moe_out.buffer(), handle_, at.stream,
                                            {.async = true, .name = "moe_combine_bwd_flex"});
    g_rows_ = Tensor(rows, {handle_.num_recv, d_.cfg_.hidden_size}, d_.cfg_.dtype);
    if (in_kernel()) gather(at, "hybridep_unpermute_bwd");
  }

  void unsort_backward(ops::At at) override {
    if (!in_kernel()) gather(at, "flex_unpermute_bwd");
  }

  void gather(ops::At at, const char* name) {
    io.grad_expert_out = gather_rows(at, name, g_rows_, slots_, d_.cfg_.router.topk);
    g_rows_ = Tensor();
  }

  void sort_backward(ops::At at) override {
    grad_in_ = io.grad_expert_in;  // held for HybridEP's dispatch backward, as for unsort
    grad_probs_ = io.grad_expert_probs;
    if (!in_kernel()) scatter_grads(at, "flex_permute_bwd");
  }

  void scatter_grads(ops::At at, const char* name) {
    const auto& c = d_.cfg_;
    g_recv_ =
        unpermute(at, name, grad_in_, Tensor(), slots_, c.router.topk, handle_.num_recv, c.dtype);
    g_recv_probs_ = scatter_probs(at, std::string(name) + "_probs", grad_probs_, slots_,
                                  c.router.topk, handle_.num_recv);
    grad_in_ = grad_probs_ = Tensor();
  }

  void dispatch_backward(ops::At at) override {
    const auto& c = d_.cfg_;
    if (in_kernel()) scatter_grads(at, "hybridep_permute_bwd");
    const Buffer gw = g_recv_probs_.buffer();
    FlexCombined out =
        d_.comm_.dispatch_backward(g_recv_.buffer(), handle_, at.stream,
                                   {.async = true, .name = "moe_dispatch_bwd_flex"}, &gw);
    io.grad_hidden = Tensor(out.x, {tokens_, c.hidden_size}, c.dtype);
    io.grad_probs = Tensor(out.topk_weight, {tokens_, c.router.topk}, DType::F32);
    g_recv_ = g_recv_probs_ = Tensor();
  }

  void preprocess_backward(ops::At) override { slots_ = Tensor(); }

 private:
  bool in_kernel() const { return d_.cfg_.moe_flex_dispatcher_backend == FlexBackend::HybridEP; }
  FlexTokenDispatcher& d_;
  std::int64_t tokens_, rows_ = 0;
  std::vector<std::int64_t> meta_counts_;
  FlexHandle handle_;
  Tensor recv_x_, recv_idx_, recv_w_, slots_, y_rows_, g_rows_, g_recv_, g_recv_probs_;
  Tensor expert_out_, grad_in_, grad_probs_;
};

std::unique_ptr<DispatchPlan> FlexTokenDispatcher::plan(std::int64_t tokens, std::int64_t,
                                                        int microbatch) {
  std::vector<std::int64_t> counts;
  if (mode_ == Mode::Meta) counts = meta_counts(cfg_, ep_size_, tokens, microbatch);
  return std::make_unique<FlexPlan>(*this, tokens, std::move(counts));
}

}  // namespace

std::unique_ptr<TokenDispatcher> make_flex(const ModelConfig& cfg, Group ep, Mode mode, int rank) {
  return std::make_unique<FlexTokenDispatcher>(cfg, std::move(ep), mode, rank);
}

}  // namespace nodeemu::layers::detail
