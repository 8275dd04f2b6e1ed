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
//
// HybridEP's sync-free mode (moe_expert_rank_capacity_factor; _HybridEPManager.setup_metadata
// and dispatch): every dispatch is given a budget of permuted rows, int(tokens x topk x factor)
// rounded up to the fused grouped MLP's 256-row alignment, and the host never waits. The rows
// per expert stay on the device, where the grouped GEMMs read them; pairs past the budget are
// dropped and the layer's over-budget flag is set (Megatron's over_budget, which the step
// checks once at its end).
#include <algorithm>
#include <numeric>
#include <optional>

#include "comm/flex_dispatcher.hpp"
#include "devices/device.hpp"
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

// TE's grouped-tensor and fused grouped-MLP kernels take expert rows in multiples of 256
// (moe_utils.py get_align_size_for_quantization); the sync-free mode runs them.
constexpr std::int64_t kFusedGroupedMlpAlign = 256;

class FlexTokenDispatcher final : public TokenDispatcher {
 public:
  FlexTokenDispatcher(const ModelConfig& cfg, Group ep, Mode mode, int rank)
      : TokenDispatcher(cfg, ep, rank),
        cfg_(cfg),
        mode_(mode),
        ep_size_(ep.size()),
        comm_(ep, cfg.num_moe_experts, cfg.hidden_size, cfg.router.topk, flex_config(cfg)) {
    if (cfg.moe_expert_rank_capacity_factor > 0 &&
        cfg.moe_flex_dispatcher_backend != FlexBackend::HybridEP)
      throw ConfigError("model", "moe_expert_rank_capacity_factor",
                        "the sync-free budget is HybridEP's: set "
                        "moe_flex_dispatcher_backend: hybridep");
    // A rank receives at most every row every EP peer sends (tokens x topk each); a larger
    // budget keeps nothing more, and a huge one overflowed the budget's integer.
    if (cfg.moe_expert_rank_capacity_factor > double(ep_size_))
      throw ConfigError("model", "moe_expert_rank_capacity_factor",
                        "must be at most the expert-parallel size (" + std::to_string(ep_size_) +
                            "): above it the budget exceeds every row the peers can send");
    // Megatron requires TE's fused grouped experts here (use_transformer_engine_op_fuser), whose
    // grouped GEMM reads the rows per expert on the device.
    if (cfg.moe_expert_rank_capacity_factor > 0 && !cfg.kernels.grouped_gemm)
      throw ConfigError("model", "moe_grouped_gemm",
                        "moe_expert_rank_capacity_factor runs the experts as one grouped GEMM "
                        "that reads its rows on the device: set moe_grouped_gemm: true");
    if (mode == Mode::Meta && !cfg.meta_routing && !cfg.router.force_load_balancing)
      throw ConfigError("model", "moe_router_force_load_balancing",
                        "meta mode has no routing data: the flex dispatcher needs "
                        "moe_router_force_load_balancing=true, emulator.routing_trace or "
                        "emulator.routing_skew to know what each rank sends");
  }
  std::unique_ptr<DispatchPlan> plan(std::int64_t tokens, std::int64_t, int microbatch) override;
  bool over_budget() override {
    if (mode_ == Mode::Meta) return meta_over_budget_;
    return over_budget_ && over_budget_.data<std::int32_t>()[0] != 0;
  }
  void reset_over_budget() override {
    meta_over_budget_ = false;
    if (over_budget_ && mode_ != Mode::Meta) over_budget_.data<std::int32_t>()[0] = 0;
  }
  void set_sync_free(bool on) override { sync_free_ = on; }
  // Permuted rows a sync-free dispatch of `tokens` may keep; 0: the host synchronises.
  std::int64_t budget(std::int64_t tokens) const {
    const double f = cfg_.moe_expert_rank_capacity_factor;
    if (f <= 0 || !sync_free_) return 0;
    const auto b = std::int64_t(double(tokens) * cfg_.router.topk * f);
    return (b + kFusedGroupedMlpAlign - 1) / kFusedGroupedMlpAlign * kFusedGroupedMlpAlign;
  }
  const ModelConfig cfg_;
  const Mode mode_;
  const int ep_size_;
  FlexDispatcher comm_;
  Tensor over_budget_;  // int32 [1] on the device, made by the first sync-free dispatch
  bool sync_free_ = true;
  bool meta_over_budget_ = false;  // meta mode: from the host-known routing
};

class FlexPlan final : public DispatchPlan {
 public:
  FlexPlan(FlexTokenDispatcher& d, std::int64_t tokens, MetaCounts meta_counts)
      : d_(d), tokens_(tokens), budget_(d.budget(tokens)), meta_counts_(std::move(meta_counts)) {}

  // setup_metadata needs no kernel of its own here: the indices and fp32 probabilities are the
  // router's outputs already.
  void preprocess(ops::At) override {}

