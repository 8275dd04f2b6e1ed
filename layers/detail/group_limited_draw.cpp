#include "layers/detail/group_limited_draw.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <utility>

#include "devices/check.hpp"
#include "layers/detail/splitmix64.hpp"

namespace nodeemu::layers::detail {

double normal_quantile_of_log(double log_p) {
  // P. J. Acklam's coefficients (2003): a central rational function for p in [0.02425, 0.97575]
  // and one in sqrt(-2 log(tail)) for each tail.
  static constexpr std::array<double, 6> a{-3.969683028665376e+01, 2.209460984245205e+02,
                                           -2.759285104469687e+02, 1.383577518672690e+02,
                                           -3.066479806614716e+01, 2.506628277459239e+00};
  static constexpr std::array<double, 5> b{-5.447609879822406e+01, 1.615858368580409e+02,
                                           -1.556989798598866e+02, 6.680131188771972e+01,
                                           -1.328068155288572e+01};
  static constexpr std::array<double, 6> c{-7.784894002430293e-03, -3.223964580411365e-01,
                                           -2.400758277161838e+00, -2.549732539343734e+00,
                                           4.374664141464968e+00,  2.938163982698783e+00};
  static constexpr std::array<double, 4> d{7.784695709041462e-03, 3.224671290700398e-01,
                                           2.445134137142996e+00, 3.754408661907416e+00};
  constexpr double kTail = 0.02425;
  const auto tail = [&](double t) {  // the quantile of a lower-tail probability t < kTail
    const double r = std::sqrt(-2.0 * std::log(t));
    return (((((c[0] * r + c[1]) * r + c[2]) * r + c[3]) * r + c[4]) * r + c[5]) /
           ((((d[0] * r + d[1]) * r + d[2]) * r + d[3]) * r + 1.0);
  };
  const auto central = [&](double r) {  // r = p - 0.5
    const double s = r * r;
    return (((((a[0] * s + a[1]) * s + a[2]) * s + a[3]) * s + a[4]) * s + a[5]) * r /
           (((((b[0] * s + b[1]) * s + b[2]) * s + b[3]) * s + b[4]) * s + 1.0);
  };
  NE_CHECK(log_p < 0, "normal_quantile_of_log: the probability must be below one");
  if (log_p < -0.6931471805599453) {  // p < 1/2: p itself is accurate
    const double p = std::exp(log_p);
    return p < kTail ? tail(p) : central(p - 0.5);
  }
  const double q = -std::expm1(log_p);  // the upper tail, accurate where p is near one
  return q < kTail ? -tail(q) : central(0.5 - q);
}

namespace {

// The stream of layers/detail/splitmix64.hpp, with the two ways this draw reads it.
struct Stream : SplitMix64 {
  // Uniform on the open interval (0, 1): a midpoint of 2^53 cells, so its logarithm is finite
  // and negative.
  double open_uniform() { return (double(next() >> 11) + 0.5) * 0x1.0p-53; }
  // Uniform on [0, n), exactly (Lemire's multiply with rejection).
  std::uint32_t below(std::uint32_t n) {
    const std::uint32_t reject_below = std::uint32_t(-n) % n;  // 2^32 mod n
    for (;;) {
      const std::uint64_t m = (next() >> 32) * n;
      if (std::uint32_t(m) >= reject_below) return std::uint32_t(m >> 32);
    }
  }
};

// Routes `tokens` tokens of the stream that starts at `state`; after each, calls
// on_token(rng, groups, taken): the eligible groups are groups[0 .. group_topk), and taken[g] is
// how many of the token's top-k group g holds (which of its members is the caller's draw).
template <class OnToken>
void route_tokens(const RouterConfig& cfg, std::int64_t tokens, std::uint64_t state,
                  OnToken&& on_token) {
  const int E = cfg.num_experts, G = cfg.num_groups, k = cfg.topk, used = cfg.group_topk;
  NE_CHECK(G > 0 && E % G == 0 && used > 0 && used <= G,
           "group-limited draw: the groups must split the experts evenly");
  const int n = E / G;             // members per group
  const int per_score = k / used;  // values a group's score sums (router.cpp)
  NE_CHECK(per_score <= n && used * n >= k, "group-limited draw: top-k larger than the groups");
  // A group's values are needed at most as deep as its score and the top-k look.
  const int depth = std::min(n, per_score + k);
  const bool sigmoid = cfg.score == ScoreFunction::Sigmoid;
  const bool exp_scores = cfg.score == ScoreFunction::Softmax && cfg.pre_softmax;
  // A group's score orders groups like the router's: sigmoid scores, softmax scores (a common
  // positive factor exp(-logsumexp) aside, which leaves the order) or the logits themselves.
  const auto score = [&](double x) {
    return sigmoid ? 1.0 / (1.0 + std::exp(-x)) : exp_scores ? std::exp(x) : x;
  };

  Stream rng{{state}};
  const auto per_group = static_cast<std::size_t>(G);
  // A group's drawn values are kept as the logarithms of their uniforms: the merge below only
  // compares them, and the quantile is monotone, so it is taken only for the score's values.
  std::vector<double> log_u(per_group * std::size_t(depth));
  std::vector<int> drawn(per_group);   // values drawn so far per group
  std::vector<int> taken(per_group);   // values the top-k took per group
  std::vector<int> groups(per_group);  // group order, best score first
  std::vector<double> gscore(per_group);

  const auto at = [&](int g, int j) -> double& {
    return log_u[std::size_t(g) * std::size_t(depth) + std::size_t(j)];
  };
  // 1 / (members not yet drawn) for the j-th value: a multiply in the loop instead of a divide.
  std::vector<double> inv_left(static_cast<std::size_t>(depth));
  for (int j = 0; j < depth; ++j) inv_left[std::size_t(j)] = 1.0 / double(n - j);
  const auto draw_next = [&](int g) {
    const int j = drawn[std::size_t(g)]++;
    at(g, j) =
        (j == 0 ? 0.0 : at(g, j - 1)) + std::log(rng.open_uniform()) * inv_left[std::size_t(j)];
  };

  for (std::int64_t t = 0; t < tokens; ++t) {
    for (int g = 0; g < G; ++g) {
      drawn[std::size_t(g)] = taken[std::size_t(g)] = 0;
      double s = 0;
      for (int j = 0; j < per_score; ++j) {
        draw_next(g);
        s += score(normal_quantile_of_log(at(g, j)));
      }
      gscore[std::size_t(g)] = s;
      groups[std::size_t(g)] = g;
    }
    // The best `used` groups, ties to the lower index (as the router's top-k; a tie has
    // probability zero unless per_score is 0, when every group scores 0 and the first win).
    for (int i = 0; i < used; ++i) {
      int best = i;
      for (int x = i + 1; x < G; ++x) {
        const int gx = groups[std::size_t(x)], gb = groups[std::size_t(best)];
        const double sx = gscore[std::size_t(gx)], sb = gscore[std::size_t(gb)];
        if (sx > sb || (sx == sb && gx < gb)) best = x;
      }
      std::swap(groups[std::size_t(i)], groups[std::size_t(best)]);
    }
    // The top-k among the eligible groups: a merge of their descending values, drawing a
    // group's next value when the merge reaches it.
    for (int pick = 0; pick < k; ++pick) {
      int best = -1;
      double best_value = 0;
      for (int i = 0; i < used; ++i) {
        const int g = groups[std::size_t(i)];
        const int j = taken[std::size_t(g)];
        if (j == n) continue;  // every member of the group is taken
        if (j == drawn[std::size_t(g)]) draw_next(g);
        if (best < 0 || at(g, j) > best_value) best = g, best_value = at(g, j);
      }
      ++taken[std::size_t(best)];
    }
    on_token(rng, groups, taken);
  }
}

}  // namespace

std::vector<std::int64_t> group_limited_forced_counts(const RouterConfig& cfg, std::int64_t tokens,
                                                      std::uint64_t state) {
  const int E = cfg.num_experts, n = E / std::max(cfg.num_groups, 1);
  std::vector<std::uint32_t> count(std::size_t(E), 0);
  std::vector<std::uint32_t> mark(std::size_t(E), 0);  // the last token that picked the member
  std::uint32_t token = 0;
  route_tokens(cfg, tokens, state,
               [&](Stream& rng, const std::vector<int>& groups, const std::vector<int>& taken) {
                 // Which members hold a group's largest values: distinct, uniformly random.
                 ++token;
                 for (int i = 0; i < cfg.group_topk; ++i) {
                   const int g = groups[std::size_t(i)];
                   for (int left = taken[std::size_t(g)]; left > 0;) {
                     const std::size_t e =
                         std::size_t(g) * std::size_t(n) + rng.below(std::uint32_t(n));
                     if (mark[e] == token) continue;
                     mark[e] = token;
                     ++count[e];
                     --left;
                   }
                 }
               });
  return {count.begin(), count.end()};
}

double group_picks_second_moment(const RouterConfig& cfg, std::int64_t tokens,
                                 std::uint64_t state) {
  NE_CHECK(tokens > 0, "group_picks_second_moment: no tokens to average over");
  double sum = 0;
  route_tokens(cfg, tokens, state,
               [&](Stream&, const std::vector<int>& groups, const std::vector<int>& taken) {
                 for (int i = 0; i < cfg.group_topk; ++i) {
                   const double m = taken[std::size_t(groups[std::size_t(i)])];
                   sum += m * m;
                 }
               });
  return sum / double(tokens) / double(cfg.num_groups);
}

}  // namespace nodeemu::layers::detail
