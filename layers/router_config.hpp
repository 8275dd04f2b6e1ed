// The router's settings, by Megatron-Core's names (TransformerConfig's moe_router_* keys).
#pragma once
#include <optional>
#include <string>

namespace nodeemu::layers {

enum class ScoreFunction { Softmax, Sigmoid };
enum class LoadBalancing { None, AuxLoss, SeqAuxLoss };
enum class DropPolicy { Probs, Position };

struct RouterConfig {
  int num_experts = 8;                                    // num_moe_experts
  int topk = 2;                                           // moe_router_topk
  ScoreFunction score = ScoreFunction::Softmax;           // moe_router_score_function
  bool pre_softmax = false;                               // moe_router_pre_softmax
  int num_groups = 0;                                     // moe_router_num_groups (0: no limit)
  int group_topk = 0;                                     // moe_router_group_topk
  double topk_scaling_factor = 1.0;                       // moe_router_topk_scaling_factor
  bool enable_expert_bias = false;                        // moe_router_enable_expert_bias
  double bias_update_rate = 1e-3;                         // moe_router_bias_update_rate
  LoadBalancing load_balancing = LoadBalancing::AuxLoss;  // moe_router_load_balancing_type
  double aux_loss_coeff = 0.0;                            // moe_aux_loss_coeff
  double z_loss_coeff = 0.0;                              // moe_z_loss_coeff
  std::optional<double> capacity_factor;                  // moe_expert_capacity_factor
  DropPolicy drop_policy = DropPolicy::Probs;             // moe_token_drop_policy
  bool pad_to_capacity = false;                           // moe_pad_expert_input_to_capacity
  // moe_router_force_load_balancing. Megatron draws random logits; NodeEmu routes token t to
  // experts (t*topk + j) mod num_experts, so the counts are exactly uniform and known on the host
  // (meta mode needs that), while the probabilities still come from the real logits.
  bool force_load_balancing = false;

  bool operator==(const RouterConfig&) const = default;
  // Throws ConfigError naming the Megatron key for an inconsistent setting.
  void validate() const;
  // ceil(tokens * topk / experts * capacity_factor), Megatron's get_capacity; 0 without a factor.
  long capacity(long tokens) const;
};

}  // namespace nodeemu::layers
