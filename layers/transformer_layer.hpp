// One transformer layer on one rank, and its per-micro-batch plan split into Megatron-Core's
// schedule nodes (REFERENCE §1):
//
//   pre_dispatch (compute)  input norm, QKV (or MLA's projections: mla.hpp), RoPE, causal GQA
//                           attention, projection, residual,
//                           pre-MLP norm, shared experts, router, dispatch preprocess (permute)
//   dispatch     (comm)     the tokens' all-to-all
//   mlp          (compute)  sort by local expert, grouped fc1, SwiGLU x probs, grouped fc2, unsort
//   combine      (comm)     the way back, unpermute, + shared experts, + residual
//   mtp          (compute)  an MTP layer's final norm (Megatron's mtp_post_process, mtp.hpp);
//                           a no-op node for a decoder layer
//
// A dense layer runs its MLP (and the residual add) in `mlp`; its dispatch and combine are no-op
// nodes. With TP (tensor_parallel.hpp) the layer's input and output are this rank's share of the
// tokens; attention, the dense MLP and the shared experts run on all of them with their heads or
// features split, and the router and the token dispatcher see this rank's share. Experts are
// sharded by EP, and their columns by expert TP (alltoall_token_dispatcher.cpp). CP = 1.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "comm/group.hpp"
#include "devices/host.hpp"
#include "layers/context_parallel.hpp"
#include "layers/mla.hpp"
#include "layers/model_config.hpp"
#include "layers/ops.hpp"
#include "layers/parameter.hpp"
#include "layers/schedule_node.hpp"
#include "layers/tensor_parallel.hpp"
#include "layers/token_dispatcher.hpp"

namespace nodeemu::layers {

// What the router reports for one micro-batch, on the host once its kernel has run.
struct RouterStats {
  double aux_loss = 0, seq_aux_loss = 0, z_loss = 0;
  std::vector<std::int64_t> tokens_per_expert;
};

class LayerPlan;

class TransformerLayer {
 public:
  // `ep` is this rank's EP group (ignored by dense layers); `rank` its global device id; `tp` its
  // TP group, of cfg.tensor_model_parallel_size ranks; `etp` its expert-TP group; `cp` its CP
  // group, of cfg.context_parallel_size ranks.
  TransformerLayer(const ModelConfig& cfg, int layer, Device& device, std::uint64_t seed, Group ep,
                   int rank, TensorParallel tp = {}, TensorParallel etp = {},
                   ContextParallel cp = {});
  // With a dispatcher of the caller's (TokenDispatcher::alone); null for a dense layer.
  TransformerLayer(const ModelConfig& cfg, int layer, Device& device, std::uint64_t seed,
                   std::unique_ptr<TokenDispatcher> dispatcher, TensorParallel tp = {},
                   ContextParallel cp = {});
  ~TransformerLayer();
  bool is_moe() const { return dispatcher_ != nullptr; }
  TokenDispatcher* dispatcher() const { return dispatcher_.get(); }  // null for a dense layer
  int layer() const { return layer_; }
  std::vector<Parameter*> parameters();
  const ModelConfig& config() const { return cfg_; }
  // The expert bias and its step counts (empty without moe_router_enable_expert_bias).
  const Tensor& expert_bias() const { return expert_bias_; }
  const Tensor& local_tokens_per_expert() const { return local_tokens_per_expert_; }
  // Aux-loss-free balancing, once per step after the backward (Megatron's finalize_model_grads
  // _update_router_expert_bias): the step's tokens per expert summed over `group` (the stage's
  // TP x CP x DP ranks), and each expert's bias moved by rate x sign(mean - its count). The
  // counts are zeroed with the gradients (ModelChunk::zero_grad), so that a step run again
  // counts once. Nothing without moe_router_enable_expert_bias.
  void update_expert_bias(Group group, Stream& s, WorkTally* tally = nullptr);

  // The plan of one micro-batch; connect() it before running it. `loss_scale` multiplies the
  // router losses' gradients.
  std::unique_ptr<LayerPlan> plan(ExecContext& ctx, Event* plan_event, int microbatch,
                                  std::int64_t batch, std::int64_t seq, double loss_scale);

