// Multi-latent attention's projections (DeepSeek-V2/V3), as Megatron-Core's MLASelfAttention
// lays them out with Transformer Engine (multi_latent_attention.py, get_query_key_value_tensors;
// gpt_layer_specs.py's MLA submodules):
//
//   query:  linear_q_down_proj  H -> q_lora_rank, duplicated on every TP rank, on this rank's
//                               tokens (TELinear parallel_mode "duplicated": its gradient is
//                               all-reduced over TP, as the norms' are)
//           q_layernorm + linear_q_up_proj  (TELayerNormColumnParallelLinear): RMSNorm on this
//                               rank's tokens, all-gathered over TP, column-parallel over heads
//                               to heads x (qk_head_dim + qk_pos_emb_head_dim)
//           (q_lora_rank 0: one column-parallel linear_q_proj on the gathered input instead)
//   key/value: linear_kv_down_proj  H -> kv_lora_rank + qk_pos_emb_head_dim, duplicated; split:
//           the latent through kv_layernorm + linear_kv_up_proj (-> heads x (qk_head_dim +
//           v_head_dim)), and the rope key (one head, all-gathered over TP) shared by every head
//
// The layer then rotates the pe columns of each query and key head (interleaved pairs, YaRN
// frequencies) and runs the attention kernel with value head dim v_head_dim and YaRN's softmax
// scale; linear_proj is the usual row-parallel projection over heads x v_head_dim.
//
// Without qk_layernorm the latents go to the up projections as they are (TEColumnParallelLinear).
#pragma once
#include <string>
#include <vector>

#include "layers/model_config.hpp"
#include "layers/ops.hpp"
#include "layers/parameter.hpp"
#include "layers/saved_tensors.hpp"
#include "layers/tensor_parallel.hpp"

namespace nodeemu::layers {

// The gradients MLA's dgrad leaves for its wgrad.
struct MlaGrads {
  Tensor q_up_out, kv_up_out;     // all tokens, this rank's heads
  Tensor q_latent, q_normed;      // this rank's tokens: q_down's output, q_layernorm's
  Tensor kv_down_out, kv_normed;  // kv_down's whole output, kv_layernorm's
  // mla_up_proj recompute: the norms' outputs the recompute produced, for the up wgrads.
  Tensor re_q_normed, re_kv_normed;
};

class MultiLatentAttention {
 public:
  MultiLatentAttention() = default;
  MultiLatentAttention(const ModelConfig& c, Device& device, std::uint64_t seed,
                       const std::string& prefix, const TensorParallel& tp);
  void append_parameters(std::vector<Parameter*>& out);
  bool on() const { return static_cast<bool>(kv_down_.value); }

  // The attention kernel's qkv (before RoPE) from the input norm's output on this rank's
  // tokens. `saved` (null when recomputing) keeps what backward reads, under `module`. With
  // `up_recomputed` (recompute module mla_up_proj) it keeps the latents and the rope key instead
  // of the norms' outputs, and backward runs recompute_up.
  Tensor forward(ops::At at, const Tensor& ln1, const kernels::AttentionShape& s,
                 SavedTensors* saved, const char* module, bool up_recomputed = false);
  // Megatron's mla_up_proj checkpoint (MLASelfAttention's qkv_up_checkpoint): the latents'
  // norms, their gathers and the up projections again, from what forward kept; qkv before RoPE.
  Tensor recompute_up(ops::At at, const kernels::AttentionShape& s, SavedTensors& saved,
                      const char* module, MlaGrads& g);
  // The gradient of the input norm's output on this rank's tokens, from the gradient of qkv
  // (after RoPE's inverse); leaves what the wgrad reads in `g`.
  Tensor backward(ops::At at, const Tensor& g_qkv, const kernels::AttentionShape& s,
                  SavedTensors& saved, const char* module, MlaGrads& g);
  // The projections' and norms' weight gradients; `ln1` is the input norm's output on this
  // rank's tokens. Releases what forward saved.
  void wgrad(ops::At at, const Tensor& ln1, SavedTensors& saved, const char* module, MlaGrads& g);

 private:
  Tensor gathered(ops::At at, const Tensor& x, const char* name) const;
  Tensor scattered(ops::At at, const Tensor& x, const char* name) const;
  // A latent through its norm (when qk_layernorm), gathered over TP: the up projection's input.
  Tensor up_input(ops::At at, const Tensor& latent, const char* norm_name, const Parameter& norm,
                  Tensor& normed, Tensor& rstd, const char* name) const;
  // The dimensions it needs, copied from the config at construction (it keeps no reference).
  std::int64_t q_lora_ = 0, kv_lora_ = 0, pe_ = 0;
  bool norms_ = false;
  double eps_ = 0;
  DType dtype_ = DType::F32;
  TensorParallel tp_;
  Parameter q_down_, q_norm_, q_up_;  // q_up_: linear_q_proj without query compression
  Parameter kv_down_, kv_norm_, kv_up_;
};

}  // namespace nodeemu::layers
