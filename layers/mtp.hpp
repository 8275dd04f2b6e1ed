// Multi-token prediction, one layer (DeepSeek-V3's MTP 1), as Megatron-Core builds it
// (transformer/multi_token_prediction.py, MultiTokenPredictionLayer and process_mtp_loss;
// REFERENCE: the layer sits after the decoder on the last pipeline stage):
//
//   input ids rolled left by one per sequence (roll_tensor: the vacated last slot is 0) ->
//   the model's word embedding (a copy on the last stage, tied to the first stage's) -> enorm;
//   the decoder's output after its final layernorm -> hnorm; eh_proj([enorm | hnorm]) 2H -> H,
//   column-parallel, its output gathered along the features and split back to the token split;
//   one transformer layer with the decoder's last layer's spec (MoE for DeepSeek-V3); the MTP
//   layer's own final_layernorm; the shared output layer; cross-entropy against the labels
//   rolled left by one, the vacated position masked out.
//
// Its loss is mtp_loss_scaling_factor / mtp_num_layers times the masked token mean of the
// micro-batch, and its gradient joins the main loss's with the same backward scale
// (MTPLossAutoScaler: main_loss_backward_scale); like Megatron, NodeEmu reports it apart from the
// LM loss. In the schedule the MTP layer is one more layer of the last chunk: its embedding,
// norms and eh_proj run inside its pre_dispatch node, its final norm in its `mtp` node (Megatron's
// mtp_post_process), and the logits and loss in the chunk's loss node.
#pragma once
#include <memory>
#include <vector>

#include "layers/ops.hpp"
#include "layers/parameter.hpp"
#include "layers/tensor_parallel.hpp"
#include "layers/transformer_layer.hpp"
#include "layers/vocab_parallel.hpp"

namespace nodeemu::layers {

struct MicroBatch;

// The weights of one MTP layer besides its transformer layer.
struct MtpWeights {
  MtpWeights() = default;
  MtpWeights(const ModelConfig& c, Device& device, std::uint64_t seed, const TensorParallel& tp);
  std::vector<Parameter*> parameters();
  Parameter enorm, hnorm, eh_proj, final_norm;
};

// What the MTP layer reads from its chunk: the decoder's final norm and output layer, the word
// embedding (the chunk's own on a one-stage pipeline, else the last stage's copy) and the TP group.
struct MtpChunkParts {
  Parameter* decoder_final_norm = nullptr;
  Parameter* embedding = nullptr;
  Parameter* output = nullptr;
  TensorParallel tp;
};

// One micro-batch through the MTP layer. Installs its prologue and mtp node on `layer` (the
// chunk's last layer plan) and connects it; the chunk's loss node calls loss_*.
class MtpPlan {
 public:
  MtpPlan(const ModelConfig& c, MtpWeights& w, MtpChunkParts parts, LayerPlan& layer,
          ExecContext& ctx, Event* event, const MicroBatch& data, const Tensor* decoder_out,
          Tensor* decoder_grad, double loss_scale);
  // The decoder's final norm output (this rank's tokens), for the main output layer: computed
  // by the prologue's forward.
  const Tensor& final_norm_out() const { return lnf_; }
  // The loss node's share: the MTP logits and cross-entropy; their backward from the main
  // output layer's gradient of the final norm output; the output layer's wgrad for them.
  void loss_forward(ops::At at);
  void loss_backward(ops::At at, const Tensor& g_lnf_main);
  void loss_dw(ops::At at);
  // The MTP loss term of the objective (scaled as its gradient is), once the kernel has run.
  double loss_term() const { return *loss_sum_ * grad_scale_; }
  std::shared_ptr<const double> loss_sum_handle() const { return loss_sum_; }

 private:
  void prologue_forward(Stream& s);
  void prologue_backward(Stream& s);
  void prologue_dw(Stream& s);
  ops::At at_(Stream& s) const { return ops::At{s, ctx_.tally, nullptr, &c_.kernels}; }
  const ModelConfig& c_;
  MtpWeights& w_;
  MtpChunkParts parts_;
  LayerPlan& layer_;
  ExecContext& ctx_;
  const Tensor* decoder_out_;
  Tensor* decoder_grad_;
  double grad_scale_;       // the MTP cross-entropy's per-token gradient scale
  Tensor tokens_, labels_;  // rolled
  Tensor hidden_, rstd_f_, lnf_, emb_, rstd_e_, rstd_h_, cat_, input_;
  Tensor out_, rstd_m_, logits_, out_all_;
  CrossEntropySaved ce_;
  Tensor g_lnf_main_, g_out_, g_logits_, g_layer_out_, g_y_, g_cat_, g_emb_all_, g_lnf_, g_en_,
      g_hn_;
  std::shared_ptr<double> loss_sum_ = std::make_shared<double>(0);
};

}  // namespace nodeemu::layers
