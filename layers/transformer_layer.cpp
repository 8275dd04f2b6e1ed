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

std::string prefix(int layer) {
  return "decoder.layers." + std::to_string(layer) + ".";
}

}  // namespace

TransformerLayer::TransformerLayer(const ModelConfig& cfg, int layer, Device& device,
                                   std::uint64_t seed, Group ep, int rank)
    : cfg_(cfg), layer_(layer) {
  cfg.validate();
  if (cfg.is_moe_layer(layer))
    dispatcher_ = TokenDispatcher::create(cfg, ep, device.node().mode(), rank, layer);
  make_parameters(device, seed);
}

TransformerLayer::TransformerLayer(const ModelConfig& cfg, int layer, Device& device,
                                   std::uint64_t seed, std::unique_ptr<TokenDispatcher> dispatcher)
    : cfg_(cfg), layer_(layer), dispatcher_(std::move(dispatcher)) {
  cfg.validate();
  if (cfg.is_moe_layer(layer) != static_cast<bool>(dispatcher_))
    throw UsageError("layer " + std::to_string(layer) +
                     ": a MoE layer needs a dispatcher and a dense layer none");
  make_parameters(device, seed);
}

void TransformerLayer::make_parameters(Device& device, std::uint64_t seed) {
  const ModelConfig& cfg = cfg_;
  const std::string p = prefix(layer_);
  const std::int64_t H = cfg.hidden_size, d = cfg.head_dim();
  const std::int64_t qkv_out = (cfg.num_attention_heads + 2 * cfg.num_query_groups) * d;
  const double sd = cfg.init_method_std;
  const DType dt = cfg.dtype;
  input_norm_ = make_parameter(device, p + "input_layernorm.weight", {H}, dt, Init::Ones, 0, seed);
  qkv_ = make_parameter(device, p + "self_attention.linear_qkv.weight", {qkv_out, H}, dt,
                        Init::Normal, sd, seed);
  proj_ = make_parameter(device, p + "self_attention.linear_proj.weight",
                         {H, cfg.num_attention_heads * d}, dt, Init::Normal, sd, seed);
  mlp_norm_ = make_parameter(device, p + "pre_mlp_layernorm.weight", {H}, dt, Init::Ones, 0, seed);
  if (cfg.qk_layernorm) {
    q_norm_ = make_parameter(device, p + "self_attention.q_layernorm.weight", {d}, dt, Init::Ones,
                             0, seed);
    k_norm_ = make_parameter(device, p + "self_attention.k_layernorm.weight", {d}, dt, Init::Ones,
                             0, seed);
  }
  if (!dispatcher_) {
    const std::int64_t F = cfg.ffn_hidden_size;
    fc1_ =
        make_parameter(device, p + "mlp.linear_fc1.weight", {2 * F, H}, dt, Init::Normal, sd, seed);
    fc2_ = make_parameter(device, p + "mlp.linear_fc2.weight", {H, F}, dt, Init::Normal, sd, seed);
    return;
  }
  const std::int64_t E = cfg.num_moe_experts, F = cfg.moe_ffn_hidden_size;
  const std::int64_t local = dispatcher_->local_experts(), first = dispatcher_->first_expert();
  router_ =
      make_parameter(device, p + "mlp.router.weight", {E, H}, DType::F32, Init::Normal, sd, seed);
  if (cfg.router.enable_expert_bias) expert_bias_ = Tensor::empty(device, {E}, DType::F32);
  // Expert e's weights are drawn at offset e * per-expert elements of one stream per name, so
  // they do not depend on how the experts are sharded.
  fc1_ = make_parameter(device, p + "mlp.experts.linear_fc1.weight", {local, 2 * F, H}, dt,
                        Init::Normal, sd, seed, first * 2 * F * H, true);
  fc2_ = make_parameter(device, p + "mlp.experts.linear_fc2.weight", {local, H, F}, dt,
                        Init::Normal, sd, seed, first * H * F, true);
  if (cfg.moe_shared_expert_intermediate_size > 0) {
    const std::int64_t S = cfg.moe_shared_expert_intermediate_size;
    shared_fc1_ = make_parameter(device, p + "mlp.shared_experts.linear_fc1.weight", {2 * S, H}, dt,
                                 Init::Normal, sd, seed);
    shared_fc2_ = make_parameter(device, p + "mlp.shared_experts.linear_fc2.weight", {H, S}, dt,
                                 Init::Normal, sd, seed);
  }
}

