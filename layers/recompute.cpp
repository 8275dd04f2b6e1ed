#include "layers/recompute.hpp"

#include "devices/errors.hpp"

namespace nodeemu::layers {

RecomputeSet RecomputeSet::from_modules(const std::vector<std::string>& modules) {
  RecomputeSet r;
  for (const std::string& m : modules) {
    if (m == "core_attn") {
      r.attn_stats = true;
    } else if (m == "layernorm") {
      r.input_norm = r.mlp_norm = true;
    } else if (m == "moe_act") {
      r.expert_act = true;
    } else if (m == "moe" || m == "a2a_overlap_mlp") {
      r.expert_fc1 = r.expert_act = true;
    } else if (m == "mlp") {
      r.dense_fc1 = r.dense_act = true;
    } else if (m == "shared_experts") {
      r.shared = true;
    } else if (m == "a2a_overlap_attn") {
      r.input_norm = r.qkv = r.attn_stats = r.attn_out = true;
    } else if (m == "a2a_overlap_post_attn") {
      r.mlp_norm = r.shared = true;
    } else if (m == "mla_up_proj") {
      r.mla_up_proj = true;
    } else {
      throw UsageError("unknown recompute module '" + m +
                       "'; use core_attn, layernorm, moe_act, moe, mlp, shared_experts, "
                       "mla_up_proj, a2a_overlap_attn, a2a_overlap_post_attn or a2a_overlap_mlp");
    }
  }
  return r;
}

bool RecomputeSet::any() const {
  return input_norm || qkv || attn_stats || attn_out || mlp_norm || shared || expert_fc1 ||
         expert_act || dense_fc1 || dense_act || mla_up_proj;
}

}  // namespace nodeemu::layers
