// Internal (layers/meta_routing.cpp): meta mode's forced-balance counts for a micro-batch of many
// tokens, drawn from the central limit of the token-by-token draw.
//
// Why: the exact draws (layers/detail/uniform_subset_draw.hpp, group_limited_draw.hpp) go token
// by token: ~15 ns a token plain and ~0.9 us group-limited. A full DeepSeek-V3 step routes ~2 G
// tokens through its MoE layers: the draw was ~30 % of that step's wall time and ~75 % of a
// 128-GPU layout's (bench/README, "The central-limit routing draw"). The timeline reads only
// each expert's count for the micro-batch: a sum over T iid tokens of each token's 0/1 picks.
// For many tokens that sum is normal, with T times the per-token mean and covariance, and those
// follow from the router's symmetries (the experts of a group are exchangeable, and so are the
// groups):
//   - every expert is picked with p = k / E;
//   - a group's share S of a token's k picks has E[S] = k / G and E[S^2] (k^2 with no groups;
//     group_picks_second_moment under a group limit);
//   - given S = m, the group's picked members are a uniformly random m-set of its n.
// So the group totals N_g have mean T k / G and covariance T v G / (G - 1) (I - J / G), with
// v = E[S^2] - (k / G)^2 (they sum to T k). Given N_g, a group's members have mean N_g / n and
// covariance T E[S (n - S)] / (n (n - 1)) (I - J / n). The draw takes centred normals in that
// order and rounds by largest remainders. The total T k is kept exactly, and each count has the
// exact draw's mean, variance and covariances: a member's variance adds up to T p (1 - p).
//
// What is not kept is the skewness of each count, (1 - 2p) / sqrt(T p (1 - p)): 0.06 for
// Qwen3-30B-A3B (mean 256), 0.09 for DeepSeek-V3 (mean 128). It moves the largest of E counts by
// about one token (tests/layers/central_limit_counts_test.cpp compares the two draws). Below a
// mean of kCentralLimitMinMean picks per expert the caller takes the exact draw.
#pragma once
#include <cstdint>
#include <vector>

namespace nodeemu::layers::detail {

// An expert's mean count (T k / E) from which the central-limit draw stands in for the exact one.
inline constexpr double kCentralLimitMinMean = 64;

// What the central-limit draw needs of one token's picks.
struct TokenPickMoments {
  int experts = 0;
  int topk = 0;
  int groups = 1;                        // 1: no group limit
  double group_picks_second_moment = 0;  // E[S^2]; topk^2 when groups == 1
};

// Picks per expert (each within [0, tokens], summing to tokens * topk), drawn from the normal
// law above with the splitmix64 stream that starts at `state`.
std::vector<std::int64_t> central_limit_counts(const TokenPickMoments& m, std::int64_t tokens,
                                               std::uint64_t state);

}  // namespace nodeemu::layers::detail
