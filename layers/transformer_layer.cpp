#include "layers/transformer_layer.hpp"

#include <optional>

#include "devices/device.hpp"
#include "devices/errors.hpp"
#include "devices/host.hpp"
#include "devices/node.hpp"
#include "layers/detail/graph_regions.hpp"
#include "layers/detail/layer_plan_state.hpp"
#include "layers/router.hpp"

namespace nodeemu::layers {

namespace {

// Megatron's parameter names; layers past the decoder's are the MTP layers' inner layers.
std::string prefix(const ModelConfig& c, int layer) {
  if (layer >= c.num_layers)
    return "mtp.layers." + std::to_string(layer - c.num_layers) + ".transformer_layer.";
  return "decoder.layers." + std::to_string(layer) + ".";
}

void check_tp(const ModelConfig& cfg, const TensorParallel& tp, int layer, int cp = 1) {
  if (tp.size != cfg.tp())
    throw UsageError("layer " + std::to_string(layer) + ": a TP group of " +
                     std::to_string(tp.size) + " for tensor_model_parallel_size " +
                     std::to_string(cfg.tp()));
  if (cp != cfg.cp())
    throw UsageError("layer " + std::to_string(layer) + ": a CP group of " + std::to_string(cp) +
                     " for context_parallel_size " + std::to_string(cfg.cp()));
}

}  // namespace

TransformerLayer::TransformerLayer(const ModelConfig& cfg, int layer, Device& device,
                                   std::uint64_t seed, Group ep, int rank, TensorParallel tp,
                                   TensorParallel etp, ContextParallel cp)
    : cfg_(cfg), layer_(layer), tp_(std::move(tp)), cp_(std::move(cp)) {
  cfg.validate();
  check_tp(cfg, tp_, layer, cp_.size);
  if (cfg.is_moe_layer(layer))
    dispatcher_ = TokenDispatcher::create(cfg, ep, device.node().mode(), rank, layer, etp);
  make_parameters(device, seed, etp);
}

TransformerLayer::TransformerLayer(const ModelConfig& cfg, int layer, Device& device,
                                   std::uint64_t seed, std::unique_ptr<TokenDispatcher> dispatcher,
                                   TensorParallel tp, ContextParallel cp)
    : cfg_(cfg),
      layer_(layer),
      tp_(std::move(tp)),
      cp_(std::move(cp)),
      dispatcher_(std::move(dispatcher)) {
  cfg.validate();
  check_tp(cfg, tp_, layer, cp_.size);
  if (cfg.is_moe_layer(layer) != static_cast<bool>(dispatcher_))
    throw UsageError("layer " + std::to_string(layer) +
                     ": a MoE layer needs a dispatcher and a dense layer none");
  if (dispatcher_ && cfg.etp() != 1)
    throw UsageError("layer " + std::to_string(layer) +
                     ": a caller's dispatcher runs without expert TP (set "
                     "expert_tensor_parallel_size to 1)");
  make_parameters(device, seed, {});
}

void TransformerLayer::make_parameters(Device& device, std::uint64_t seed,
                                       const TensorParallel& etp) {
  const ModelConfig& cfg = cfg_;
  const std::string p = prefix(cfg_, layer_);
  const std::int64_t H = cfg.hidden_size, d = cfg.head_dim(), t = tp_.size;
  const std::int64_t heads = cfg.num_attention_heads, groups = cfg.num_query_groups;
  const double sd = cfg.init_method_std;
  const DType dt = cfg.dtype;
  // A weight every TP rank holds whole; its gradient is all-reduced over TP.
  auto replicated = [&](std::string name, Shape shape, DType type, Init init, double std) {
    Parameter w = make_parameter(device, std::move(name), std::move(shape), type, init, std, seed);
    w.sequence_parallel = tp_.on();
    return w;
  };
  // Column-parallel [segments][H] and row-parallel [H][in] shards of the whole weights.
  auto column = [&](std::string name, const std::vector<std::int64_t>& segments) {
    std::int64_t out = 0;
    for (auto n : segments) out += n;
    return make_parameter(device, std::move(name), {out / t, H}, dt, Init::Normal, sd, seed,
                          column_shard(segments, H, tp_));
  };
  auto row = [&](std::string name, std::int64_t in) {
    return make_parameter(device, std::move(name), {H, in / t}, dt, Init::Normal, sd, seed,
                          row_shard(in, tp_));
  };
  input_norm_ = replicated(p + "input_layernorm.weight", {H}, dt, Init::Ones, 0);
  if (cfg.multi_latent_attention)
    mla_ = MultiLatentAttention(cfg, device, seed, p, tp_);
  else
    qkv_ = column(p + "self_attention.linear_qkv.weight", {heads * d, groups * d, groups * d});
  proj_ = row(p + "self_attention.linear_proj.weight", heads * cfg.value_head_dim());
  mlp_norm_ = replicated(p + "pre_mlp_layernorm.weight", {H}, dt, Init::Ones, 0);
  if (cfg.qk_layernorm && !cfg.multi_latent_attention) {
    q_norm_ = replicated(p + "self_attention.q_layernorm.weight", {d}, dt, Init::Ones, 0);
    k_norm_ = replicated(p + "self_attention.k_layernorm.weight", {d}, dt, Init::Ones, 0);
  }
  if (!dispatcher_) {
    const std::int64_t F = cfg.ffn_hidden_size;
    fc1_ = column(p + "mlp.linear_fc1.weight", {F, F});  // [gate | up]
    fc2_ = row(p + "mlp.linear_fc2.weight", F);
    return;
  }
  const std::int64_t E = cfg.num_moe_experts, F = cfg.moe_ffn_hidden_size;
  const std::int64_t local = dispatcher_->local_experts(), first = dispatcher_->first_expert();
  // Megatron's router weight carries the sequence_parallel attribute (router.py).
  router_ = replicated(p + "mlp.router.weight", {E, H}, DType::F32, Init::Normal, sd);
  if (cfg.router.enable_expert_bias) {
    expert_bias_ = Tensor::empty(device, {E}, DType::F32);
    local_tokens_per_expert_ = Tensor::empty(device, {E}, DType::F32);
  }
  // Expert e's weights are drawn at offset e * per-expert elements of one stream per name, so
  // they do not depend on how the experts are sharded; with expert TP each expert's fc1 is
  // column-parallel ([gate | up] split) and its fc2 row-parallel.
  auto experts = [&](std::string name, Shape shape, std::int64_t per_expert, ShardIndex within) {
    const std::int64_t local_numel = shape[1] * shape[2];
    Parameter w = make_parameter(
        device, std::move(name), std::move(shape), dt, Init::Normal, sd, seed, [=](std::int64_t i) {
          return (first + i / local_numel) * per_expert + within(i % local_numel);
        });
    w.expert = true;
    keep_forward_copy(w);
    return w;
  };
  const std::int64_t et = etp.size;
  fc1_ = experts(p + "mlp.experts.linear_fc1.weight", {local, 2 * F / et, H}, 2 * F * H,
                 column_shard({F, F}, H, etp));
  fc2_ = experts(p + "mlp.experts.linear_fc2.weight", {local, H, F / et}, H * F, row_shard(F, etp));
  if (cfg.moe_shared_expert_intermediate_size > 0) {
    const std::int64_t S = cfg.moe_shared_expert_intermediate_size;
    shared_fc1_ = column(p + "mlp.shared_experts.linear_fc1.weight", {S, S});
    shared_fc2_ = row(p + "mlp.shared_experts.linear_fc2.weight", S);
  }
}

TransformerLayer::~TransformerLayer() = default;

std::vector<Parameter*> TransformerLayer::parameters() {
  std::vector<Parameter*> out{&input_norm_};
  if (qkv_.value) out.push_back(&qkv_);
  mla_.append_parameters(out);
  out.insert(out.end(), {&proj_, &mlp_norm_});
  if (q_norm_.value) out.insert(out.end(), {&q_norm_, &k_norm_});
  if (router_.value) out.push_back(&router_);
  out.push_back(&fc1_);
  out.push_back(&fc2_);
  if (shared_fc1_.value) {
    out.push_back(&shared_fc1_);
    out.push_back(&shared_fc2_);
  }
  return out;
}

std::unique_ptr<LayerPlan> TransformerLayer::plan(ExecContext& ctx, Event* plan_event,
                                                  int microbatch, std::int64_t batch,
                                                  std::int64_t seq, double loss_scale) {
  return std::make_unique<LayerPlan>(*this, ctx, plan_event, microbatch, batch, seq, loss_scale);
}

LayerPlan::LayerPlan(TransformerLayer& layer, ExecContext& ctx, Event* plan_event, int microbatch,
                     std::int64_t batch, std::int64_t seq, double loss_scale)
    : L_(layer),
      ctx_(ctx),
      st_(std::make_unique<State>(ctx.hooks, layer.layer(), microbatch)),
      stats_(std::make_shared<RouterStats>()) {
  st_->batch = batch;
  st_->seq = seq;
  st_->loss_scale = loss_scale;
  st_->cfg = &L_.cfg_;
  st_->cp_rank = L_.cp_.rank;
  const ModelConfig& c = layer.config();
  const std::string n = layer.layer() >= c.num_layers
                            ? "mtp" + std::to_string(layer.layer() - c.num_layers) + "."
                            : "layer" + std::to_string(layer.layer()) + ".";
  pre_dispatch = ScheduleNode(
      n + "pre_dispatch", StreamKind::Compute, &ctx, plan_event,
      [this](Stream& s) { pre_dispatch_forward(s); },
      [this](Stream& s) { pre_dispatch_backward(s); }, [this](Stream& s) { pre_dispatch_dw(s); });
  mlp = ScheduleNode(
      n + "mlp", StreamKind::Compute, &ctx, plan_event, [this](Stream& s) { mlp_forward(s); },
      [this](Stream& s) { mlp_backward(s); }, [this](Stream& s) { mlp_dw(s); });
  if (L_.is_moe()) {
    st_->dispatch = L_.dispatcher_->plan(st_->local_tokens(), seq, microbatch);
    dispatch = ScheduleNode(
        n + "dispatch", StreamKind::Comm, &ctx, plan_event,
        [this](Stream& s) {
          detail::GraphRegions graph(s);
          graph.enter(ctx_.graphs.moe);
          st_->dispatch->dispatch(at_(s));
          // Megatron launches the shared experts right after the tokens' all-to-all.
          if (overlap_shared()) shared_experts_forward(ctx_.shared_experts);
        },
        [this](Stream& s) {
          detail::GraphRegions graph(s);
          graph.enter(ctx_.graphs.moe);
          st_->dispatch->dispatch_backward(at_(s));
        });
    combine = ScheduleNode(
        n + "combine", StreamKind::Comm, &ctx, plan_event,
        [this](Stream& s) { combine_forward(s); }, [this](Stream& s) { combine_backward(s); });
  }
}

LayerPlan::~LayerPlan() = default;

void LayerPlan::connect(const Tensor* input, const Tensor* grad_output) {
  st_->input = input;
  st_->grad_output = grad_output;
}

void LayerPlan::pre_dispatch_forward(Stream& s) {
  const ModelConfig& c = L_.cfg_;
  State& st = *st_;
  ops::At at = at_(s);
  SavedTensors& sv = st.saved;
  const RecomputeSet& re = ctx_.recompute;
  if (prologue.forward) prologue.forward(s);
  if (!st.input || !*st.input)
    throw UsageError("layer " + std::to_string(L_.layer_) +
                     ": pre_dispatch forward before its input exists");
  const Tensor x = *st.input;
  const GraphScopes& gs = ctx_.graphs;
  detail::GraphRegions graph(s);
  graph.enter(gs.attn);
  Tensor ln1, rstd1, qkv, ctx, lse;
  // attn_norm's group commits after self_attn_bda, which still reads x (transformer_layer.py).
  sv.start_module("attn_norm", s);
  ops::rmsnorm_forward(at, "input_layernorm", x, L_.input_norm_, c.layernorm_epsilon, ln1, rstd1);
  sv.save("attn_norm", "input", x, s);
  sv.save("attn_norm", "rstd", rstd1, s);
  {
    ModuleScope m(sv, "qkv_linear", s);
    if (L_.mla_.on()) {
      qkv = L_.mla_.forward(at, ln1, st.attn(), &sv, "qkv_linear", re.mla_up_proj);
    } else {
      const Tensor in = gathered(at, ln1, "sp_allgather_qkv");
      qkv = ops::linear_forward(at, "linear_qkv", in, L_.qkv_.value, ops::one_group(in), c.dtype);
      ops::qkv_split_forward(at, "linear_qkv", st.attn(), c.dtype);
    }
    if (L_.q_norm_.value) {
      // SelfAttention.get_query_key_value_tensors: q_layernorm and k_layernorm after the split,
      // before RoPE; their input is kept for backward.
      Tensor rstd;
      const Tensor raw = qkv;
      qkv = ops::qk_norm_forward(at, raw, L_.q_norm_, L_.k_norm_, st.attn(), c.layernorm_epsilon,
                                 rstd);
      sv.save("qkv_linear", "qk_norm_input", raw, s);
      sv.save("qkv_linear", "qk_norm_rstd", rstd, s);
    }
    ops::rope(at, "rotary_pos_emb", qkv, st.attn(), c.rope(), false);
    if (!re.input_norm) sv.save("qkv_linear", "input", ln1, s);
  }
  {
    ModuleScope m(sv, "core_attn", s);
    Tensor probs;
    core_attention_forward(at, qkv, ctx, lse, probs);
    if (!re.qkv && !up_recomputed()) sv.save("core_attn", "input", qkv, s);
    if (!re.attn_stats) sv.save("core_attn", "lse", lse, s);
    // The unfused core attention keeps its softmax probabilities for backward.
    if (probs && !re.attn_stats) sv.save("core_attn", "probs", probs, s);
  }
  Tensor attn_out;
  {
    ModuleScope m(sv, "attn_proj", s);
    attn_out = scattered(
        at,
        ops::linear_forward(at, "linear_proj", ctx, L_.proj_.value, ops::one_group(ctx), c.dtype),
        "sp_reducescatter_proj");
    // Also core_attn's output, for its backward.
    if (!re.attn_out) sv.save("attn_proj", "input", ctx, s);
  }
  st.h = ops::add(at, "attn_residual_add", x, attn_out);
  sv.end_module("attn_norm", s);
  graph.enter(L_.is_moe() ? gs.moe || gs.moe_router : gs.mlp);
  Tensor ln2, rstd2;
  // The mlp_norm group commits after the MLP's residual add: in the combine node for a MoE layer
  // (fine_grained_callables.py delays the mlp norm's offload until after mlp_bda).
  sv.start_module("mlp_norm", s);
  ops::rmsnorm_forward(at, "pre_mlp_layernorm", st.h, L_.mlp_norm_, c.layernorm_epsilon, ln2,
                       rstd2);
  sv.save("mlp_norm", "input", st.h, s);
  sv.save("mlp_norm", "rstd", rstd2, s);
  if (!L_.is_moe()) {
    st.dense_in = ln2;
    return;
  }

  if (L_.shared_fc1_.value) st.shared_in = ln2;
  if (overlap_shared())
    s.record(st.shared_ready);
  else
    shared_experts_forward(s);
  {
    ModuleScope m(sv, "router", s);
    Tensor logits = ops::linear_forward(router_at(s), "router_gating", ln2, L_.router_.value,
                                        ops::one_group(ln2), DType::F32);
    st.dispatch->io.hidden = ln2;
    route_tokens(s, logits, st.local_tokens());
    sv.save("router", "logits", logits, s);
    // The router's input, read again by its wgrad and the shared experts' (the tensor
    // LoongForge's offload_tensors calls pre_mlp_layernorm_output).
    if (!ctx_.recompute.mlp_norm) sv.save("router", "pre_mlp_layernorm_output", ln2, s);
  }
  graph.enter(gs.moe || gs.moe_preprocess);
  st.dispatch->copy_counts_at_dispatch = gs.moe_preprocess;
  st.dispatch->preprocess(at);
}

void LayerPlan::mlp_forward(Stream& s) {
  const ModelConfig& c = L_.cfg_;
  State& st = *st_;
  ops::At at = at_(s);
  SavedTensors& sv = st.saved;
  const bool moe = L_.is_moe();
  detail::GraphRegions graph(s);
  graph.enter(moe ? ctx_.graphs.moe : ctx_.graphs.mlp);
  Tensor in, probs, ln2;
  ops::Rows rows;
  if (moe) {
    st.dispatch->sort(at);
    in = st.dispatch->io.expert_in;
    probs = st.dispatch->io.expert_probs;
    rows = st.dispatch->io.rows_per_expert;
  } else {
    ln2 = st.dense_in;
    st.dense_in = Tensor();
  }
  const char* fc1 = moe ? "expert_fc1" : "dense_fc1";
  const char* act = moe ? "moe_act" : "dense_act";
  const char* fc2 = moe ? "expert_fc2" : "dense_fc2";
  Tensor h1, a, y;
  {
    ModuleScope m(sv, fc1, s);
    if (!moe) {
      in = gathered(at, ln2, "sp_allgather_fc1");
      rows = ops::one_group(in);
    }
    h1 = ops::linear_forward(at, fc1, in, L_.fc1_, rows, c.dtype);
    // The experts' input is the dispatched tokens (LoongForge's dispatched_input); a dense
    // MLP's is the pre-MLP norm's output (this rank's tokens: TP gathers it again).
    if (moe)
      sv.save(fc1, "dispatched_input", in, s);
    else if (!ctx_.recompute.mlp_norm)
      sv.save(fc1, "pre_mlp_layernorm_output", ln2, s);
  }
  {
    ModuleScope m(sv, act, s);
    a = ops::swiglu_forward(at, act, h1, probs, rows);
    if (!re_fc1()) sv.save(act, "input", h1, s);
    if (moe) sv.save(act, "probs", probs, s);
  }
  {
    ModuleScope m(sv, fc2, s);
    y = ops::linear_forward(at, fc2, a, L_.fc2_, rows, c.dtype);
    if (!re_act()) sv.save(fc2, "input", a, s);
  }
  if (moe) {
    st.dispatch->io.expert_in = st.dispatch->io.expert_probs = Tensor();
    st.dispatch->io.expert_out = y;
    st.dispatch->unsort(at);
    st.dispatch->io.expert_out = Tensor();
    return;
  }
  output = ops::add(at, "mlp_residual_add", scattered(at, y, "sp_reducescatter_fc2"), st.h);
  st.saved.end_module("mlp_norm", s);
  st.h = Tensor();
}

bool LayerPlan::overlap_shared() const {
  return ctx_.shared_expert_overlap && L_.shared_fc1_.value;
}

// The shared experts' forward on `s`: the compute stream, or the side stream once the pre-MLP
// norm's output is ready.
void LayerPlan::shared_experts_forward(Stream& s) {
  if (!L_.shared_fc1_.value) return;
  const ModelConfig& c = L_.cfg_;
  State& st = *st_;
  ops::At at = at_(s);
  SavedTensors& sv = st.saved;
  if (overlap_shared()) s.wait(st.shared_ready);
  ModuleScope m(sv, "shared_experts", s);
  const Tensor ln2 = gathered(at, st.shared_in, "sp_allgather_shared_fc1");
  st.shared_in = Tensor();
  Tensor f1 = ops::linear_forward(at, "shared_fc1", ln2, L_.shared_fc1_.value, ops::one_group(ln2),
                                  c.dtype);
  Tensor a = ops::swiglu_forward(at, "shared_act", f1, Tensor());
  st.shared_out = scattered(
      at,
      ops::linear_forward(at, "shared_fc2", a, L_.shared_fc2_.value, ops::one_group(a), c.dtype),
      "sp_reducescatter_shared_fc2");
  if (!ctx_.recompute.shared) {
    sv.save("shared_experts", "fc1_output", f1, s);
    sv.save("shared_experts", "act_output", a, s);
  }
  if (overlap_shared()) s.record(st.shared_done);
}

void LayerPlan::combine_forward(Stream& s) {
  State& st = *st_;
  ops::At at = at_(s);
  detail::GraphRegions graph(s);
  graph.enter(ctx_.graphs.moe);
  st.dispatch->combine(at);
  if (overlap_shared()) s.wait(st.shared_done);
  // Megatron's combine node also adds the shared experts' output and the residual.
  output = ops::add3(at, "moe_output_residual_add", st.dispatch->io.moe_out,
                     st.shared_out ? st.shared_out : st.h, st.shared_out ? st.h : Tensor(),
                     L_.cfg_.dtype);
  st.dispatch->io.moe_out = Tensor();
  st.saved.end_module("mlp_norm", s);
  st.shared_out = st.h = Tensor();
  if (st.dispatch->frees_dispatch_input()) st.dispatch->io.hidden = Tensor();
}

Tensor LayerPlan::gathered(ops::At at, const Tensor& x, const char* name) const {
  return L_.tp_.on() ? gather_tokens(at, L_.tp_, x, name) : x;
}

Tensor LayerPlan::scattered(ops::At at, const Tensor& x, const char* name) const {
  return L_.tp_.on() ? scatter_tokens(at, L_.tp_, x, name) : x;
}

ops::At LayerPlan::at_(Stream& s) const {
  ops::At at{s, ctx_.tally, nullptr, &L_.cfg_.kernels};
  at.weights_generation = ctx_.weights_generation;
  return at;
}

ops::At LayerPlan::router_at(Stream& s) const {
  ops::At at = at_(s);
  at.fp32_gemms = L_.cfg_.kernels.router_fp32;
  return at;
}

}  // namespace nodeemu::layers
