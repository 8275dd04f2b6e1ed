#include "layers/mla.hpp"

#include "devices/errors.hpp"

namespace nodeemu::layers {

MultiLatentAttention::MultiLatentAttention(const ModelConfig& c, Device& device, std::uint64_t seed,
                                           const std::string& prefix, const TensorParallel& tp)
    : q_lora_(c.q_lora_rank),
      kv_lora_(c.kv_lora_rank),
      pe_(c.qk_pos_emb_head_dim),
      norms_(c.qk_layernorm),
      eps_(c.layernorm_epsilon),
      dtype_(c.dtype),
      tp_(tp) {
  const std::int64_t H = c.hidden_size, heads = c.num_attention_heads, d = c.head_dim();
  const std::int64_t up_kv = heads * (c.qk_head_dim + c.v_head_dim), t = tp.size;
  const double sd = c.init_method_std;
  const std::string p = prefix + "self_attention.";
  // Duplicated on every TP rank, run on this rank's tokens: gradients all-reduced over TP.
  auto whole = [&](std::string name, Shape shape, Init init, double std) {
    Parameter w =
        make_parameter(device, std::move(name), std::move(shape), c.dtype, init, std, seed);
    w.sequence_parallel = tp.on();
    return w;
  };
  // Column-parallel over heads: each head's block of rows is contiguous, so one segment.
  auto column = [&](std::string name, std::int64_t out, std::int64_t in) {
    return make_parameter(device, std::move(name), {out / t, in}, c.dtype, Init::Normal, sd, seed,
                          column_shard({out}, in, tp));
  };
  if (q_lora_ > 0) {
    q_down_ = whole(p + "linear_q_down_proj.weight", {q_lora_, H}, Init::Normal, sd);
    if (norms_) q_norm_ = whole(p + "linear_q_up_proj.layer_norm_weight", {q_lora_}, Init::Ones, 0);
    q_up_ = column(p + "linear_q_up_proj.weight", heads * d, q_lora_);
  } else {
    q_up_ = column(p + "linear_q_proj.weight", heads * d, H);
  }
  kv_down_ = whole(p + "linear_kv_down_proj.weight", {kv_lora_ + pe_, H}, Init::Normal, sd);
  if (norms_)
    kv_norm_ = whole(p + "linear_kv_up_proj.layer_norm_weight", {kv_lora_}, Init::Ones, 0);
  kv_up_ = column(p + "linear_kv_up_proj.weight", up_kv, kv_lora_);
}

void MultiLatentAttention::append_parameters(std::vector<Parameter*>& out) {
  for (Parameter* w : {&q_down_, &q_norm_, &q_up_, &kv_down_, &kv_norm_, &kv_up_})
    if (w->value) out.push_back(w);
}

Tensor MultiLatentAttention::gathered(ops::At at, const Tensor& x, const char* name) const {
  return tp_.on() ? gather_tokens(at, tp_, x, name) : x;
}

Tensor MultiLatentAttention::scattered(ops::At at, const Tensor& x, const char* name) const {
  return tp_.on() ? scatter_tokens(at, tp_, x, name) : x;
}

Tensor MultiLatentAttention::up_input(ops::At at, const Tensor& latent, const char* norm_name,
                                      const Parameter& norm, Tensor& normed, Tensor& rstd,
                                      const char* name) const {
  if (norms_)
    ops::rmsnorm_forward(at, norm_name, latent, norm, eps_, normed, rstd);
  else
    normed = latent;
  return gathered(at, normed, name);
}

Tensor MultiLatentAttention::forward(ops::At at, const Tensor& ln1,
                                     const kernels::AttentionShape& s, SavedTensors* saved,
                                     const char* module, bool up_recomputed) {
  Stream& st = at.stream;
  auto keep = [&](const char* name, const Tensor& t) {
    if (saved && t) saved->save(module, name, t, st);
  };
  // The norms' outputs feed the up projections' wgrad; the recompute makes them again.
  auto keep_normed = [&](const char* name, const Tensor& t) {
    if (!up_recomputed) keep(name, t);
  };
  Tensor q;
  if (q_lora_ > 0) {
    const Tensor latent = ops::linear_forward(at, "linear_q_down_proj", ln1, q_down_.value,
                                              ops::one_group(ln1), dtype_);
    Tensor normed, rstd;
    const Tensor in =
        up_input(at, latent, "q_layernorm", q_norm_, normed, rstd, "sp_allgather_q_up");
    q = ops::linear_forward(at, "linear_q_up_proj", in, q_up_.value, ops::one_group(in), dtype_);
    keep("q_latent", latent);
    if (norms_) {
      keep("q_rstd", rstd);
      keep_normed("q_normed", normed);
    }
  } else {
    const Tensor in = gathered(at, ln1, "sp_allgather_q_proj");
    q = ops::linear_forward(at, "linear_q_proj", in, q_up_.value, ops::one_group(in), dtype_);
  }
  const Tensor down = ops::linear_forward(at, "linear_kv_down_proj", ln1, kv_down_.value,
                                          ops::one_group(ln1), dtype_);
  const std::vector<Tensor> parts = ops::split_columns(at, "kv_down_split", down, {kv_lora_, pe_});
  Tensor normed, rstd;
  const Tensor in =
      up_input(at, parts[0], "kv_layernorm", kv_norm_, normed, rstd, "sp_allgather_kv_up");
  const Tensor kv =
      ops::linear_forward(at, "linear_kv_up_proj", in, kv_up_.value, ops::one_group(in), dtype_);
  const Tensor k_pe = gathered(at, parts[1], "sp_allgather_k_pos_emb");
  keep("kv_latent", parts[0]);
  if (norms_) {
    keep("kv_rstd", rstd);
    keep_normed("kv_normed", normed);
  }
  if (up_recomputed) keep("k_pos_emb", parts[1]);
  return ops::mla_qkv(at, q, kv, k_pe, s);
}

Tensor MultiLatentAttention::recompute_up(ops::At at, const kernels::AttentionShape& s,
                                          SavedTensors& saved, const char* module, MlaGrads& g) {
  Stream& st = at.stream;
  Tensor q;
  if (q_lora_ > 0) {
    Tensor rstd;
    const Tensor in = up_input(at, saved.need(module, "q_latent", st), "q_layernorm", q_norm_,
                               g.re_q_normed, rstd, "sp_allgather_q_up");
    q = ops::linear_forward(at, "linear_q_up_proj", in, q_up_.value, ops::one_group(in), dtype_);
  } else {
    // Megatron's checkpoint covers the up projections; without query compression there is none.
    throw UsageError("recompute module mla_up_proj needs q_lora_rank > 0 (a query up projection)");
  }
  Tensor rstd;
  const Tensor in = up_input(at, saved.need(module, "kv_latent", st), "kv_layernorm", kv_norm_,
                             g.re_kv_normed, rstd, "sp_allgather_kv_up");
  const Tensor kv =
      ops::linear_forward(at, "linear_kv_up_proj", in, kv_up_.value, ops::one_group(in), dtype_);
  const Tensor k_pe = gathered(at, saved.need(module, "k_pos_emb", st), "sp_allgather_k_pos_emb");
  saved.release(module, "k_pos_emb");
  return ops::mla_qkv(at, q, kv, k_pe, s);
}

Tensor MultiLatentAttention::backward(ops::At at, const Tensor& g_qkv,
                                      const kernels::AttentionShape& s, SavedTensors& saved,
                                      const char* module, MlaGrads& g) {
  Stream& st = at.stream;
  Tensor dk_pe;
  ops::mla_qkv_backward(at, g_qkv, s, g.q_up_out, g.kv_up_out, dk_pe);
  // An up projection's input gradient is a partial sum over this rank's heads: reduce-scattered
  // back to this rank's tokens, then through the norm.
  auto latent_grad = [&](const char* up, const Parameter& w, const Tensor& g_out, const char* rs,
                         const char* norm, const Parameter& nw, const char* latent,
                         const char* rstd, Tensor& g_normed) {
    g_normed =
        scattered(at, ops::linear_dgrad(at, up, g_out, w.value, ops::one_group(g_out), dtype_), rs);
    if (!norms_) return g_normed;
    return ops::rmsnorm_dgrad(at, norm, g_normed, saved.need(module, latent, st), nw,
                              saved.need(module, rstd, st));
  };
  Tensor g_ln1_q;
  if (q_lora_ > 0) {
    g.q_latent = latent_grad("linear_q_up_proj", q_up_, g.q_up_out, "sp_reducescatter_q_up_bwd",
                             "q_layernorm", q_norm_, "q_latent", "q_rstd", g.q_normed);
    g_ln1_q = ops::linear_dgrad(at, "linear_q_down_proj", g.q_latent, q_down_.value,
                                ops::one_group(g.q_latent), dtype_);
  } else {
    g_ln1_q = scattered(at,
                        ops::linear_dgrad(at, "linear_q_proj", g.q_up_out, q_up_.value,
                                          ops::one_group(g.q_up_out), dtype_),
                        "sp_reducescatter_q_proj_bwd");
  }
  const Tensor g_kv_latent =
      latent_grad("linear_kv_up_proj", kv_up_, g.kv_up_out, "sp_reducescatter_kv_up_bwd",
                  "kv_layernorm", kv_norm_, "kv_latent", "kv_rstd", g.kv_normed);
  const Tensor g_pe = scattered(at, dk_pe, "sp_reducescatter_k_pos_emb_bwd");
  g.kv_down_out = ops::concat_columns(at, "kv_down_split_bwd", {g_kv_latent, g_pe});
  const Tensor g_ln1_kv = ops::linear_dgrad(at, "linear_kv_down_proj", g.kv_down_out,
                                            kv_down_.value, ops::one_group(g.kv_down_out), dtype_);
  return ops::add(at, "mla_input_grad_sum", g_ln1_q, g_ln1_kv);
}

void MultiLatentAttention::wgrad(ops::At at, const Tensor& ln1, SavedTensors& saved,
                                 const char* module, MlaGrads& g) {
  Stream& st = at.stream;
  // The up projections' input, gathered again (TE keeps this rank's share of the norm's output).
  auto up = [&](const char* name, Parameter& w, const Tensor& g_out, const char* input,
                const Tensor& recomputed, const char* ag) {
    const Tensor all = gathered(at, recomputed ? recomputed : saved.need(module, input, st), ag);
    ops::linear_wgrad(at, name, g_out, all, ops::one_group(all), w);
  };
  const char* q_in = norms_ ? "q_normed" : "q_latent";
  const char* kv_in = norms_ ? "kv_normed" : "kv_latent";
  if (q_lora_ > 0) {
    up("linear_q_up_proj", q_up_, g.q_up_out, q_in, g.re_q_normed, "sp_allgather_q_up_bwd");
    if (norms_)
      ops::rmsnorm_wgrad(at, "q_layernorm", g.q_normed, saved.need(module, "q_latent", st),
                         saved.need(module, "q_rstd", st), q_norm_);
    ops::linear_wgrad(at, "linear_q_down_proj", g.q_latent, ln1, ops::one_group(ln1), q_down_);
  } else {
    const Tensor all = gathered(at, ln1, "sp_allgather_q_proj_bwd");
    ops::linear_wgrad(at, "linear_q_proj", g.q_up_out, all, ops::one_group(all), q_up_);
  }
  up("linear_kv_up_proj", kv_up_, g.kv_up_out, kv_in, g.re_kv_normed, "sp_allgather_kv_up_bwd");
  if (norms_)
    ops::rmsnorm_wgrad(at, "kv_layernorm", g.kv_normed, saved.need(module, "kv_latent", st),
                       saved.need(module, "kv_rstd", st), kv_norm_);
  ops::linear_wgrad(at, "linear_kv_down_proj", g.kv_down_out, ln1, ops::one_group(ln1), kv_down_);
  for (const char* name :
       {"q_latent", "q_rstd", "q_normed", "kv_latent", "kv_rstd", "kv_normed", "k_pos_emb"})
    saved.release(module, name);
  g = MlaGrads{};
}

}  // namespace nodeemu::layers
