// The allgather dispatcher (MoEAllGatherTokenDispatcher): every rank all-gathers the tokens and
// their routing over EP, keeps the pairs of its local experts, and the expert outputs go home
// by a reduce-scatter. The host waits on the gathered routing for its local counts, as
// Megatron's does for the grouped GEMM's splits. Not allowed with EP overlap (emu/ validates).
#include "devices/errors.hpp"
#include "layers/token_dispatcher.hpp"
#include "layers/token_permute.hpp"

namespace nodeemu::layers::detail {

namespace {

class AllgatherTokenDispatcher final : public TokenDispatcher {
 public:
  AllgatherTokenDispatcher(const ModelConfig& cfg, Group ep, Mode mode, int rank)
      : TokenDispatcher(cfg, ep, rank), cfg_(cfg), ep_(std::move(ep)), mode_(mode) {
    if (mode == Mode::Meta && !cfg.meta_routing && !cfg.router.force_load_balancing)
      throw ConfigError("model", "moe_router_force_load_balancing",
                        "meta mode has no routing data: the allgather dispatcher needs "
                        "moe_router_force_load_balancing=true, emulator.routing_trace or "
                        "emulator.routing_skew to know its local counts");
  }
  std::unique_ptr<DispatchPlan> plan(std::int64_t tokens, std::int64_t, int microbatch) override;
  const ModelConfig cfg_;
  Group ep_;
  Mode mode_;
};

class AllgatherPlan final : public DispatchPlan {
 public:
  // meta_counts: every EP rank's counts, meta mode.
  AllgatherPlan(AllgatherTokenDispatcher& d, std::int64_t tokens, MetaCounts meta_counts)
      : d_(d), tokens_(tokens), all_(tokens * d.ep_.size()), meta_counts_(std::move(meta_counts)) {}

  void preprocess(ops::At) override {}

  void dispatch(ops::At at) override {
    const auto& c = d_.cfg_;
    const int k = c.router.topk;
    gathered_ = at.empty({all_, c.hidden_size}, c.dtype);
    gidx_ = at.empty({all_, k}, DType::I64);
    gprobs_ = at.empty({all_, k}, DType::F32);
    Group& ep = d_.ep_;
    ep.all_gather(io.hidden.buffer(), gathered_.buffer(), io.hidden.bytes(), at.stream,
                  {.async = true, .name = "moe_allgather_tokens"});
    ep.all_gather(io.topk_idx.buffer(), gidx_.buffer(), io.topk_idx.bytes(), at.stream,
                  {.async = true, .name = "moe_allgather_idx"});
    ep.all_gather(io.topk_probs.buffer(), gprobs_.buffer(), io.topk_probs.bytes(), at.stream,
                  {.async = true, .name = "moe_allgather_probs"});
    if (d_.mode_ == Mode::Meta) {
      // The gathered routing: each local expert's rows from every EP rank.
      io.rows_per_expert.host.assign(std::size_t(d_.local_experts()), 0);
      for (int r = 0; r < d_.ep_.size(); ++r)
        for (int e = 0; e < d_.local_experts(); ++e)
          io.rows_per_expert.host[std::size_t(e)] +=
              (*meta_counts_)[std::size_t(r) * std::size_t(c.num_moe_experts) +
                              std::size_t(d_.first_expert() + e)];
    } else {
      at.stream.synchronize();  // the local counts go to the host
      io.rows_per_expert = count_per_expert(gidx_.data<std::int64_t>(), all_, k, d_.first_expert(),
                                            d_.local_experts());
    }
    rows_ = 0;
    for (auto n : io.rows_per_expert.host) rows_ += n;
  }

  void sort(ops::At at) override {
    Sorted s = sort_by_expert(at, "allgather_permute", gathered_, gidx_, gprobs_,
                              d_.cfg_.router.topk, d_.first_expert(), d_.local_experts(), 0, rows_);
    io.expert_in = s.rows;
    io.expert_probs = s.probs;
    slots_ = s.slots;
    gathered_ = gidx_ = gprobs_ = Tensor();
  }

  void unsort(ops::At at) override {
    y_all_ = unpermute(at, "allgather_unpermute", io.expert_out, Tensor(), slots_,
                       d_.cfg_.router.topk, all_);
  }

  void combine(ops::At at) override {
    const std::int64_t h = d_.cfg_.hidden_size;
    io.moe_out = at.empty({tokens_, h}, DType::F32);
    reduce_scatter(at, y_all_, io.moe_out, h, "moe_reducescatter");
    y_all_ = Tensor();
  }

  void combine_backward(ops::At at) override {
    const auto& c = d_.cfg_;
    g_all_ = at.empty({all_, c.hidden_size}, io.grad_moe_out.dtype());
    d_.ep_.all_gather(io.grad_moe_out.buffer(), g_all_.buffer(), io.grad_moe_out.bytes(), at.stream,
                      {.async = true, .name = "moe_reducescatter_bwd"});
  }

  void unsort_backward(ops::At at) override {
    io.grad_expert_out =
        gather_rows(at, "allgather_unpermute_bwd", g_all_, slots_, d_.cfg_.router.topk);
    g_all_ = Tensor();
  }

  void sort_backward(ops::At at) override {
    packed_all_ = unpermute(at, "allgather_permute_bwd", io.grad_expert_in, io.grad_expert_probs,
                            slots_, d_.cfg_.router.topk, all_);
  }

  void dispatch_backward(ops::At at) override {
    const std::int64_t w = d_.cfg_.hidden_size + d_.cfg_.router.topk;
    packed_ = at.empty({tokens_, w}, DType::F32);
    reduce_scatter(at, packed_all_, packed_, w, "moe_allgather_bwd");
    packed_all_ = Tensor();
  }

  void preprocess_backward(ops::At at) override {
    const auto& c = d_.cfg_;
    split_packed(at, "allgather_bwd_split", packed_, c.hidden_size, c.router.topk, c.dtype,
                 io.grad_hidden, io.grad_probs);
    packed_ = slots_ = Tensor();
  }

 private:
  void reduce_scatter(ops::At at, const Tensor& all, const Tensor& mine, std::int64_t width,
                      const char* name) {
    std::vector<std::size_t> counts(std::size_t(d_.ep_.size()), std::size_t(tokens_ * width));
    d_.ep_.reduce_scatter(all.buffer(), mine.buffer(), counts, at.stream,
                          {.async = true, .name = name});
  }

  AllgatherTokenDispatcher& d_;
  std::int64_t tokens_, all_, rows_ = 0;
  MetaCounts meta_counts_;  // [ep][experts], meta mode
  Tensor gathered_, gidx_, gprobs_, slots_, y_all_, g_all_, packed_all_, packed_;
};

std::unique_ptr<DispatchPlan> AllgatherTokenDispatcher::plan(std::int64_t tokens, std::int64_t,
                                                             int microbatch) {
  MetaCounts counts;
  if (mode_ == Mode::Meta) counts = meta_counts(cfg_, ep_.size(), tokens, microbatch);
  return std::make_unique<AllgatherPlan>(*this, tokens, std::move(counts));
}

}  // namespace

std::unique_ptr<TokenDispatcher> make_allgather(const ModelConfig& cfg, Group ep, Mode mode,
                                                int rank) {
  return std::make_unique<AllgatherTokenDispatcher>(cfg, std::move(ep), mode, rank);
}

}  // namespace nodeemu::layers::detail
