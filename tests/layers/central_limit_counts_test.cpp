// The central-limit forced-balance draw (layers/detail/central_limit_counts.hpp) against the
// exact token-by-token draws it stands in for, on the routers of the shipped MoE recipes
// (Qwen3-30B-A3B: 128 experts, top-8; DeepSeek-V3: 256 experts in 8 groups, 4 used, top-8) at a
// micro-batch of 4,096 tokens. What the timeline reads of the counts is compared: an expert's
// mean and spread, a group's total, and the load of the busiest EP rank (it sets the all-to-all
// and the slowest expert GEMM), which is where a wrong tail would show.
#include "layers/detail/central_limit_counts.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <numeric>
#include <vector>

#include "layers/detail/group_limited_draw.hpp"
#include "layers/detail/splitmix64.hpp"
#include "layers/detail/uniform_subset_draw.hpp"
#include "layers/router_config.hpp"
#include "tests/layers/router_support.hpp"

namespace nodeemu::layers {
namespace {

using Counts = std::vector<std::int64_t>;
using Draw = std::function<Counts(std::uint64_t)>;

struct Summary {
  double mean = 0, sd = 0, standard_error = 0;
};

Summary summarise(const std::vector<double>& x) {
  Summary s;
  s.mean = std::accumulate(x.begin(), x.end(), 0.0) / double(x.size());
  double ss = 0;
  for (double v : x) ss += (v - s.mean) * (v - s.mean);
  s.sd = std::sqrt(ss / double(x.size() - 1));
  s.standard_error = s.sd / std::sqrt(double(x.size()));
  return s;
}

// Per draw: every expert's count (pooled), every block of `block` experts' total (a group, or an
// EP rank's experts), and the largest block total.
struct Sample {
  std::vector<double> expert, block, busiest;
};

// One Sample per block size, from the same draws.
std::vector<Sample> sample(const Draw& draw, int draws, const std::vector<int>& blocks) {
  std::vector<Sample> out(blocks.size());
  for (int d = 0; d < draws; ++d) {
    // Scrambled states: states one gamma apart are one stream shifted by a word.
    const Counts c = draw(detail::splitmix64_finalise(std::uint64_t(d) + 17));
    for (std::size_t i = 0; i < blocks.size(); ++i) {
      Sample& s = out[i];
      const auto block = std::size_t(blocks[i]);
      double most = 0;
      for (std::size_t b = 0; b < c.size(); b += block) {
        double total = 0;
        for (std::size_t e = b; e < b + block; ++e) {
          if (i == 0) s.expert.push_back(double(c[e]));
          total += double(c[e]);
        }
        s.block.push_back(total);
        most = std::max(most, total);
      }
      s.busiest.push_back(most);
    }
  }
  for (std::size_t i = 1; i < blocks.size(); ++i) out[i].expert = out[0].expert;
  return out;
}

// The two draws agree on the mean of an expert's count, of a block's total and of the busiest
// block, each within 4 standard errors of their difference. And on their spreads: within 6 % for
// an expert and a block (pooled over the experts and blocks of 400 draws: a few % of noise), 15 %
// for the busiest block (one a draw: 400 draws know its spread to ~3.5 %).
void expect_alike(const Sample& exact, const Sample& approx, const char* what) {
  const auto compare = [&](const std::vector<double>& a, const std::vector<double>& b,
                           double spread_tolerance, const char* which) {
    const Summary x = summarise(a), y = summarise(b);
    EXPECT_LT(std::abs(x.mean - y.mean), 4 * std::hypot(x.standard_error, y.standard_error))
        << what << ": " << which << " means " << x.mean << " vs " << y.mean;
    EXPECT_NEAR(y.sd / x.sd, 1.0, spread_tolerance)
        << what << ": " << which << " spreads " << x.sd << " vs " << y.sd;
  };
  compare(exact.expert, approx.expert, 0.06, "expert");
  compare(exact.block, approx.block, 0.06, "block");
  compare(exact.busiest, approx.busiest, 0.15, "busiest block");
}

constexpr std::int64_t kTokens = 4096;
constexpr int kDraws = 400;

TEST(CentralLimitCounts, KeepsTheTotalAndEachCountWithinTheTokens) {
  const detail::TokenPickMoments plain{
      .experts = 128, .topk = 8, .groups = 1, .group_picks_second_moment = 64};
  for (std::uint64_t state : {1ULL, 2ULL, 3ULL}) {
    const Counts c = detail::central_limit_counts(plain, kTokens, state);
    ASSERT_EQ(c.size(), 128u);
    EXPECT_EQ(std::accumulate(c.begin(), c.end(), std::int64_t(0)), kTokens * 8);
    for (auto n : c) EXPECT_TRUE(n >= 0 && n <= kTokens);
  }
  // Few tokens, where the normal law reaches below zero and above every token: still counts.
  const Counts few = detail::central_limit_counts(plain, 3, 5);
  EXPECT_EQ(std::accumulate(few.begin(), few.end(), std::int64_t(0)), 24);
  for (auto n : few) EXPECT_TRUE(n >= 0 && n <= 3);
  // The same state, the same counts.
  EXPECT_EQ(detail::central_limit_counts(plain, kTokens, 9),
            detail::central_limit_counts(plain, kTokens, 9));
}

// Qwen3-30B-A3B's plain top-8 of 128, blocks of 8 experts: an EP16 rank's.
TEST(CentralLimitCounts, PlainTopKDrawsLikeTheExactDraw) {
  const detail::TokenPickMoments m{
      .experts = 128, .topk = 8, .groups = 1, .group_picks_second_moment = 64};
  const Sample exact =
      sample([](std::uint64_t s) { return detail::uniform_subset_counts(128, 8, kTokens, s); },
             kDraws, {8})[0];
  const Sample approx = sample(
      [&](std::uint64_t s) { return detail::central_limit_counts(m, kTokens, s); }, kDraws, {8})[0];
  expect_alike(exact, approx, "plain top-8 of 128");
  // And the spread is the binomial's, T p (1 - p), to 3 %.
  const double p = 8.0 / 128;
  EXPECT_NEAR(summarise(approx.expert).sd / std::sqrt(kTokens * p * (1 - p)), 1.0, 0.03);
}

// DeepSeek-V3's group-limited router, blocks of 32 experts: a group, and an EP8 rank's experts.
// Blocks of 4 (an EP64 rank's) too, where the busiest of 64 is the tail that matters.
TEST(CentralLimitCounts, GroupLimitedTopKDrawsLikeTheExactDraw) {
  const RouterConfig c = testing::deepseek_v3_router();
  const detail::TokenPickMoments m{
      .experts = 256,
      .topk = 8,
      .groups = 8,
      .group_picks_second_moment = detail::group_picks_second_moment(c, 1 << 16, 99)};
  const auto exact_draw = [&](std::uint64_t s) {
    return detail::group_limited_forced_counts(c, kTokens, s);
  };
  const auto approx_draw = [&](std::uint64_t s) {
    return detail::central_limit_counts(m, kTokens, s);
  };
  const auto exact = sample(exact_draw, kDraws, {32, 4});
  const auto approx = sample(approx_draw, kDraws, {32, 4});
  expect_alike(exact[0], approx[0], "DeepSeek-V3, groups");
  expect_alike(exact[1], approx[1], "DeepSeek-V3, EP64 ranks");
  // The group limit makes the groups' totals spread wider than without it (1.26x): the draw
  // keeps that.
  const double unlimited_sd =
      std::sqrt(kTokens * 8 * (32.0 / 256) * (1 - 32.0 / 256) * (256 - 8) / (256 - 1.0));
  EXPECT_GT(summarise(exact[0].block).sd, 1.15 * unlimited_sd);
  EXPECT_GT(summarise(approx[0].block).sd, 1.15 * unlimited_sd);
}

// Without a binding group limit (every group eligible), a group's share of the top-k is
// hypergeometric, whose E[S^2] is known: the moment's estimate finds it within 1 %. And the
// estimate for DeepSeek-V3's router moves by less than 0.5 % from one stream to another.
TEST(CentralLimitCounts, TheGroupMomentIsTheRoutersOwn) {
  RouterConfig open = testing::deepseek_v3_router();
  open.group_topk = open.num_groups;
  const double k = 8, E = 256, n = 32;
  const double variance = k * (n / E) * (1 - n / E) * (E - k) / (E - 1);
  const double exact = variance + (k / 8) * (k / 8);
  EXPECT_NEAR(detail::group_picks_second_moment(open, 1 << 16, 3) / exact, 1.0, 0.01);
  std::vector<double> estimates;
  for (std::uint64_t s : {1ULL, 2ULL, 3ULL, 4ULL, 5ULL})
    estimates.push_back(
        detail::group_picks_second_moment(testing::deepseek_v3_router(), 1 << 16, s));
  const auto [lo, hi] = std::minmax_element(estimates.begin(), estimates.end());
  EXPECT_LT(*hi / *lo - 1, 0.005);
  // The limit concentrates the picks: E[S^2] above the unlimited router's (2.34 against 1.85).
  EXPECT_GT(*lo, 1.2 * exact);
}

}  // namespace
}  // namespace nodeemu::layers
