// The GEMM interface's promises that the model's numerics rest on.
#include "layers/gemm.hpp"

#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <vector>

namespace nodeemu::layers {
namespace {

std::vector<float> normal(std::size_t n, unsigned seed) {
  std::mt19937 g(seed);
  std::normal_distribution<float> d(0, 1);
  std::vector<float> v(n);
  for (auto& x : v) x = d(g);
  return v;
}

// A forward on each group's weight stored transposed ([in][out]) gives the bits of the forward on
// [out][in], so a kept transposed copy (layers/transposed_weight_copy.hpp) cannot change a
// numerics hash: groups of no rows, fewer rows than a chunk and more, and widths below, at and
// above the kernels' register blocks.
TEST(GroupedLinear, ForwardOnTransposedWeightsGivesTheSameBits) {
  unsigned seed = 1;
  for (const std::vector<std::int64_t>& rows :
       {std::vector<std::int64_t>{1}, {0, 7, 3}, {128, 128, 128, 128}, {300, 0, 33}})
    for (std::int64_t in : {8, 24, 128, 320})
      for (std::int64_t out : {16, 40, 256}) {
        std::int64_t total = 0;
        for (auto r : rows) total += r;
        const std::int64_t groups = std::int64_t(rows.size());
        const auto x = normal(std::size_t(total * in), seed++);
        const auto w = normal(std::size_t(groups * out * in), seed++);
        std::vector<float> wt(w.size()), y(std::size_t(total * out)), yt(y.size(), -1.0f);
        for (std::int64_t g = 0; g < groups; ++g)
          for (std::int64_t o = 0; o < out; ++o)
            for (std::int64_t i = 0; i < in; ++i)
              wt[std::size_t((g * in + i) * out + o)] = w[std::size_t((g * out + o) * in + i)];
        grouped_linear_forward(x.data(), w.data(), y.data(), rows, in, out);
        grouped_linear_forward_transposed(x.data(), wt.data(), yt.data(), rows, in, out);
        ASSERT_EQ(std::memcmp(y.data(), yt.data(), y.size() * sizeof(float)), 0)
            << rows.size() << " groups, " << total << " rows, " << in << " -> " << out;
      }
}

}  // namespace
}  // namespace nodeemu::layers
