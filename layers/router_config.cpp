#include "layers/router_config.hpp"

#include <cmath>

#include "devices/errors.hpp"

namespace nodeemu::layers {

namespace {
void fail(const std::string& key, const std::string& what) {
  throw ConfigError("model", key, what);
}
}  // namespace

void RouterConfig::validate() const {
  if (num_experts < 1) fail("num_moe_experts", "must be at least 1");
  if (topk < 1 || topk > num_experts)
    fail("moe_router_topk",
         "must be between 1 and num_moe_experts (" + std::to_string(num_experts) + ")");
  if (num_groups > 0) {
    if (num_experts % num_groups) fail("moe_router_num_groups", "must divide num_moe_experts");
    if (group_topk < 1 || group_topk > num_groups)
      fail("moe_router_group_topk", "must be between 1 and moe_router_num_groups");
    if (topk % group_topk) fail("moe_router_group_topk", "must divide moe_router_topk");
    if (topk > group_topk * (num_experts / num_groups))
      fail("moe_router_topk", "exceeds the experts in moe_router_group_topk groups");
  }
  if (capacity_factor && !(*capacity_factor > 0))  // NaN too
    fail("moe_expert_capacity_factor", "must be positive, or unset for dropless");
  // Above num_moe_experts a capacity exceeds tokens x topk, more rows than a micro-batch can
  // route to one expert; a huge factor also overflowed the capacity's integer (1e308 gave a
  // negative capacity that a meta run took silently).
  if (capacity_factor && *capacity_factor > double(num_experts))
    fail("moe_expert_capacity_factor",
         "must be at most num_moe_experts (" + std::to_string(num_experts) +
             "): above it an expert's capacity exceeds every token's every pick");
  if (pad_to_capacity && !capacity_factor)
    fail("moe_pad_expert_input_to_capacity", "needs moe_expert_capacity_factor");
  if (aux_loss_coeff < 0 || z_loss_coeff < 0)
    fail(aux_loss_coeff < 0 ? "moe_aux_loss_coeff" : "moe_z_loss_coeff", "must be >= 0");
}

long RouterConfig::capacity(long tokens) const {
  if (!capacity_factor) return 0;
  return static_cast<long>(
      std::ceil(double(tokens) * topk / double(num_experts) * *capacity_factor));
}

}  // namespace nodeemu::layers
