// Megatron-Core's token dispatchers (REFERENCE §2) over comm/: alltoall, allgather and flex
// (DeepEP-like or HybridEP-like). A TokenDispatcher belongs to one MoE layer on one rank; each
// micro-batch gets its own DispatchPlan, which carries the tokens through
//
//   preprocess  (compute, in pre_dispatch)  permute / layout; the alltoall counts sync point
//   dispatch    (comm)                      the tokens' all-to-all (or all-gather)
//   sort        (compute, start of mlp)     rows grouped by local expert
//   unsort      (compute, end of mlp)       back to the order the way home needs
//   combine     (comm)                      the way back, and the unpermute sum
//
// and the same steps backwards. Every step is one or more device operations on the stream it is
// given; the host blocks only where Megatron's does (the counts of a dropless alltoall, DeepEP's
// received counts, the allgather dispatcher's local counts).
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <vector>

#include "comm/group.hpp"
#include "layers/model_config.hpp"
#include "layers/ops.hpp"
#include "layers/tensor_parallel.hpp"

namespace nodeemu::layers {

// The tensors a dispatch plan consumes and produces; the MoE layer fills in the inputs.
struct MoeTokens {
  // Forward inputs, from pre_dispatch.
  Tensor hidden;             // [tokens][h], model dtype: the pre-MLP norm's output
  Tensor topk_idx;           // int64 [tokens][topk]: global expert ids, -1 where dropped
  Tensor topk_probs;         // fp32 [tokens][topk]
  Tensor tokens_per_expert;  // int64 [experts]: kept pairs per expert on this rank
  // Set by sort: the experts' input, grouped by local expert.
  Tensor expert_in;           // [rows][h]
  Tensor expert_probs;        // fp32 [rows]
  ops::Rows rows_per_expert;  // [local experts]
  Tensor expert_out;          // [rows][h], set by the mlp node
  Tensor moe_out;             // [tokens][h] fp32, set by combine
  // Backward.
  Tensor grad_moe_out;       // [tokens][h]: set before combine_backward
  Tensor grad_expert_out;    // set by unsort_backward
  Tensor grad_expert_in;     // [rows][h]: set by the mlp node's backward
  Tensor grad_expert_probs;  // fp32 [rows]: likewise
  Tensor grad_hidden;        // [tokens][h]: set by preprocess_backward
  Tensor grad_probs;         // fp32 [tokens][topk]: likewise
};

// Every EP rank's tokens per expert, rank-major, in meta mode: one matrix that the plans of the
// group's ranks share (MetaRouting::group_counts).
using MetaCounts = std::shared_ptr<const std::vector<std::int64_t>>;
// Its values; empty without a matrix (functional mode, or a dispatcher alone).
const std::vector<std::int64_t>& values_of(const MetaCounts& counts);

class DispatchPlan {
 public:
  virtual ~DispatchPlan() = default;
  MoeTokens io;
  // A CUDA graph holds the preprocess (moe_preprocess): a dispatcher that reads its counts on the
  // host copies them at the all-to-all instead (Megatron's cuda_dtoh_point, before_ep_alltoall).
  bool copy_counts_at_dispatch = false;
  virtual void preprocess(ops::At at) = 0;
  virtual void dispatch(ops::At at) = 0;
  virtual void sort(ops::At at) = 0;
  virtual void unsort(ops::At at) = 0;
  virtual void combine(ops::At at) = 0;
  virtual void combine_backward(ops::At at) = 0;
  virtual void unsort_backward(ops::At at) = 0;
  virtual void sort_backward(ops::At at) = 0;
  virtual void dispatch_backward(ops::At at) = 0;
  virtual void preprocess_backward(ops::At at) = 0;
  // Megatron frees moe_dispatch's input after forward only with the alltoall dispatcher
  // (should_free_input in megatron/core/models/common/utils.py).
  virtual bool frees_dispatch_input() const { return false; }
};

class TokenDispatcher {
 public:
  virtual ~TokenDispatcher() = default;
  // The dispatcher `cfg.moe_token_dispatcher_type` names, over `ep` (this rank's EP group).
  // Throws ConfigError for what the chosen one cannot do (meta mode without host-known
  // routing, flex in meta mode, experts that do not divide EP).
  // `rank` is this rank's global device id.
  // `layer`: the layer's global index (meta mode's routing is per layer).
  // `etp`: this rank's expert-TP group (cfg.expert_tensor_parallel_size ranks; alltoall only).
  static std::unique_ptr<TokenDispatcher> create(const ModelConfig& cfg, Group ep, Mode mode,
                                                 int rank, int layer = 0, TensorParallel etp = {});
  // Rank 0 of an EP group of `ep_size` with communication left out, in meta mode: the tokens
  // arrive and leave as if the all-to-alls had run, routed as forced balance routes them (or
  // padded to capacity). Its local work is the alltoall dispatcher's. For `nodeemu layer`.
  static std::unique_ptr<TokenDispatcher> alone(const ModelConfig& cfg, int ep_size);
  // One micro-batch's dispatch; called once per micro-batch and iteration.
  virtual std::unique_ptr<DispatchPlan> plan(std::int64_t tokens, std::int64_t seq,
                                             int microbatch) = 0;
  // HybridEP's sync-free mode: whether a dispatch since the last reset dropped pairs past its
  // budget (reads the device flag: the caller has synchronised), and the reset
  // (MoEFlexTokenDispatcher.check_over_budget / reset_over_budget).
  virtual bool over_budget() { return false; }
  virtual void reset_over_budget() {}
  // Whether plans made from now on use that budget (PagedStashRunner clears
  // moe_expert_rank_capacity_factor for its dropless rerun and restores it after).
  virtual void set_sync_free(bool) {}
  // The next plans repeat the micro-batches planned last (a rerun of the same step: meta mode's
  // routing is keyed by how often a micro-batch was planned).
  void rewind_plans() {
    for (auto& [mb, n] : planned_) n = n > 0 ? n - 1 : 0;
  }
  int local_experts() const { return local_experts_; }
  int first_expert() const { return first_expert_; }

 protected:
  TokenDispatcher(const ModelConfig& cfg, const Group& ep, int rank)
      : local_experts_(cfg.num_moe_experts / ep.size()),
        first_expert_(ep.index_of(rank) * local_experts_) {}
  TokenDispatcher(int local_experts, int first_expert)
      : local_experts_(local_experts), first_expert_(first_expert) {}
  // Meta mode: every EP rank's tokens per expert for the micro-batch planned now, rank-major
  // (cfg.meta_routing; the iteration is how often this micro-batch was planned before). The
  // group's ranks share the one matrix (MetaRouting::group_counts).
  MetaCounts meta_counts(const ModelConfig& cfg, int ep_size, std::int64_t tokens, int microbatch);
  int local_experts_, first_expert_;

 private:
  int layer_ = 0;
  std::map<int, int> planned_;  // micro-batch -> plans made
  std::shared_ptr<const MetaRouting> own_routing_;
};

namespace detail {
std::unique_ptr<TokenDispatcher> make_alltoall(const ModelConfig& cfg, Group ep, Mode mode,
                                               int rank, TensorParallel etp);
std::unique_ptr<TokenDispatcher> make_allgather(const ModelConfig& cfg, Group ep, Mode mode,
                                                int rank);
std::unique_ptr<TokenDispatcher> make_flex(const ModelConfig& cfg, Group ep, Mode mode, int rank);
std::unique_ptr<TokenDispatcher> make_alone(const ModelConfig& cfg, int ep_size);
}  // namespace detail

}  // namespace nodeemu::layers