 private:
  friend class LayerPlan;
  void make_parameters(Device& device, std::uint64_t seed, const TensorParallel& etp);
  ModelConfig cfg_;
  int layer_;
  TensorParallel tp_;
  ContextParallel cp_;
  Parameter input_norm_, qkv_, proj_, mlp_norm_;  // no qkv_ with MLA
  Parameter q_norm_, k_norm_;                     // [head_dim] each, with qk_layernorm (not MLA)
  MultiLatentAttention mla_;                      // multi_latent_attention's projections
  Parameter router_;                              // fp32 [experts][hidden]
  Tensor expert_bias_;                            // fp32 [experts] (moe_router_enable_expert_bias)
  // With the expert bias: this rank's tokens per expert, summed over the step's micro-batches
  // (Megatron's router local_tokens_per_expert; fp32 sums of integers, exact below 2^24).
  Tensor local_tokens_per_expert_;
  Parameter fc1_, fc2_;                // experts: [local][2f][h], [local][h][f]; dense: 2-D
  Parameter shared_fc1_, shared_fc2_;  // optional
  std::unique_ptr<TokenDispatcher> dispatcher_;
};

class LayerPlan {
 public:
  LayerPlan(TransformerLayer& layer, ExecContext& ctx, Event* plan_event, int microbatch,
            std::int64_t batch, std::int64_t seq, double loss_scale);
  ~LayerPlan();
  // Where the input is read when pre_dispatch runs forward, and the output gradient when the
  // first backward node runs: a chunk chains its layers through these slots.
  void connect(const Tensor* input, const Tensor* grad_output);
  ScheduleNode pre_dispatch, dispatch, mlp, combine, mtp;
  // Work of an MTP layer's own inside pre_dispatch: before its forward (what makes the layer's
  // input), after its backward and after its wgrad (Megatron's MTP pre_dispatch callable holds
  // the embedding, the norms and eh_proj; layers/mtp.hpp). Empty for a decoder layer.
  struct Prologue {
    std::function<void(Stream&)> forward, backward, dw;
  } prologue;
  Tensor output;      // after combine's forward (mlp's, for a dense layer)
  Tensor grad_input;  // after pre_dispatch's backward
  // The router's losses and counts for this micro-batch (valid once the router kernel has run
  // for real: after a synchronize).
  const RouterStats& router_stats() const { return *stats_; }

 private:
  struct State;
  void pre_dispatch_forward(Stream& s);
  void pre_dispatch_backward(Stream& s);
  void pre_dispatch_dw(Stream& s);
  void mlp_forward(Stream& s);
  void mlp_backward(Stream& s);
  void mlp_dw(Stream& s);
  void combine_forward(Stream& s);
  void combine_backward(Stream& s);
  void shared_experts_forward(Stream& s);
  void shared_experts_backward(Stream& s);
  bool overlap_shared() const;
  void route_tokens(Stream& s, const Tensor& logits, std::int64_t T);
  // A module's backward boundaries for the offload hooks (hooks.hpp): the start before its first
  // backward kernel, the end after its dgrad when there is no wgrad or it is delayed
  // (dgrad_end), else after its wgrad (wgrad_end).
  void backward_start(const char* module, Stream& s);
  void dgrad_end(const char* module, Stream& s, bool has_wgrad = true);
  void wgrad_end(const char* module, Stream& s);
  // What backward reads, kept by forward or recomputed here (selective recompute); a recomputed
  // tensor is held from its first use until its last.
  ops::At at_(Stream& s) const;
  ops::At router_at(Stream& s) const;  // at_, with the GEMMs in moe_router_dtype
  ops::At recompute_at(Stream& s) const;
  // Held while a recompute issues its ops: the host pays forward's framework cost for them.
  FrameworkScope recompute_scope(Stream& s) const;
  // A token-split tensor all-gathered over TP (itself without TP), and the reverse: a partial
  // sum over TP reduce-scattered to this rank's tokens.
  Tensor gathered(ops::At at, const Tensor& x, const char* name) const;
  Tensor scattered(ops::At at, const Tensor& x, const char* name) const;
  Tensor ln1(Stream& s);
  Tensor ln1_all(Stream& s);  // ln1 of every token of the TP group (the QKV's input)
  Tensor ln2_all(Stream& s);  // the same for the dense MLP's and the shared experts' input
  Tensor qkv(Stream& s);
  Tensor attn_out(Stream& s);
  Tensor attn_lse(Stream& s);
  Tensor attn_probs(Stream& s);
  void recompute_attention(Stream& s);
  // Core attention, context-parallel when the layer's CP group is (layer_recompute.cpp).
  void core_attention_forward(ops::At at, const Tensor& qkv, Tensor& out, Tensor& lse,
                              Tensor& probs);
  Tensor core_attention_backward(ops::At at, const Tensor& dout, const Tensor& qkv,
                                 const Tensor& out, const Tensor& lse, const Tensor& probs);
  Tensor ln2(Stream& s);
  Tensor shared_fc1_out(Stream& s);
  Tensor shared_act_out(Stream& s);
  void recompute_shared(Stream& s);
  Tensor fc1_in(Stream& s);
  Tensor fc1_out(Stream& s);
  Tensor act_out(Stream& s);
  Tensor probs(Stream& s);
  bool up_recomputed() const;  // mla_up_proj, on an MLA layer
  bool re_fc1() const;
  bool re_act() const;
  const char* fc1_name() const { return L_.is_moe() ? "expert_fc1" : "dense_fc1"; }
  const char* fc2_name() const { return L_.is_moe() ? "expert_fc2" : "dense_fc2"; }
  const char* ln2_owner() const { return L_.is_moe() ? "router" : "dense_fc1"; }
  TransformerLayer& L_;
  ExecContext& ctx_;
  std::unique_ptr<State> st_;
  std::shared_ptr<RouterStats> stats_;
};

}  // namespace nodeemu::layers
