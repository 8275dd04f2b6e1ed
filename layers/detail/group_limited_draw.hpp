// Internal (layers/meta_routing.cpp): meta mode's forced-balance draw for a group-limited router,
// from order statistics instead of per-expert logits.
//
// Megatron's forced balancing (moe_router_force_load_balancing) routes fresh iid standard-normal
// logits (router.py, `apply_random_logits`). Under a group limit (moe_utils.py,
// `group_limited_topk`: a group scores the sum of its best topk / group_topk scores, the best
// group_topk groups stay eligible, the top-k is taken among them) the choice depends on the
// scores' values, so the draw cannot be the plain draw's uniformly random k-subset. Drawing all
// E logits per token and routing them costs ~15 us a token (DeepSeek-V3: 256 normals, a sigmoid
// each, nine top-k passes), and a full DeepSeek-V3 step routes ~1 G tokens this way (~4 h).
//
// What the choice reads of a token's logits is, per group, only its largest few values: the best
// topk / group_topk for the group score, and as many more as the top-k takes from the group. So
// each group's values are drawn from the top down as order statistics of its n iid normals
// (the largest of n uniforms is V^(1/n); given it is u, the next is u * V'^(1/(n-1)), and so on;
// a value is the normal quantile of its uniform), lazily, only as deep as the choice looks:
// ~24 values a token instead of 256. Which members hold the j-th largest values is a uniformly
// random ordered draw without replacement, so each group's picks go to distinct members drawn
// uniformly. The result has the same distribution as routing drawn logits (exactly, up to the
// quantile's 1e-9 relative error and the router's fp32 rounding of near-ties), not the same draws:
// `tests/layers/meta_routing_test.cpp` compares the two statistically.
#pragma once
#include <cstdint>
#include <vector>

#include "layers/router_config.hpp"

namespace nodeemu::layers::detail {

// Kept (token, expert) pairs per expert for `tokens` tokens of iid standard-normal logits routed
// by `cfg`'s group-limited top-k (num_groups > 0; no expert bias, no capacity: the caller drops),
// drawn from the splitmix64 stream that starts at `state`.
std::vector<std::int64_t> group_limited_forced_counts(const RouterConfig& cfg, std::int64_t tokens,
                                                      std::uint64_t state);

// E[S^2], S a group's share of one token's top-k (0 for a group left out), averaged over `tokens`
// tokens routed as group_limited_forced_counts routes them: the one figure of the group limit
// that the central-limit draw (layers/detail/central_limit_counts.hpp) needs besides E[S] = k / G.
double group_picks_second_moment(const RouterConfig& cfg, std::int64_t tokens, std::uint64_t state);

// The standard normal quantile of exp(log_p), for log_p < 0: taking the probability's logarithm
// keeps both tails accurate (the upper tail from -expm1(log_p), the lower from exp(log_p)).
// Acklam's rational approximation, relative error below 1.2e-9.
double normal_quantile_of_log(double log_p);

}  // namespace nodeemu::layers::detail
