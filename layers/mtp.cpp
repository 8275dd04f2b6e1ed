#include "layers/mtp.hpp"

#include <cstring>

#include "devices/device.hpp"
#include "layers/kernels/vocab.hpp"
#include "layers/model_chunk.hpp"

namespace nodeemu::layers {

MtpWeights::MtpWeights(const ModelConfig& c, Device& device, std::uint64_t seed,
                       const TensorParallel& tp) {
  const std::int64_t H = c.hidden_size;
  const std::string p = "mtp.layers.0.";
  auto norm = [&](const std::string& name) {
    Parameter w = make_parameter(device, p + name, {H}, c.dtype, Init::Ones, 0, seed);
    w.sequence_parallel = tp.on();
    return w;
  };
  enorm = norm("enorm.weight");
  hnorm = norm("hnorm.weight");
  final_norm = norm("final_layernorm.weight");
  // Column-parallel over its H outputs (TEColumnParallelLinear, no bias), input [embedding |
  // hidden].
  eh_proj = make_parameter(device, p + "eh_proj.weight", {H / tp.size, 2 * H}, c.dtype,
                           Init::Normal, c.init_method_std, seed, column_shard({H}, 2 * H, tp));
}

std::vector<Parameter*> MtpWeights::parameters() {
  return {&enorm, &hnorm, &eh_proj, &final_norm};
}

namespace {

// roll_tensor(shifts=-1) along each sequence: position i takes i + 1, the last takes `fill`.
std::vector<std::int32_t> rolled(const std::vector<std::int32_t>& v, std::int64_t batch,
                                 std::int64_t seq, std::int32_t fill) {
  std::vector<std::int32_t> out(v.size());
  for (std::int64_t b = 0; b < batch; ++b) {
    for (std::int64_t i = 0; i + 1 < seq; ++i)
      out[std::size_t(b * seq + i)] = v[std::size_t(b * seq + i + 1)];
    out[std::size_t(b * seq + seq - 1)] = fill;
  }
  return out;
}

Tensor on_device(Device& dev, const std::vector<std::int32_t>& v) {
  Tensor t = Tensor::empty(dev, {std::int64_t(v.size())}, DType::I32);
  if (!t.is_meta()) std::memcpy(t.data<std::int32_t>(), v.data(), v.size() * 4);
  return t;
}

}  // namespace

MtpPlan::MtpPlan(const ModelConfig& c, MtpWeights& w, MtpChunkParts parts, LayerPlan& layer,
                 ExecContext& ctx, Event* event, const MicroBatch& data, const Tensor* decoder_out,
                 Tensor* decoder_grad, double loss_scale)
    : c_(c),
      w_(w),
      parts_(std::move(parts)),
      layer_(layer),
      ctx_(ctx),
      decoder_out_(decoder_out),
      decoder_grad_(decoder_grad) {
  Device& dev = ctx.compute.device();
  const std::int64_t T = data.batch * data.seq, valid = data.batch * (data.seq - 1);
  // process_mtp_loss: the masked token mean of the micro-batch, times the scaling factor over the
  // MTP depth, its gradient scaled as the main loss's (the main loss's per-token scale is
  // loss_scale, that of a mean over T tokens).
  grad_scale_ = valid > 0 ? loss_scale * double(T) / double(valid) * c.mtp_loss_scaling_factor /
                                double(c.mtp_num_layers)
                          : 0.0;
  tokens_ = on_device(dev, rolled(data.tokens, data.batch, data.seq, 0));
  labels_ = on_device(dev, rolled(data.labels, data.batch, data.seq, kernels::kIgnoreTarget));
  layer.connect(&input_, &g_layer_out_);
  layer.prologue = {[this](Stream& s) { prologue_forward(s); },
                    [this](Stream& s) { prologue_backward(s); },
                    [this](Stream& s) { prologue_dw(s); }};
  // mtp_post_process: the MTP layer's final norm. Its weight gradient runs with its dgrad (the
  // node has no separate wgrad step).
  layer.mtp = ScheduleNode(
      "mtp0.post_process", StreamKind::Compute, &ctx, event,
      [this](Stream& s) {
        ops::rmsnorm_forward(at_(s), "mtp_final_layernorm", layer_.output, w_.final_norm,
                             c_.layernorm_epsilon, out_, rstd_m_);
      },
      [this](Stream& s) {
        const ops::At at = at_(s);
        g_layer_out_ = ops::rmsnorm_dgrad(at, "mtp_final_layernorm", g_out_, layer_.output,
                                          w_.final_norm, rstd_m_);
        ops::rmsnorm_wgrad(at, "mtp_final_layernorm", g_out_, layer_.output, rstd_m_,
                           w_.final_norm);
        g_out_ = rstd_m_ = Tensor();
      });
}

void MtpPlan::prologue_forward(Stream& s) {
  const ops::At at = at_(s);
  const TensorParallel& tp = parts_.tp;
  const double eps = c_.layernorm_epsilon;
  // The decoder's final layernorm runs here: MTP reads its output (the main output layer too).
  hidden_ = *decoder_out_;
  ops::rmsnorm_forward(at, "final_layernorm", hidden_, *parts_.decoder_final_norm, eps, lnf_,
                       rstd_f_);
  emb_ = embedding_forward(at, tp, tokens_, *parts_.embedding, c_.dtype);
  Tensor e_n, h_n;
  ops::rmsnorm_forward(at, "mtp_enorm", emb_, w_.enorm, eps, e_n, rstd_e_);
  ops::rmsnorm_forward(at, "mtp_hnorm", lnf_, w_.hnorm, eps, h_n, rstd_h_);
  cat_ = ops::concat_columns(at, "mtp_concat", {e_n, h_n});
  const Tensor all = tp.on() ? gather_tokens(at, tp, cat_, "sp_allgather_mtp_eh_proj") : cat_;
  const Tensor y =
      ops::linear_forward(at, "mtp_eh_proj", all, w_.eh_proj.value, ops::one_group(all), c_.dtype);
  input_ = tp.on() ? features_to_tokens(at, tp, y, "tp_allgather_mtp_eh_proj") : y;
}

void MtpPlan::prologue_backward(Stream& s) {
  const ops::At at = at_(s);
  const TensorParallel& tp = parts_.tp;
  const Tensor g_in = layer_.grad_input;
  g_y_ = tp.on() ? tokens_to_features(at, tp, g_in, "sp_allgather_mtp_eh_proj_bwd") : g_in;
  Tensor g_cat =
      ops::linear_dgrad(at, "mtp_eh_proj", g_y_, w_.eh_proj.value, ops::one_group(g_y_), c_.dtype);
  if (tp.on()) g_cat = scatter_tokens(at, tp, g_cat, "sp_reducescatter_mtp_eh_proj_bwd");
  const std::int64_t H = c_.hidden_size;
  const std::vector<Tensor> g = ops::split_columns(at, "mtp_concat_bwd", g_cat, {H, H});
  g_en_ = g[0];
  g_hn_ = g[1];
  const Tensor g_emb = ops::rmsnorm_dgrad(at, "mtp_enorm", g_en_, emb_, w_.enorm, rstd_e_);
  const Tensor g_lnf_mtp = ops::rmsnorm_dgrad(at, "mtp_hnorm", g_hn_, lnf_, w_.hnorm, rstd_h_);
  g_emb_all_ = embedding_grad_all(at, tp, g_emb);
  // The final norm output's two gradients: the main output layer's and MTP's.
  g_lnf_ = ops::add(at, "final_layernorm_grad_sum", g_lnf_main_, g_lnf_mtp);
  g_lnf_main_ = Tensor();
  *decoder_grad_ = ops::rmsnorm_dgrad(at, "final_layernorm", g_lnf_, hidden_,
                                      *parts_.decoder_final_norm, rstd_f_);
}

void MtpPlan::prologue_dw(Stream& s) {
  const ops::At at = at_(s);
  const TensorParallel& tp = parts_.tp;
  // eh_proj's input, gathered again for its wgrad (Megatron keeps this rank's share).
  const Tensor all = tp.on() ? gather_tokens(at, tp, cat_, "sp_allgather_mtp_eh_proj_wgrad") : cat_;
  ops::linear_wgrad(at, "mtp_eh_proj", g_y_, all, ops::one_group(all), w_.eh_proj);
  ops::rmsnorm_wgrad(at, "mtp_enorm", g_en_, emb_, rstd_e_, w_.enorm);
  ops::rmsnorm_wgrad(at, "mtp_hnorm", g_hn_, lnf_, rstd_h_, w_.hnorm);
  embedding_wgrad(at, tp, tokens_, g_emb_all_, *parts_.embedding);
  ops::rmsnorm_wgrad(at, "final_layernorm", g_lnf_, hidden_, rstd_f_, *parts_.decoder_final_norm);
  g_y_ = g_en_ = g_hn_ = g_emb_all_ = g_lnf_ = Tensor();
  hidden_ = rstd_f_ = lnf_ = emb_ = rstd_e_ = rstd_h_ = cat_ = input_ = Tensor();
}

void MtpPlan::loss_forward(ops::At at) {
  const TensorParallel& tp = parts_.tp;
  out_all_ = tp.on() ? gather_tokens(at, tp, out_, "sp_allgather_mtp_output") : out_;
  logits_ = ops::linear_forward(at, "mtp_output_layer", out_all_, parts_.output->value,
                                ops::one_group(out_all_), DType::F32);
  cross_entropy_forward(at, tp, logits_, labels_, loss_sum_, ce_);
}

void MtpPlan::loss_backward(ops::At at, const Tensor& g_lnf_main) {
  const TensorParallel& tp = parts_.tp;
  g_lnf_main_ = g_lnf_main;
  g_logits_ = cross_entropy_backward(at, tp, logits_, labels_, ce_, grad_scale_);
  logits_ = Tensor();
  ce_ = {};
  g_out_ = ops::linear_dgrad(at, "mtp_output_layer", g_logits_, parts_.output->value,
                             ops::one_group(g_logits_), c_.dtype);
  if (tp.on()) g_out_ = scatter_tokens(at, tp, g_out_, "sp_reducescatter_mtp_output_bwd");
  out_ = Tensor();
}

void MtpPlan::loss_dw(ops::At at) {
  ops::linear_wgrad(at, "mtp_output_layer", g_logits_, out_all_, ops::one_group(out_all_),
                    *parts_.output);
  g_logits_ = out_all_ = Tensor();
}

}  // namespace nodeemu::layers
