// The group-limited forced-balance draw (layers/detail/group_limited_draw.hpp): drawn from order
// statistics, it must choose like the router's own group-limited top-k on iid standard-normal
// logits, which is what Megatron's forced balancing routes.
#include "layers/detail/group_limited_draw.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <random>
#include <string>

#include "layers/router.hpp"

namespace nodeemu::layers {
namespace {

TEST(NormalQuantile, InvertsTheNormalTailsToTheirStatedAccuracy) {
  // Q(x) = P(Z > x) from erfc, accurate in both tails; Acklam's relative error of 1.2e-9 in x
  // is at most x^2 * 1.2e-9 relative in a tail probability (7e-8 at x = 7.5).
  const auto upper = [](double x) { return 0.5 * std::erfc(x / std::sqrt(2.0)); };
  for (double log_p = -40; log_p<-1e-15; log_p = log_p> - 1 ? log_p * 0.7 : log_p + 0.25) {
    const double x = detail::normal_quantile_of_log(log_p);
    const double p = std::exp(log_p), q = -std::expm1(log_p);
    const double got_p = upper(-x), got_q = upper(x);
    if (p < 0.5)
      EXPECT_NEAR(got_p / p, 1.0, 1e-7) << "log p " << log_p;
    else
      EXPECT_NEAR(got_q / q, 1.0, 1e-7) << "log p " << log_p;
  }
  EXPECT_DOUBLE_EQ(detail::normal_quantile_of_log(std::log(0.5)) + 1.0, 1.0);
  EXPECT_GT(detail::normal_quantile_of_log(-1e-12), 7.0);  // the upper tail, far out
}

// A token's routing as a pattern: how many of its top-k each used group took, largest first
// ("5 2 1"). The group limit shapes exactly this; which members and which groups are uniform by
// symmetry.
std::string pattern_of(const std::vector<std::int64_t>& counts, int groups) {
  const std::size_t per = counts.size() / std::size_t(groups);
  std::vector<std::int64_t> taken;
  for (int g = 0; g < groups; ++g) {
    std::int64_t n = 0;
    for (std::size_t e = 0; e < per; ++e) n += counts[std::size_t(g) * per + e];
    if (n > 0) taken.push_back(n);
  }
  std::sort(taken.rbegin(), taken.rend());
  std::string s;
  for (auto n : taken) s += std::to_string(n) + " ";
  return s;
}

// Pearson's two-sample chi-square over the patterns (those with fewer than 10 in both samples
// pooled into one cell), and its degrees of freedom.
std::pair<double, int> chi_square(const std::map<std::string, int>& a,
                                  const std::map<std::string, int>& b) {
  std::map<std::string, std::pair<double, double>> cells;
  for (const auto& [k, n] : a) cells[k].first += n;
  for (const auto& [k, n] : b) cells[k].second += n;
  std::pair<double, double> rare{0, 0};
  double chi = 0;
  int used = 0;
  const auto add = [&](std::pair<double, double> c) {
    chi += (c.first - c.second) * (c.first - c.second) / (c.first + c.second);
    ++used;
  };
  for (const auto& [k, c] : cells) {
    if (c.first + c.second < 10) {
      rare.first += c.first, rare.second += c.second;
      continue;
    }
    add(c);
  }
  if (rare.first + rare.second > 0) add(rare);
  return {chi, used - 1};
}

// The chi-square's upper 1e-4 point (Wilson and Hilferty's cube-root normal approximation).
double chi_square_bound(int df) {
  const double z = 3.719, v = 2.0 / (9.0 * df);
  return df * std::pow(1.0 - v + z * std::sqrt(v), 3);
}

// The router's choice on drawn logits, one token at a time: the reference.
std::map<std::string, int> router_patterns(const RouterConfig& c, int tokens, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> normal;
  std::vector<double> logits(std::size_t(c.num_experts));
  std::map<std::string, int> out;
  for (int t = 0; t < tokens; ++t) {
    for (double& l : logits) l = normal(rng);
    ++out[pattern_of(route<double>(c, logits.data(), 1, 1, nullptr).tokens_per_expert,
                     c.num_groups)];
  }
  return out;
}

std::map<std::string, int> drawn_patterns(const RouterConfig& c, int tokens, std::uint64_t seed) {
  std::map<std::string, int> out;
  for (int t = 0; t < tokens; ++t)
    ++out[pattern_of(detail::group_limited_forced_counts(c, 1, seed + std::uint64_t(t) * 7919),
                     c.num_groups)];
  return out;
}

RouterConfig group_limited(int experts, int topk, int groups, int used, ScoreFunction score,
                           bool pre_softmax = false) {
  RouterConfig c;
  c.num_experts = experts;
  c.topk = topk;
  c.num_groups = groups;
  c.group_topk = used;
  c.score = score;
  c.pre_softmax = pre_softmax;
  return c;
}

// DeepSeek-V3's router (sigmoid, 8 groups of 32, 4 used, top-8) and two softmax ones (scores
// before and after the top-k; a different group depth), 20 000 tokens each way. Fixed seeds: the
// test is deterministic; its bound is the 1e-4 point of the chi-square.
TEST(GroupLimitedDraw, DrawsAreDistributedAsTheRouterOnDrawnLogits) {
  for (const auto& c : {group_limited(256, 8, 8, 4, ScoreFunction::Sigmoid),
                        group_limited(64, 6, 8, 3, ScoreFunction::Softmax),
                        group_limited(64, 6, 8, 3, ScoreFunction::Softmax, true)}) {
    const auto reference = router_patterns(c, 20000, 11);
    const auto drawn = drawn_patterns(c, 20000, 12);
    const auto [chi, df] = chi_square(reference, drawn);
    ASSERT_GE(df, 3);
    EXPECT_LT(chi, chi_square_bound(df)) << c.num_experts << " experts, df " << df;
  }
}

// The comparison has the power to tell a wrong sampler: a top-k without the group limit (the
// plain draw's uniformly random set) fails it by far.
TEST(GroupLimitedDraw, TheComparisonRejectsARouterWithoutTheGroupLimit) {
  const RouterConfig c = group_limited(256, 8, 8, 4, ScoreFunction::Sigmoid);
  RouterConfig plain = c;
  plain.num_groups = plain.group_topk = 0;
  std::mt19937_64 rng(5);
  std::normal_distribution<double> normal;
  std::vector<double> logits(256);
  std::map<std::string, int> unlimited;
  for (int t = 0; t < 20000; ++t) {
    for (double& l : logits) l = normal(rng);
    ++unlimited[pattern_of(route<double>(plain, logits.data(), 1, 1, nullptr).tokens_per_expert,
                           8)];
  }
  const auto [chi, df] = chi_square(drawn_patterns(c, 20000, 12), unlimited);
  EXPECT_GT(chi, 10 * chi_square_bound(df));
}

TEST(GroupLimitedDraw, EveryTokenTakesTopKDistinctExpertsFromTheUsedGroups) {
  const RouterConfig c = group_limited(256, 8, 8, 4, ScoreFunction::Sigmoid);
  for (std::uint64_t s = 0; s < 200; ++s) {
    const auto one = detail::group_limited_forced_counts(c, 1, s);
    std::int64_t total = 0;
    int groups_used = 0;
    for (int g = 0; g < 8; ++g) {
      std::int64_t in = 0;
      for (int e = 0; e < 32; ++e) {
        EXPECT_LE(one[std::size_t(g * 32 + e)], 1);
        in += one[std::size_t(g * 32 + e)];
      }
      groups_used += in > 0;
      total += in;
    }
    EXPECT_EQ(total, 8);
    EXPECT_LE(groups_used, 4);
  }
  // Many tokens: every expert's mean load is top-k / experts.
  const auto many = detail::group_limited_forced_counts(c, 64000, 3);
  for (auto n : many) EXPECT_NEAR(double(n), 2000.0, 5 * std::sqrt(2000.0));
}

}  // namespace
}  // namespace nodeemu::layers
