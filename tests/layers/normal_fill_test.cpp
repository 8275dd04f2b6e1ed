// A weight's initial values (layers/detail/normal_fill.hpp): every code path gives the bits of
// float(std * counter_normal(...)), value by value, so a faster path can never move a numerics
// hash; and the vector path is really taken, not left to its fallback.
#include "layers/detail/normal_fill.hpp"

#include <gtest/gtest.h>

#include <bit>
#include <cstdint>
#include <vector>

#include "layers/parameter.hpp"

namespace nodeemu::layers::detail {
namespace {

struct Case {
  std::uint64_t seed, stream;
  double std;
  std::function<std::int64_t(std::int64_t)> global;
  std::int64_t first;
  std::size_t n;  // not a multiple of eight: the tail too
};

std::vector<Case> cases() {
  return {
      {1234, name_hash("decoder.layers.0.mlp.linear_fc1.weight"), 0.02,
       [](std::int64_t i) { return i; }, 0, 1'000'003},
      {7, name_hash("embedding.word_embeddings.weight"), 1.0,
       [](std::int64_t i) { return 10'000'000'000 + i; }, 5, 1'000'001},
      // A column shard of a [rows][4096] weight (what tensor parallelism hands a rank).
      {99, 3, 0.00625, [](std::int64_t i) { return (i / 1024) * 4096 + 2048 + i % 1024; }, 0,
       1'000'007},
      {0, 0, 0.5, [](std::int64_t i) { return 3 * i + 1; }, 17, 999'999},
  };
}

std::vector<float> expected(const Case& c) {
  std::vector<float> v(c.n);
  for (std::size_t i = 0; i < c.n; ++i)
    v[i] = float(c.std * counter_normal(c.seed, c.stream,
                                        std::uint64_t(c.global(c.first + std::int64_t(i)))));
  return v;
}

TEST(NormalFill, EveryPathGivesCounterNormalsBits) {
  for (const NormalFillPath path : {NormalFillPath::Portable, NormalFillPath::Avx512}) {
    if (!normal_fill_path_runs_here(path)) continue;
    for (const Case& c : cases()) {
      const std::vector<float> want = expected(c);
      std::vector<float> got(c.n);
      fill_counter_normals(c.seed, c.stream, c.std, c.global, c.first, c.n, got.data(), path);
      std::size_t differ = 0;
      for (std::size_t i = 0; i < c.n; ++i)
        if (std::bit_cast<std::uint32_t>(got[i]) != std::bit_cast<std::uint32_t>(want[i])) {
          if (++differ <= 5)
            ADD_FAILURE() << "path " << int(path) << ", value " << i << ": " << got[i]
                          << " instead of " << want[i];
        }
      EXPECT_EQ(differ, 0u) << "path " << int(path) << ", seed " << c.seed;
    }
  }
}

TEST(NormalFill, TheVectorPathDrawsAlmostEveryValueItself) {
  if (!normal_fill_path_runs_here(NormalFillPath::Avx512))
    GTEST_SKIP() << "this CPU has no AVX-512 F/DQ";
  for (const Case& c : cases()) {
    std::vector<float> got(c.n);
    const std::size_t slow = fill_counter_normals(c.seed, c.stream, c.std, c.global, c.first, c.n,
                                                  got.data(), NormalFillPath::Avx512);
    // About one in 40,000 lies too near an fp32 rounding point to keep the fast result.
    EXPECT_LT(slow, c.n / 5000) << "seed " << c.seed;
    EXPECT_GT(slow, 0u) << "seed " << c.seed << ": no value near a rounding point in a million?";
  }
  const Case c = cases().front();  // a copy: cases() is a temporary
  std::vector<float> got(c.n);
  EXPECT_EQ(fill_counter_normals(c.seed, c.stream, c.std, c.global, c.first, c.n, got.data(),
                                 NormalFillPath::Portable),
            c.n);
}

}  // namespace
}  // namespace nodeemu::layers::detail
