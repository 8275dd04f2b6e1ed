// The model's architecture, by Megatron-Core's TransformerConfig names, so that a recipe can copy
// them across (emu/ maps the YAML keys onto this struct).
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "comm/flex_dispatcher.hpp"
#include "layers/dtype.hpp"
#include "layers/kernel_choices.hpp"
#include "layers/kernels/attention.hpp"
#include "layers/meta_routing.hpp"
#include "layers/router_config.hpp"

namespace nodeemu::layers {

enum class DispatcherType { AllToAll, AllGather, Flex };
// Megatron's cp_comm_type (layers/context_parallel.hpp); a2a and a2a+p2p are not modelled.
enum class CpCommType { P2P, AllGather };
const char* dispatcher_name(DispatcherType t);

struct ModelConfig {
  int num_layers = 4;
  int hidden_size = 64;
  int num_attention_heads = 4;
  int num_query_groups = 2;   // KV heads (GQA); = heads for plain multi-head attention
  int kv_channels = 0;        // head dim; 0 = hidden_size / num_attention_heads
  int ffn_hidden_size = 128;  // dense layers' MLP
  int vocab_size = 256;
  // RoPE's base and, with rope_type yarn, YaRN's scaling (kernels/attention.hpp).
  kernels::Rotary rotary;
  // Megatron-Core's TransformerConfig default, and the recipe schema's (model.layernorm_epsilon).
  double layernorm_epsilon = 1e-5;
  double init_method_std = 0.02;
  DType dtype = DType::F32;  // bf16: true -> BF16, fp16: true -> F16

  // MoE. num_moe_experts = 0 makes every layer dense.
  int num_moe_experts = 8;
  int moe_ffn_hidden_size = 128;
  int moe_shared_expert_intermediate_size = 0;  // 0: no shared experts
  // Megatron's moe_layer_freq: {N} makes every Nth layer MoE (0, N, 2N...; {1}: all of them);
  // a longer list gives each layer's kind, 1 for MoE ([0, 0, 0, 1, ...]: DeepSeek-V3's first
  // three layers are dense).
  std::vector<int> moe_layer_freq = {1};
  RouterConfig router;  // num_experts/topk mirror num_moe_experts/moe_router_topk
  // Meta mode's routing (layers/meta_routing.hpp): shared by every rank of a run, so that each
  // rank reads its peers' counts from one memo. None in functional mode.
  std::shared_ptr<const MetaRouting> meta_routing;
  DispatcherType moe_token_dispatcher_type = DispatcherType::AllToAll;
  FlexBackend moe_flex_dispatcher_backend = FlexBackend::DeepEP;
  int moe_flex_dispatcher_num_sms = 0;         // 0: the backend's default (FlexConfig::num_sms)
  int moe_hybridep_num_sms_preprocessing = 0;  // 0: HybridEP's default (FlexConfig)
  // > 0: HybridEP's sync-free mode, with this budget per rank relative to balanced routing.
  double moe_expert_rank_capacity_factor = 0;
  // Multi-token prediction (layers/mtp.hpp): this many MTP layers after the decoder, on the
  // last pipeline stage, their loss scaled by mtp_loss_scaling_factor / mtp_num_layers.
  int mtp_num_layers = 0;
  double mtp_loss_scaling_factor = 0.1;
  // qk_layernorm: an RMSNorm over each query and key head before RoPE (Qwen3 has it); with MLA,
  // over the compressed query and key/value latents (Megatron's MLA spec fuses them into the up
  // projections as TELayerNormColumnParallelLinear).
  bool qk_layernorm = false;
  // Multi-latent attention (DeepSeek-V2/V3; Megatron-Core's MLASelfAttention, layers/mla.hpp),
  // by MLATransformerConfig's names and defaults. q_lora_rank 0: one linear_q_proj, no query
  // compression (Megatron's None).
  bool multi_latent_attention = false;
  int q_lora_rank = 512;
  int kv_lora_rank = 512;
  int qk_head_dim = 128, qk_pos_emb_head_dim = 64, v_head_dim = 128;
  // Tensor parallelism as Megatron-Core lays it out (tensor_parallel.hpp): attention heads, the
  // dense and shared-expert MLPs and the vocabulary split over tensor_model_parallel_size ranks.
  // It is modelled with sequence_parallel only (Megatron requires it for MoE with TP > 1).
  int tensor_model_parallel_size = 1;
  bool sequence_parallel = false;
  // Expert tensor parallelism: each expert's fc1 and fc2 split over this many ranks, the
  // dispatched tokens all-gathered over them (alltoall dispatcher; Megatron's ETP group).
  int expert_tensor_parallel_size = 1;
  // Context parallelism (layers/context_parallel.hpp): each sequence split over this many ranks
  // with Megatron's load balancing, the keys and values exchanged by cp_comm_type.
  int context_parallel_size = 1;
  CpCommType cp_comm_type = CpCommType::P2P;
  KernelChoices kernels;  // which kernels run (transformer_impl, attention_backend, fusions)

  // The query/key head dim (MLA: qk_head_dim + qk_pos_emb_head_dim) and the value one.
  int head_dim() const;
  int value_head_dim() const { return multi_latent_attention ? v_head_dim : head_dim(); }
  // MLA runs plain multi-head attention: one key/value head per query head.
  int kv_heads() const { return multi_latent_attention ? num_attention_heads : num_query_groups; }
  // The RoPE this model applies: MLA pairs its columns interleaved.
  kernels::Rotary rope() const;
  // One TP rank's attention: its heads over the tokens of a micro-batch that CP rank `cp_rank`
  // holds (`seq` of each sequence).
  kernels::AttentionShape attention_shape(std::int64_t batch, std::int64_t seq,
                                          int cp_rank = 0) const;
  int tp() const { return tensor_model_parallel_size; }
  int cp() const { return context_parallel_size; }
  int etp() const { return expert_tensor_parallel_size; }
  // Layers num_layers.. are the MTP layers (with the decoder's last layer's kind).
  bool is_moe_layer(int layer) const;
  // Throws ConfigError naming the Megatron key.
  void validate() const;
};

}  // namespace nodeemu::layers
