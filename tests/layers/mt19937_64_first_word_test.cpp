// The first word of std::mt19937_64 computed without the generator
// (layers/detail/mt19937_64_first_word.hpp): the forced-balance draws take it as their seed, so
// it must be the standard generator's own first output for every seed, or every pinned draw and
// meta timeline would move.
#include "layers/detail/mt19937_64_first_word.hpp"

#include <gtest/gtest.h>

#include <cstdint>
#include <random>

#include "layers/detail/splitmix64.hpp"

namespace nodeemu::layers::detail {
namespace {

TEST(Mt19937FirstWord, IsTheStandardGeneratorsFirstOutputForEverySeed) {
  // The standard's own check value ([rand.predef]: the 10000th output of the default seed) does
  // not apply to the first, so the generator itself is the reference: edge seeds, then 100 k
  // seeds spread over the whole 64-bit range.
  for (std::uint64_t seed : {std::uint64_t(0), std::uint64_t(1), std::uint64_t(5489),
                             std::uint64_t(1) << 63, ~std::uint64_t(0), ~std::uint64_t(0) - 1})
    EXPECT_EQ(mt19937_64_first_word(seed), std::mt19937_64(seed)()) << "seed " << seed;
  SplitMix64 seeds{12345};
  int mismatches = 0;
  for (int i = 0; i < 100000; ++i) {
    const std::uint64_t seed = seeds.next();
    mismatches += mt19937_64_first_word(seed) != std::mt19937_64(seed)();
  }
  EXPECT_EQ(mismatches, 0);
  static_assert(mt19937_64_first_word(5489) == 14514284786278117030ULL,
                "the default-seeded mt19937_64's first output");
}

}  // namespace
}  // namespace nodeemu::layers::detail
