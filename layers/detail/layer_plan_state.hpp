// Internal: the state of one layer's micro-batch plan, shared by transformer_layer.cpp (the
// nodes) and layer_recompute.cpp (selective recompute).
#pragma once
#include <memory>

#include "layers/router.hpp"
#include "layers/saved_tensors.hpp"
#include "layers/transformer_layer.hpp"

namespace nodeemu::layers {

// Everything one micro-batch of one layer carries between its nodes.
struct LayerPlan::State {
  State(ActivationHooks* hooks, int layer, int mb) : saved(hooks, layer, mb) {}
  std::int64_t batch = 0, seq = 0;  // seq: this CP rank's positions of each sequence
  int cp_rank = 0;
  double loss_scale = 1;
  const Tensor* input = nullptr;
  const Tensor* grad_output = nullptr;
  SavedTensors saved;
  std::unique_ptr<DispatchPlan> dispatch;
  std::shared_ptr<Routing<float>> routing;
  Tensor h;           // attention block's output + residual (the combine's residual input)
  Tensor shared_out;  // shared experts' output
  // dgrad results kept for the wgrad step
  Tensor g_h, g_h_all, g_qkv, g_ln1, g_ln2, g_logits, g_shared_out, g_shared_fc1, g_fc2_out,
      g_fc1_out;
  Tensor g_dense_ln2;  // dense layers: the MLP's input gradient, for pre_dispatch's backward
  Tensor grad_out;     // the layer's output gradient, for the residual and shared paths
  Tensor shared_in;    // the shared experts' input (the pre-MLP norm's output), until they run
  Tensor g_shared_in;  // the shared experts' input gradient
  Tensor dense_in;     // a dense MLP's input (the pre-MLP norm's output), until mlp forward
  // Selective recompute: tensors recomputed in backward, held from first use to last.
  Tensor re_ln1, re_qkv, re_ctx, re_lse, re_probs, re_ln2, re_shared_f1, re_shared_a, re_h1, re_a;
  // TP: the norms' outputs all-gathered again in backward (Megatron keeps only this rank's
  // share and gathers again for the wgrad), held from first use to last.
  Tensor ln1_all, ln2_all;
  MlaGrads mla_grads;  // MLA's dgrad results for its wgrad
  bool attn_recomputed = false;
  // moe_shared_expert_overlap: when the side stream may start, and when it is done.
  Event shared_ready, shared_done;
  // This rank's attention heads (all tokens, heads / TP).
  kernels::AttentionShape attn() const;
  // The tokens this rank holds between blocks: batch * seq / TP.
  std::int64_t local_tokens() const { return batch * seq / cfg->tp(); }
  const ModelConfig* cfg = nullptr;
};

inline kernels::AttentionShape LayerPlan::State::attn() const {
  return cfg->attention_shape(batch, seq, cp_rank);
}

}  // namespace nodeemu::layers