TransformerLayer::~TransformerLayer() = default;

std::vector<Parameter*> TransformerLayer::parameters() {
  std::vector<Parameter*> out{&input_norm_, &qkv_, &proj_, &mlp_norm_};
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
  const std::string n = "layer" + std::to_string(layer.layer()) + ".";
  pre_dispatch = ScheduleNode(
      n + "pre_dispatch", StreamKind::Compute, &ctx, plan_event,
      [this](Stream& s) { pre_dispatch_forward(s); },
      [this](Stream& s) { pre_dispatch_backward(s); }, [this](Stream& s) { pre_dispatch_dw(s); });
  mlp = ScheduleNode(
      n + "mlp", StreamKind::Compute, &ctx, plan_event, [this](Stream& s) { mlp_forward(s); },
      [this](Stream& s) { mlp_backward(s); }, [this](Stream& s) { mlp_dw(s); });
  if (L_.is_moe()) {
    st_->dispatch = L_.dispatcher_->plan(batch * seq, seq, microbatch);
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
    qkv = ops::linear_forward(at, "linear_qkv", ln1, L_.qkv_.value, ops::one_group(ln1), c.dtype);
    if (c.qk_layernorm) {
      // SelfAttention.get_query_key_value_tensors: q_layernorm and k_layernorm after the split,
      // before RoPE; their input is kept for backward.
      Tensor rstd;
      const Tensor raw = qkv;
      qkv = ops::qk_norm_forward(at, raw, L_.q_norm_, L_.k_norm_, st.attn(), c.layernorm_epsilon,
                                 rstd);
      sv.save("qkv_linear", "qk_norm_input", raw, s);
      sv.save("qkv_linear", "qk_norm_rstd", rstd, s);
    }
    ops::rope(at, "rotary_pos_emb", qkv, st.attn(), c.rotary_base, false);
    if (!re.input_norm) sv.save("qkv_linear", "input", ln1, s);
  }
  {
    ModuleScope m(sv, "core_attn", s);
    Tensor probs;
    ops::attention_forward(at, qkv, st.attn(), ctx, lse, probs);
    if (!re.qkv) sv.save("core_attn", "input", qkv, s);
    if (!re.attn_stats) sv.save("core_attn", "lse", lse, s);
    // The unfused core attention keeps its softmax probabilities for backward.
    if (probs && !re.attn_stats) sv.save("core_attn", "probs", probs, s);
  }
  Tensor attn_out;
  {
    ModuleScope m(sv, "attn_proj", s);
    attn_out =
        ops::linear_forward(at, "linear_proj", ctx, L_.proj_.value, ops::one_group(ctx), c.dtype);
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
    const std::int64_t T = st.batch * st.seq, E = c.num_moe_experts, k = c.router.topk;
    Tensor logits = ops::linear_forward(router_at(s), "router_gating", ln2, L_.router_.value,
                                        ops::one_group(ln2), DType::F32);
    MoeTokens& io = st.dispatch->io;
    io.hidden = ln2;
    io.topk_idx = at.empty({T, k}, DType::I64);
    io.topk_probs = at.empty({T, k}, DType::F32);
    io.tokens_per_expert = at.empty({E}, DType::I64);
    st.routing = std::make_shared<Routing<float>>();
    View vl = view(logits), vb = L_.expert_bias_ ? view(L_.expert_bias_) : View{},
         vi = view(io.topk_idx), vp = view(io.topk_probs), vc = view(io.tokens_per_expert);
    auto routing = st.routing;
    auto stats = stats_;
    const RouterConfig rc = c.router;
    const std::int64_t seq = st.seq;
    launch(
        s, "router_topk",
        // The measured router series is keyed by its fp32 logits (profile.yaml memory_ops).
        Work{.flops = 12.0 * double(T * E),
             .bytes = double(logits.bytes()),
             .precision = Precision::FP32,
             .shape = KernelShape::memory(MemoryOp::Router)},
        [=] {
          *routing = route(rc, vl.as<const float>(), T, seq, vb.as<const float>());
          std::copy(routing->idx.begin(), routing->idx.end(), vi.as<std::int64_t>());
          std::copy(routing->probs.begin(), routing->probs.end(), vp.as<float>());
          std::copy(routing->tokens_per_expert.begin(), routing->tokens_per_expert.end(),
                    vc.as<std::int64_t>());
          stats->aux_loss = routing->aux_loss;
          stats->seq_aux_loss = routing->seq_aux_loss;
          stats->z_loss = routing->z_loss;
          stats->tokens_per_expert = routing->tokens_per_expert;
        },
        {logits, L_.expert_bias_, io.topk_idx, io.topk_probs, io.tokens_per_expert}, ctx_.tally);
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
  Tensor in, probs;
  ops::Rows rows;
  if (moe) {
    st.dispatch->sort(at);
    in = st.dispatch->io.expert_in;
    probs = st.dispatch->io.expert_probs;
    rows = st.dispatch->io.rows_per_expert;
  } else {
    in = st.dense_in;
    st.dense_in = Tensor();
    rows = ops::one_group(in);
  }
  const char* fc1 = moe ? "expert_fc1" : "dense_fc1";
  const char* act = moe ? "moe_act" : "dense_act";
  const char* fc2 = moe ? "expert_fc2" : "dense_fc2";
  Tensor h1, a, y;
  {
    ModuleScope m(sv, fc1, s);
    h1 = ops::linear_forward(at, fc1, in, L_.fc1_.value, rows, c.dtype);
    // The experts' input is the dispatched tokens (LoongForge's dispatched_input); a dense
    // MLP's is the pre-MLP norm's output.
    if (moe)
      sv.save(fc1, "dispatched_input", in, s);
    else if (!ctx_.recompute.mlp_norm)
      sv.save(fc1, "pre_mlp_layernorm_output", in, s);
  }
  {
    ModuleScope m(sv, act, s);
    a = ops::swiglu_forward(at, act, h1, probs, rows);
    if (!re_fc1()) sv.save(act, "input", h1, s);
    if (moe) sv.save(act, "probs", probs, s);
  }
  {
    ModuleScope m(sv, fc2, s);
    y = ops::linear_forward(at, fc2, a, L_.fc2_.value, rows, c.dtype);
    if (!re_act()) sv.save(fc2, "input", a, s);
  }
  if (moe) {
    st.dispatch->io.expert_in = st.dispatch->io.expert_probs = Tensor();
    st.dispatch->io.expert_out = y;
    st.dispatch->unsort(at);
    st.dispatch->io.expert_out = Tensor();
    return;
  }
  output = ops::add(at, "mlp_residual_add", y, st.h);
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
  const Tensor ln2 = st.shared_in;
  st.shared_in = Tensor();
  Tensor f1 = ops::linear_forward(at, "shared_fc1", ln2, L_.shared_fc1_.value, ops::one_group(ln2),
                                  c.dtype);
  Tensor a = ops::swiglu_forward(at, "shared_act", f1, Tensor());
  st.shared_out =
      ops::linear_forward(at, "shared_fc2", a, L_.shared_fc2_.value, ops::one_group(a), c.dtype);
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

ops::At LayerPlan::at_(Stream& s) const {
  return ops::At{s, ctx_.tally, nullptr, &L_.cfg_.kernels};
}

ops::At LayerPlan::router_at(Stream& s) const {
  ops::At at = at_(s);
  at.fp32_gemms = L_.cfg_.kernels.router_fp32;
  return at;
}

}  // namespace nodeemu::layers