  void dispatch(ops::At at) override {
    const auto& c = d_.cfg_;
    const int k = c.router.topk;
    FlexDispatched got = d_.comm_.dispatch(
        io.hidden.buffer(), io.topk_idx.buffer(), io.topk_probs.buffer(), int(tokens_), at.stream,
        {.async = true, .name = "moe_dispatch_flex"}, values_of(meta_counts_),
        std::vector<std::int64_t>(std::size_t(d_.ep_size_), tokens_), int(budget_));
    handle_ = got.handle;
    const std::int64_t recv = received();
    recv_x_ = Tensor(got.x, {recv, c.hidden_size}, c.dtype);
    recv_idx_ = Tensor(got.topk_idx, {recv, k}, DType::I64);
    recv_w_ = Tensor(got.topk_weight, {recv, k}, DType::F32);
    if (budget_ > 0 && handle_.num_recv < 0) {
      // Sync-free: the host declares the budget, spread evenly over the local experts (what the
      // timing plane prices); the real rows per expert are made on the device by the permute.
      const std::int64_t L = d_.local_experts();
      io.rows_per_expert = std::vector<std::int64_t>(std::size_t(L), budget_ / L);
      for (std::int64_t e = 0; e < budget_ % L; ++e) ++io.rows_per_expert.host[std::size_t(e)];
    } else if (budget_ > 0) {
      // Sync-free in meta mode: the kernels are priced at the rows the device would keep, by
      // sort_within_budget's rule, from the routing the model is given.
      io.rows_per_expert = within_budget(handle_.recv_per_expert);
    } else {
      // The counts per local expert reached the host with the one sync (the handle's
      // num_recv_tokens_per_expert_list).
      io.rows_per_expert = handle_.recv_per_expert;
    }
    rows_ = std::accumulate(io.rows_per_expert.host.begin(), io.rows_per_expert.host.end(),
                            std::int64_t(0));
    if (in_kernel()) permute(at, "hybridep_permute");
  }

  // Each local expert's kept pairs, padded as the grouped GEMM takes them, from its received
  // pairs by sort_within_budget's rule; notes a drop on the dispatcher (meta mode's over-budget
  // flag).
  std::vector<std::int64_t> within_budget(const std::vector<std::int64_t>& pairs) const {
    constexpr std::int64_t a = kFusedGroupedMlpAlign;
    auto padded = [](std::int64_t n) { return (n + a - 1) / a * a; };
    std::vector<std::int64_t> kept(pairs.size());
    std::int64_t start = 0;
    for (std::size_t e = 0; e < pairs.size(); ++e) {
      const std::int64_t k = std::clamp<std::int64_t>(budget_ - start, 0, pairs[e]);
      d_.meta_over_budget_ |= k < pairs[e];
      kept[e] = padded(k);
      start += padded(pairs[e]);
    }
    return kept;
  }

  // Sync-free: rows in the received order live in HybridEP's buffer (combine_with_unpermute
  // writes there), which reserve_buffers accounts once; otherwise they are new allocations.
  Buffer in_buffer(ops::At at, std::size_t row_bytes) const {
    if (budget_ == 0) return {};
    return at.stream.device().workspace(
        std::max<std::size_t>(1, std::size_t(received()) * row_bytes));
  }

  // The rows the receive buffers hold: those received, or in sync-free mode all that can arrive.
  std::int64_t received() const {
    return handle_.num_recv >= 0 ? handle_.num_recv : d_.comm_.receive_bound(int(tokens_));
  }

  void sort(ops::At at) override {
    if (!in_kernel()) permute(at, "flex_permute");
  }

  void permute(ops::At at, const char* name) {
    const int k = d_.cfg_.router.topk;
    Sorted s;
    if (budget_ > 0) {
      if (!d_.over_budget_) d_.over_budget_ = at.empty({1}, DType::I32);
      s = sort_within_budget(at, name, recv_x_, recv_idx_, recv_w_, k, d_.local_experts(),
                             kFusedGroupedMlpAlign, budget_, io.rows_per_expert.device,
                             d_.over_budget_);
    } else {
      s = sort_by_expert(at, name, recv_x_, recv_idx_, recv_w_, k, 0, d_.local_experts(), 0, rows_);
    }
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
    const auto& c = d_.cfg_;
    y_rows_ = unpermute(at, name, expert_out_, Tensor(), slots_, c.router.topk, received(), c.dtype,
                        in_buffer(at, dtype_bytes(c.dtype) * std::size_t(c.hidden_size)));
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
    g_rows_ = Tensor(rows, {received(), d_.cfg_.hidden_size}, d_.cfg_.dtype);
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
    g_recv_ = unpermute(at, name, grad_in_, Tensor(), slots_, c.router.topk, received(), c.dtype,
                        in_buffer(at, dtype_bytes(c.dtype) * std::size_t(c.hidden_size)));
    g_recv_probs_ =
        scatter_probs(at, std::string(name) + "_probs", grad_probs_, slots_, c.router.topk,
                      received(), in_buffer(at, 4 * std::size_t(c.router.topk)));
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
  std::int64_t tokens_, budget_, rows_ = 0;
  MetaCounts meta_counts_;
  FlexHandle handle_;
  Tensor recv_x_, recv_idx_, recv_w_, slots_, y_rows_, g_rows_, g_recv_, g_recv_probs_;
  Tensor expert_out_, grad_in_, grad_probs_;
};

std::unique_ptr<DispatchPlan> FlexTokenDispatcher::plan(std::int64_t tokens, std::int64_t,
                                                        int microbatch) {
  MetaCounts counts;
  if (mode_ == Mode::Meta) counts = meta_counts(cfg_, ep_size_, tokens, microbatch);
  return std::make_unique<FlexPlan>(*this, tokens, std::move(counts));
}

}  // namespace

std::unique_ptr<TokenDispatcher> make_flex(const ModelConfig& cfg, Group ep, Mode mode, int rank) {
  return std::make_unique<FlexTokenDispatcher>(cfg, std::move(ep), mode, rank);
}

}  // namespace nodeemu::layers::detail
