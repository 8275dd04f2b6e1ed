#include "layers/detail/central_limit_counts.hpp"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "devices/check.hpp"
#include "layers/detail/largest_remainder.hpp"
#include "layers/detail/splitmix64.hpp"

namespace nodeemu::layers::detail {

namespace {

// Standard normals by Box and Muller's transform, two per pair of uniforms.
class Normals {
 public:
  explicit Normals(std::uint64_t state) : stream_{state} {}
  double next() {
    if (has_spare_) {
      has_spare_ = false;
      return spare_;
    }
    const double r = std::sqrt(-2.0 * std::log(open_uniform()));
    const double angle = 2.0 * std::numbers::pi * open_uniform();
    spare_ = r * std::sin(angle);
    has_spare_ = true;
    return r * std::cos(angle);
  }

 private:
  // Uniform on (0, 1): the midpoints of 2^53 cells, so the logarithm is finite.
  double open_uniform() { return (double(stream_.next() >> 11) + 0.5) * 0x1.0p-53; }
  SplitMix64 stream_;
  bool has_spare_ = false;
  double spare_ = 0;
};

// values[i] = mean + sd * (z_i - mean of the z), for `count` fresh normals: a draw with the
// covariance sd^2 (I - J / count), whose values sum to count * mean.
void centred_normals(Normals& z, double mean, double sd, double* values, int count) {
  double zbar = 0;
  for (int i = 0; i < count; ++i) zbar += values[i] = z.next();
  zbar /= count;
  for (int i = 0; i < count; ++i) values[i] = mean + sd * (values[i] - zbar);
}

}  // namespace

std::vector<std::int64_t> central_limit_counts(const TokenPickMoments& m, std::int64_t tokens,
                                               std::uint64_t state) {
  const int E = m.experts, G = m.groups, k = m.topk;
  NE_CHECK(E > 0 && G > 0 && E % G == 0 && k > 0 && k <= E && tokens >= 0,
           "central-limit draw: the groups must split the experts and top-k fit them");
  const int n = E / G;
  const double T = double(tokens), share = double(k) / G;  // E[S]
  const double v = std::max(0.0, m.group_picks_second_moment - share * share);
  const double group_sd = G > 1 ? std::sqrt(T * v * G / (G - 1.0)) : 0.0;
  const double member_variance = std::max(0.0, T * (n * share - m.group_picks_second_moment));
  const double member_sd = n > 1 ? std::sqrt(member_variance / (n * (n - 1.0))) : 0.0;

  Normals z(state);
  std::vector<double> group_total(static_cast<std::size_t>(G));
  centred_normals(z, T * share, group_sd, group_total.data(), G);
  std::vector<double> want(static_cast<std::size_t>(E));
  for (int g = 0; g < G; ++g)
    centred_normals(z, group_total[std::size_t(g)] / n, member_sd,
                    want.data() + std::size_t(g) * std::size_t(n), n);
  return round_to_total(want, tokens * k, tokens);
}

}  // namespace nodeemu::layers::detail
