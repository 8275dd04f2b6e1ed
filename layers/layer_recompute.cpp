// Selective recompute inside a layer's plan: what backward reads, kept by forward or recomputed
// (layers/recompute.hpp says which). Part of LayerPlan (transformer_layer.hpp), split out by
// concern. A recomputed tensor is held from its first use to its last.
#include "layers/transformer_layer.hpp"

#include "devices/device.hpp"
#include "devices/node.hpp"
#include "layers/detail/layer_plan_state.hpp"

namespace nodeemu::layers {

FrameworkScope LayerPlan::recompute_scope(Stream& s) const {
  // Megatron re-runs a checkpointed module's forward under autograd (tensor_parallel/random.py
  // CheckpointWithoutOutput.recompute, CheckpointFunction.backward): the host pays its forward
  // ops' framework cost again, inside the backward.
  return FrameworkScope(s.device().node(), FrameworkPass::Forward);
}

ops::At LayerPlan::recompute_at(Stream& s) const {
  ops::At at{s, ctx_.tally, "recompute.", &L_.cfg_.kernels};
  at.weights_generation = ctx_.weights_generation;
  return at;
}

bool LayerPlan::re_fc1() const {
  return L_.is_moe() ? ctx_.recompute.expert_fc1 : ctx_.recompute.dense_fc1;
}

bool LayerPlan::re_act() const {
  return L_.is_moe() ? ctx_.recompute.expert_act : ctx_.recompute.dense_act;
}

Tensor LayerPlan::ln1(Stream& s) {
  State& st = *st_;
  if (!ctx_.recompute.input_norm) return st.saved.need("qkv_linear", "input", s);
  if (!st.re_ln1) {
    const FrameworkScope forward = recompute_scope(s);
    Tensor rstd;
    ops::rmsnorm_forward(recompute_at(s), "input_layernorm", st.saved.need("attn_norm", "input", s),
                         L_.input_norm_, L_.cfg_.layernorm_epsilon, st.re_ln1, rstd);
  }
  return st.re_ln1;
}

Tensor LayerPlan::ln1_all(Stream& s) {
  State& st = *st_;
  if (!L_.tp_.on()) return ln1(s);
  if (!st.ln1_all) st.ln1_all = gathered(at_(s), ln1(s), "sp_allgather_qkv_bwd");
  return st.ln1_all;
}

Tensor LayerPlan::ln2_all(Stream& s) {
  State& st = *st_;
  if (!L_.tp_.on()) return ln2(s);
  if (!st.ln2_all) st.ln2_all = gathered(at_(s), ln2(s), "sp_allgather_mlp_bwd");
  return st.ln2_all;
}

bool LayerPlan::up_recomputed() const {
  return ctx_.recompute.mla_up_proj && L_.mla_.on();
}

Tensor LayerPlan::qkv(Stream& s) {
  State& st = *st_;
  if (!ctx_.recompute.qkv && !up_recomputed()) return st.saved.need("core_attn", "input", s);
  if (!st.re_qkv) {
    const FrameworkScope forward = recompute_scope(s);
    const ops::At at = recompute_at(s);
    // mla_up_proj recomputes from the latents forward kept, even when the whole attention is
    // recomputed too (a2a_overlap_attn): the norms' outputs are then the recompute's.
    if (up_recomputed()) {
      st.re_qkv = L_.mla_.recompute_up(at, st.attn(), st.saved, "qkv_linear", st.mla_grads);
    } else if (L_.mla_.on()) {
      st.re_qkv = L_.mla_.forward(at, ln1(s), st.attn(), nullptr, "qkv_linear");
    } else {
      const Tensor in = ln1_all(s);
      st.re_qkv = ops::linear_forward(at, "linear_qkv", in, L_.qkv_.value, ops::one_group(in),
                                      L_.cfg_.dtype);
      ops::qkv_split_forward(at, "linear_qkv", st.attn(), L_.cfg_.dtype);
    }
    if (L_.q_norm_.value) {
      Tensor rstd;  // the forward's, saved, is what backward uses
      st.re_qkv = ops::qk_norm_forward(at, st.re_qkv, L_.q_norm_, L_.k_norm_, st.attn(),
                                       L_.cfg_.layernorm_epsilon, rstd);
    }
    ops::rope(at, "rotary_pos_emb", st.re_qkv, st.attn(), L_.cfg_.rope(), false);
  }
  return st.re_qkv;
}

// Core attention, over the CP group when there is one (layers/context_parallel.hpp).
void LayerPlan::core_attention_forward(ops::At at, const Tensor& qkv, Tensor& out, Tensor& lse,
                                       Tensor& probs) {
  if (L_.cp_.on())
    cp_attention_forward(at, L_.cp_, qkv, st_->attn(), out, lse);
  else
    ops::attention_forward(at, qkv, st_->attn(), out, lse, probs);
}

Tensor LayerPlan::core_attention_backward(ops::At at, const Tensor& dout, const Tensor& qkv,
                                          const Tensor& out, const Tensor& lse,
                                          const Tensor& probs) {
  if (L_.cp_.on()) return cp_attention_backward(at, L_.cp_, dout, qkv, out, lse, st_->attn());
  return ops::attention_backward(at, dout, qkv, out, lse, probs, st_->attn());
}

// Runs the attention forward again; keeps the output and statistics forward did not keep.
void LayerPlan::recompute_attention(Stream& s) {
  State& st = *st_;
  if (st.attn_recomputed) return;
  st.attn_recomputed = true;
  const FrameworkScope forward = recompute_scope(s);
  Tensor ctx, lse, probs;
  core_attention_forward(recompute_at(s), qkv(s), ctx, lse, probs);
  if (ctx_.recompute.attn_out) st.re_ctx = ctx;
  if (ctx_.recompute.attn_stats) st.re_lse = lse, st.re_probs = probs;
}

Tensor LayerPlan::attn_out(Stream& s) {
  if (!ctx_.recompute.attn_out) return st_->saved.need("attn_proj", "input", s);
  recompute_attention(s);
  return st_->re_ctx;
}

Tensor LayerPlan::attn_lse(Stream& s) {
  if (!ctx_.recompute.attn_stats) return st_->saved.need("core_attn", "lse", s);
  recompute_attention(s);
  return st_->re_lse;
}

Tensor LayerPlan::attn_probs(Stream& s) {
  if (L_.cfg_.kernels.attention != CoreAttention::Unfused) return Tensor();
  if (!ctx_.recompute.attn_stats) return st_->saved.need("core_attn", "probs", s);
  recompute_attention(s);
  return st_->re_probs;
}

Tensor LayerPlan::ln2(Stream& s) {
  State& st = *st_;
  if (!ctx_.recompute.mlp_norm) return st.saved.need(ln2_owner(), "pre_mlp_layernorm_output", s);
  if (!st.re_ln2) {
    const FrameworkScope forward = recompute_scope(s);
    Tensor rstd;
    ops::rmsnorm_forward(recompute_at(s), "pre_mlp_layernorm",
                         st.saved.need("mlp_norm", "input", s), L_.mlp_norm_,
                         L_.cfg_.layernorm_epsilon, st.re_ln2, rstd);
  }
  return st.re_ln2;
}

void LayerPlan::recompute_shared(Stream& s) {
  State& st = *st_;
  if (st.re_shared_f1 || st.re_shared_a) return;
  const FrameworkScope forward = recompute_scope(s);
  const ops::At at = recompute_at(s);
  const Tensor in = ln2_all(s);
  st.re_shared_f1 = ops::linear_forward(at, "shared_fc1", in, L_.shared_fc1_.value,
                                        ops::one_group(in), L_.cfg_.dtype);
  st.re_shared_a = ops::swiglu_forward(at, "shared_act", st.re_shared_f1, Tensor());
}

Tensor LayerPlan::shared_fc1_out(Stream& s) {
  if (!ctx_.recompute.shared) return st_->saved.need("shared_experts", "fc1_output", s);
  recompute_shared(s);
  return st_->re_shared_f1;
}

Tensor LayerPlan::shared_act_out(Stream& s) {
  if (!ctx_.recompute.shared) return st_->saved.need("shared_experts", "act_output", s);
  recompute_shared(s);
  return st_->re_shared_a;
}

Tensor LayerPlan::fc1_in(Stream& s) {
  return L_.is_moe() ? st_->saved.need("expert_fc1", "dispatched_input", s) : ln2_all(s);
}

Tensor LayerPlan::probs(Stream& s) {
  return L_.is_moe() ? st_->saved.need("moe_act", "probs", s) : Tensor();
}

Tensor LayerPlan::fc1_out(Stream& s) {
  State& st = *st_;
  const char* act = L_.is_moe() ? "moe_act" : "dense_act";
  if (!re_fc1()) return st.saved.need(act, "input", s);
  if (!st.re_h1) {
    const FrameworkScope forward = recompute_scope(s);
    const Tensor in = fc1_in(s);
    const ops::Rows rows =
        L_.is_moe() ? st.dispatch->io.rows_per_expert : ops::Rows(ops::one_group(in));
    st.re_h1 = ops::linear_forward(recompute_at(s), L_.is_moe() ? "expert_fc1" : "dense_fc1", in,
                                   L_.fc1_, rows, L_.cfg_.dtype);
  }
  return st.re_h1;
}

Tensor LayerPlan::act_out(Stream& s) {
  State& st = *st_;
  const bool moe = L_.is_moe();
  if (!re_act()) return st.saved.need(moe ? "expert_fc2" : "dense_fc2", "input", s);
  if (!st.re_a) {
    const FrameworkScope forward = recompute_scope(s);
    st.re_a = ops::swiglu_forward(recompute_at(s), moe ? "moe_act" : "dense_act", fc1_out(s),
                                  probs(s), moe ? st.dispatch->io.rows_per_expert : ops::Rows{});
  }
  return st.re_a;
}

}  // namespace nodeemu::layers
