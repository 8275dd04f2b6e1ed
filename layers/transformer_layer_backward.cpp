// LayerPlan's backward bodies: each node's dgrad and, where it has weights, its wgrad
// (transformer_layer.hpp). Split from transformer_layer.cpp, which keeps the forward.
#include "devices/errors.hpp"
#include "layers/detail/graph_regions.hpp"
#include "layers/detail/layer_plan_state.hpp"
#include "layers/detail/op_launch.hpp"
#include "layers/router.hpp"
#include "layers/transformer_layer.hpp"

namespace nodeemu::layers {

namespace {

Tensor grad_output_of(const Tensor* slot, int layer) {
  if (!slot || !*slot)
    throw UsageError("layer " + std::to_string(layer) +
                     ": backward before its output gradient exists");
  return *slot;
}

}  // namespace

// The shared experts' dgrad on `s` (the compute stream, or the side stream once the layer's
// output gradient is ready), into st.g_shared_in.
void LayerPlan::shared_experts_backward(Stream& s) {
  if (!L_.shared_fc1_.value) return;
  const ModelConfig& c = L_.cfg_;
  State& st = *st_;
  ops::At at = at_(s);
  SavedTensors& sv = st.saved;
  if (overlap_shared()) s.wait(st.shared_ready);
  st.g_shared_out = gathered(at, st.grad_out, "sp_allgather_shared_fc2_bwd");
  const std::vector<std::int64_t> rows = {st.g_shared_out.dim(0)};
  backward_start("shared_experts", s);
  Tensor ga =
      ops::linear_dgrad(at, "shared_fc2", st.g_shared_out, L_.shared_fc2_.value, rows, c.dtype);
  Tensor dummy;
  ops::swiglu_backward(at, "shared_act", ga, shared_fc1_out(s), Tensor(), st.g_shared_fc1, dummy);
  sv.release("shared_experts", "fc1_output");
  st.re_shared_f1 = Tensor();
  st.g_shared_in = scattered(
      at, ops::linear_dgrad(at, "shared_fc1", st.g_shared_fc1, L_.shared_fc1_.value, rows, c.dtype),
      "sp_reducescatter_shared_fc1_bwd");
  dgrad_end("shared_experts", s);
  if (overlap_shared()) s.record(st.shared_done);
}

void LayerPlan::combine_backward(Stream& s) {
  State& st = *st_;
  st.grad_out = grad_output_of(st.grad_output, L_.layer_);
  st.dispatch->io.grad_moe_out = st.grad_out;
  if (overlap_shared()) s.record(st.shared_ready);  // the output gradient exists
  // The mlp_norm group committed in combine's forward: its commit's backward is here.
  backward_start("mlp_norm", s);
  detail::GraphRegions graph(s);
  graph.enter(ctx_.graphs.moe);
  st.dispatch->combine_backward(at_(s));
  st.dispatch->io.grad_moe_out = Tensor();
  if (overlap_shared()) shared_experts_backward(ctx_.shared_experts);
}

void LayerPlan::mlp_backward(Stream& s) {
  const ModelConfig& c = L_.cfg_;
  State& st = *st_;
  ops::At at = at_(s);
  SavedTensors& sv = st.saved;
  const bool moe = L_.is_moe();
  detail::GraphRegions graph(s);
  graph.enter(moe ? ctx_.graphs.moe : ctx_.graphs.mlp);
  Tensor gy;
  ops::Rows rows;
  if (moe) {
    st.dispatch->unsort_backward(at);
    gy = st.dispatch->io.grad_expert_out;
    st.dispatch->io.grad_expert_out = Tensor();
    rows = st.dispatch->io.rows_per_expert;
  } else {
    st.grad_out = grad_output_of(st.grad_output, L_.layer_);
    backward_start("mlp_norm", s);  // committed after the dense MLP's residual add
    gy = gathered(at, st.grad_out, "sp_allgather_fc2_bwd");
    rows = {gy.dim(0)};
  }
  const char* fc1 = fc1_name();
  const char* fc2 = fc2_name();
  const char* act = moe ? "moe_act" : "dense_act";
  backward_start(fc2, s);
  Tensor ga = ops::linear_dgrad(at, fc2, gy, L_.fc2_.value, rows, c.dtype);
  dgrad_end(fc2, s);
  Tensor g1, gprobs;
  {
    backward_start(act, s);
    ops::swiglu_backward(at, act, ga, fc1_out(s), probs(s), g1, gprobs, rows);
    // A recomputed activation output is made now, while its input is still here: the wgrad
    // may run later (delay_wgrad_compute).
    if (re_act()) (void)act_out(s);
    sv.release(act, "input");
    sv.release(act, "probs");
    st.re_h1 = Tensor();
    dgrad_end(act, s, false);
  }
  backward_start(fc1, s);
  Tensor gin = ops::linear_dgrad(at, fc1, g1, L_.fc1_.value, rows, c.dtype);
  dgrad_end(fc1, s);
  st.g_fc2_out = gy;
  st.g_fc1_out = g1;
  if (moe) {
    st.dispatch->io.grad_expert_in = gin;
    st.dispatch->io.grad_expert_probs = gprobs;
    st.dispatch->sort_backward(at);
    st.dispatch->io.grad_expert_in = st.dispatch->io.grad_expert_probs = Tensor();
  } else {
    st.g_dense_ln2 = scattered(at, gin, "sp_reducescatter_fc1_bwd");
  }
}

void LayerPlan::mlp_dw(Stream& s) {
  State& st = *st_;
  ops::At at = at_(s);
  SavedTensors& sv = st.saved;
  const bool moe = L_.is_moe();
  detail::GraphRegions graph(s);
  graph.enter(moe ? ctx_.graphs.moe : ctx_.graphs.mlp);
  const ops::Rows rows = moe ? st.dispatch->io.rows_per_expert : ops::Rows{st.batch * st.seq};
  const char* fc1 = fc1_name();
  const char* fc2 = fc2_name();
  // fc2 first, then fc1 (the order Megatron's delayed expert wgrad runs them in).
  ops::linear_wgrad(at, fc2, st.g_fc2_out, act_out(s), rows, L_.fc2_);
  sv.release(fc2, "input");
  st.re_a = Tensor();
  wgrad_end(fc2, s);
  ops::linear_wgrad(at, fc1, st.g_fc1_out, fc1_in(s), rows, L_.fc1_);
  if (moe) sv.release(fc1, "dispatched_input");
  if (!moe) st.ln2_all = Tensor();
  wgrad_end(fc1, s);
  st.g_fc2_out = st.g_fc1_out = Tensor();
}

void LayerPlan::pre_dispatch_backward(Stream& s) {
  const ModelConfig& c = L_.cfg_;
  State& st = *st_;
  ops::At at = at_(s);
  SavedTensors& sv = st.saved;
  if (!st.grad_out) st.grad_out = grad_output_of(st.grad_output, L_.layer_);
  const GraphScopes& gs = ctx_.graphs;
  detail::GraphRegions graph(s);
  Tensor g_ln2;
  if (L_.is_moe()) {
    MoeTokens& io = st.dispatch->io;
    graph.enter(gs.moe || gs.moe_preprocess);
    st.dispatch->preprocess_backward(at);
    graph.enter(gs.moe || gs.moe_router);
    backward_start("router", s);
    const std::int64_t T = st.local_tokens(), E = c.num_moe_experts;
    Tensor logits = sv.need("router", "logits", s);
    st.g_logits = at.empty({T, E}, DType::F32);
    {
      View vl = view(logits), vg = view(io.grad_probs), vd = view(st.g_logits);
      auto routing = st.routing;
      const RouterConfig rc = c.router;
      const double scale = st.loss_scale;
      // Autograd's backward of the unfused routing: topk's (zeros, then a scatter of the
      // chosen probabilities' gradients) and softmax's (a multiply, the softmax backward
      // kernel): the layer anatomy's trace rows 62-65 (1.6, 6.0, 2.8 and 2.0 us).
      static constexpr ops::detail::KernelPiece kPieces[] = {
          {".zeros", 1.6}, {".scatter", 6.0}, {".mul", 2.8}, {"", 2.0}};
      ops::detail::launch_pieces(
          s, "router_topk_bwd",
          Work{.flops = 12.0 * double(T * E),
               .bytes = 2.0 * double(st.g_logits.bytes()),
               .precision = Precision::FP32,
               .shape = KernelShape::memory(MemoryOp::Elementwise)},
          kPieces, false,
          [=] {
            route_backward(rc, vl.as<const float>(), *routing, vg.as<const float>(), scale,
                           vd.as<float>());
          },
          {logits, io.grad_probs, st.g_logits}, ctx_.tally);
    }
    Tensor g_router = ops::linear_dgrad(router_at(s), "router_gating", st.g_logits,
                                        L_.router_.value, {T}, c.dtype);
    dgrad_end("router", s);
    if (overlap_shared())
      s.wait(st.shared_done);
    else
      shared_experts_backward(s);
    const Tensor g_shared = st.g_shared_in;
    st.g_shared_in = Tensor();
    g_ln2 = ops::add3(at, "pre_mlp_grad_sum", io.grad_hidden, g_router, g_shared, c.dtype);
    io.grad_hidden = io.grad_probs = Tensor();
  } else {
    graph.enter(gs.mlp);
    g_ln2 = st.g_dense_ln2;
    st.g_dense_ln2 = Tensor();
  }
  st.g_ln2 = g_ln2;
  Tensor h = sv.need("mlp_norm", "input", s);
  Tensor g_hn = ops::rmsnorm_dgrad(at, "pre_mlp_layernorm", g_ln2, h, L_.mlp_norm_,
                                   sv.need("mlp_norm", "rstd", s));
  dgrad_end("mlp_norm", s);
  // Autograd sums the residual's two gradients between the captured regions.
  graph.enter(false);
  backward_start("attn_norm", s);  // committed after the attention's residual add
  st.g_h = ops::add(at, "attn_residual_add_bwd", g_hn, st.grad_out);
  graph.enter(gs.attn);
  backward_start("attn_proj", s);
  st.g_h_all = gathered(at, st.g_h, "sp_allgather_proj_bwd");
  Tensor g_ctx = ops::linear_dgrad(at, "linear_proj", st.g_h_all, L_.proj_.value,
                                   ops::one_group(st.g_h_all), c.dtype);
  dgrad_end("attn_proj", s);
  backward_start("core_attn", s);
  Tensor g_qkv =
      core_attention_backward(at, g_ctx, qkv(s), attn_out(s), attn_lse(s), attn_probs(s));
  sv.release("core_attn", "input");
  sv.release("core_attn", "lse");
  sv.release("core_attn", "probs");
  st.re_qkv = st.re_lse = st.re_probs = Tensor();
  dgrad_end("core_attn", s, false);
  ops::rope(at, "rotary_pos_emb_bwd", g_qkv, st.attn(), c.rope(), true);
  if (L_.q_norm_.value) {
    g_qkv = ops::qk_norm_backward(at, g_qkv, sv.need("qkv_linear", "qk_norm_input", s),
                                  sv.need("qkv_linear", "qk_norm_rstd", s), L_.q_norm_, L_.k_norm_,
                                  st.attn());
    sv.release("qkv_linear", "qk_norm_input");
    sv.release("qkv_linear", "qk_norm_rstd");
  }
  backward_start("qkv_linear", s);
  if (L_.mla_.on()) {
    st.g_ln1 = L_.mla_.backward(at, g_qkv, st.attn(), sv, "qkv_linear", st.mla_grads);
  } else {
    ops::qkv_split_backward(at, "linear_qkv", st.attn(), c.dtype);
    st.g_qkv = g_qkv;
    st.g_ln1 = scattered(
        at,
        ops::linear_dgrad(at, "linear_qkv", g_qkv, L_.qkv_.value, ops::one_group(g_qkv), c.dtype),
        "sp_reducescatter_qkv_bwd");
  }
  dgrad_end("qkv_linear", s);
  const Tensor x = sv.need("attn_norm", "input", s);
  Tensor g_xn = ops::rmsnorm_dgrad(at, "input_layernorm", st.g_ln1, x, L_.input_norm_,
                                   sv.need("attn_norm", "rstd", s));
  dgrad_end("attn_norm", s);
  grad_input = ops::add(at, "input_residual_bwd", g_xn, st.g_h);
  st.grad_out = Tensor();
  if (prologue.backward) prologue.backward(s);
}

void LayerPlan::pre_dispatch_dw(Stream& s) {
  State& st = *st_;
  ops::At at = at_(s);
  SavedTensors& sv = st.saved;
  const GraphScopes& gs = ctx_.graphs;
  detail::GraphRegions graph(s);
  graph.enter(L_.is_moe() ? gs.moe || gs.moe_router : gs.mlp);
  if (L_.is_moe()) {
    const Tensor ln2 = this->ln2(s);
    ops::linear_wgrad(router_at(s), "router_gating", st.g_logits, ln2, ops::one_group(ln2),
                      L_.router_);
    sv.release("router", "logits");
    wgrad_end("router", s);
    if (L_.shared_fc1_.value) {
      const Tensor all = ln2_all(s);
      ops::linear_wgrad(at, "shared_fc2", st.g_shared_out, shared_act_out(s), ops::one_group(all),
                        L_.shared_fc2_);
      ops::linear_wgrad(at, "shared_fc1", st.g_shared_fc1, all, ops::one_group(all),
                        L_.shared_fc1_);
      st.ln2_all = Tensor();
      sv.release("shared_experts", "act_output");
      st.re_shared_a = Tensor();
      wgrad_end("shared_experts", s);
    }
    st.g_logits = st.g_shared_out = st.g_shared_fc1 = Tensor();
  }
  sv.release(ln2_owner(), "pre_mlp_layernorm_output");
  st.re_ln2 = Tensor();
  ops::rmsnorm_wgrad(at, "pre_mlp_layernorm", st.g_ln2, sv.need("mlp_norm", "input", s),
                     sv.need("mlp_norm", "rstd", s), L_.mlp_norm_);
  sv.release("mlp_norm", "input");
  sv.release("mlp_norm", "rstd");
  wgrad_end("mlp_norm", s);
  graph.enter(gs.attn);
  const Tensor ctxt = attn_out(s);
  ops::linear_wgrad(at, "linear_proj", st.g_h_all, ctxt, ops::one_group(ctxt), L_.proj_);
  st.g_h_all = Tensor();
  sv.release("attn_proj", "input");
  st.re_ctx = Tensor();
  wgrad_end("attn_proj", s);
  if (L_.mla_.on()) {
    L_.mla_.wgrad(at, ln1(s), sv, "qkv_linear", st.mla_grads);
  } else {
    const Tensor ln1 = ln1_all(s);
    ops::linear_wgrad(at, "linear_qkv", st.g_qkv, ln1, ops::one_group(ln1), L_.qkv_);
  }
  sv.release("qkv_linear", "input");
  st.re_ln1 = st.ln1_all = Tensor();
  wgrad_end("qkv_linear", s);
  st.attn_recomputed = false;
  ops::rmsnorm_wgrad(at, "input_layernorm", st.g_ln1, sv.need("attn_norm", "input", s),
                     sv.need("attn_norm", "rstd", s), L_.input_norm_);
  sv.release("attn_norm", "input");
  sv.release("attn_norm", "rstd");
  wgrad_end("attn_norm", s);
  st.g_ln2 = st.g_h = st.g_qkv = st.g_ln1 = Tensor();
  if (prologue.dw) prologue.dw(s);
}

void LayerPlan::backward_start(const char* module, Stream& s) {
  st_->saved.backward_start(module, s);
}

void LayerPlan::dgrad_end(const char* module, Stream& s, bool has_wgrad) {
  if (!has_wgrad || ctx_.delay_wgrad) st_->saved.backward_end(module, s);
}

void LayerPlan::wgrad_end(const char* module, Stream& s) {
  if (!ctx_.delay_wgrad) st_->saved.backward_end(module, s);
}

}  // namespace nodeemu::layers
