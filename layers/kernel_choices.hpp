// Which kernels a layer launches, decided by Megatron-Core's own keys (TransformerConfig), so that
// the timeline shows the kernels the real stack runs for a recipe. A fused path launches the
// fused kernel; an unfused path launches the separate ops, each priced from the GPU profile's
// tables. Sources (Megatron-LM core_r0.17 and main; TransformerEngine main):
//
//  transformer_impl     megatron/core/models/gpt/gpt_layer_specs.py: the TE spec (TENorm and
//                       TELayerNormColumnParallelLinear: one RMSNorm kernel, then the GEMM;
//                       TEDotProductAttention) or the local spec (torch.nn.RMSNorm as separate
//                       ops, core attention by transformer/dot_product_attention.py, and always
//                       SequentialMLP experts).
//  attention_backend    megatron/core/transformer/enums.py AttnBackend; `auto` lets TE choose:
//                       transformer_engine/pytorch/attention get_attention_backend prefers cuDNN
//                       FusedAttention over FlashAttention on compute capability >= 9.0.
//                       `unfused`/`local` run DotProductAttention: baddbmm(QK^T), the fused
//                       scale-mask-softmax, bmm(PV), with the probabilities kept for backward.
//  moe_permute_fusion   transformer/moe/moe_utils.py permute/unpermute/sort_chunks_by_idxs: TE's
//                       moe_permute_with_probs / moe_unpermute / moe_sort_chunks_by_index (one
//                       kernel each) against argsort + gathers, zeros + scatter_add, and cat.
//  moe_grouped_gemm     transformer/moe/experts.py: TEGroupedMLP (one grouped GEMM per linear)
//                       against SequentialMLP (each expert's GEMMs and activation in turn).
//  bias_activation_fusion  fusions/fused_bias_swiglu.py weighted_bias_swiglu_impl (one kernel)
//                       against silu, multiply and the probabilities' multiply as separate ops.
//  apply_rope_fusion    models/common/embeddings/rope_utils.py: TE's fused_rope (one kernel for q
//                       and one for k) against _apply_rotary_pos_emb_bshd's slice, rotate-half
//                       (neg, cat), two multiplies, an add and a cat, for q and for k.
//  gradient_accumulation_fusion  tensor_parallel/layers.py and TE's fuse_wgrad_accumulation: the
//                       wgrad GEMM accumulates into the fp32 main_grad, against a wgrad GEMM into a
//                       16-bit grad that the DDP hook then adds to main_grad (main_grad.add_).
//  moe_router_dtype     transformer/moe/router.py TopKRouter.gating: router_gating_linear in fp32
//                       (moe_utils.py RouterGatingLinearFunction casts input and weight, forward
//                       and backward) when it is fp32, else in the input's dtype. NodeEmu's router
//                       numerics are fp32 either way; the key decides which GEMM table prices it.
//
// The defaults are TransformerConfig's: TE, auto attention, every fusion off, no grouped GEMM.
#pragma once

namespace nodeemu::layers {

enum class CoreAttention {
  Cudnn,    // TE FusedAttention (cuDNN)
  Flash,    // TE FlashAttention
  Unfused,  // DotProductAttention: batched GEMMs and a softmax kernel
};

struct KernelChoices {
  bool transformer_engine = true;                  // transformer_impl: transformer_engine, or local
  CoreAttention attention = CoreAttention::Cudnn;  // attention_backend, resolved for the GPU
  bool permute_fusion = false;                     // moe_permute_fusion
  bool grouped_gemm = false;                       // moe_grouped_gemm
  bool bias_activation_fusion = false;             // bias_activation_fusion
  bool rope_fusion = false;                        // apply_rope_fusion
  bool gradient_accumulation_fusion = false;       // gradient_accumulation_fusion
  bool router_fp32 = false;                        // moe_router_dtype: fp32

  // What runs when no choices are given (tests, the reference): TransformerConfig's defaults.
  static const KernelChoices& defaults();
};

}  // namespace nodeemu::layers
