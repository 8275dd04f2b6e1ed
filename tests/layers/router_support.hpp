// Shared set-up for the routing tests: the routers of the shipped MoE recipes.
#pragma once
#include "layers/router_config.hpp"

namespace nodeemu::testing {

// DeepSeek-V3's router: 256 experts in 8 groups, the best 4 groups eligible, top-8, sigmoid
// scores scaled by 2.5 (configs/recipes/deepseek_v3.yaml).
inline layers::RouterConfig deepseek_v3_router() {
  layers::RouterConfig c;
  c.num_experts = 256;
  c.topk = 8;
  c.num_groups = 8;
  c.group_topk = 4;
  c.score = layers::ScoreFunction::Sigmoid;
  c.topk_scaling_factor = 2.5;
  return c;
}

}  // namespace nodeemu::testing
