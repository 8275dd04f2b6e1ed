// Selective activation recompute (Megatron's recompute_granularity=selective, REFERENCE §3):
// which of a layer's activations forward does not keep, so that backward recomputes them on the
// compute stream with the same kernels. The values are bit-identical to the kept ones, the memory
// is not held between forward and backward, and the recomputation costs real virtual time (its
// kernels are named "recompute.*").
#pragma once
#include <string>
#include <vector>

namespace nodeemu::layers {

struct RecomputeSet {
  bool input_norm = false;  // the input norm's output (the QKV projection's input)
  bool qkv = false;         // QKV after RoPE (the attention's input)
  bool attn_stats = false;  // the attention's softmax statistics
  bool attn_out = false;    // the attention's output (the output projection's input)
  bool mlp_norm = false;    // the pre-MLP norm's output
  bool shared = false;      // the shared experts' fc1 and activation outputs
  bool expert_fc1 = false;  // the experts' fc1 output (the activation's input)
  bool expert_act = false;  // the experts' activation output (fc2's input)
  bool dense_fc1 = false;   // the same for a dense MLP
  bool dense_act = false;
  bool mla_up_proj = false;  // MLA's up projections (the attention's input), from the latents

  // From Megatron's recompute_modules names:
  //   core_attn        the attention is checkpointed: its statistics are recomputed
  //   layernorm        both norms' outputs are discarded and recomputed
  //   moe_act          the experts' activation output is discarded and recomputed
  //   moe              the experts are checkpointed from their dispatched input (the dispatch
  //                    all-to-all is not re-run: its output is what stays)
  //   mlp              a dense MLP is checkpointed from its input
  //   shared_experts   the shared experts are checkpointed from their input
  //   mla_up_proj      MLA's up projections are checkpointed from the compressed latents
  // and LoongForge's whole overlap nodes:
  //   a2a_overlap_attn       attention from the layer input (norm, QKV, attention)
  //   a2a_overlap_post_attn  the pre-MLP norm and the shared experts
  //   a2a_overlap_mlp        the experts, as moe
  // Throws UsageError naming a module it does not know. mla_up_proj on a model without MLA is
  // refused by emu's validate; a layer without MLA has nothing for it to recompute.
  static RecomputeSet from_modules(const std::vector<std::string>& modules);
  bool any() const;
};

}  // namespace nodeemu::layers
