// The first output of std::mt19937_64 seeded with one word, without building the generator.
//
// Why: every forced-balance routing draw takes exactly one word from a generator seeded per
// decision (layers/meta_routing.cpp), ~50 k draws in a Qwen3 meta step. Building the generator
// fills 312 state words and its first call twists all of them: ~1 % of the step. The first
// output needs only state words 0, 1 and 156 after seeding (the first twist's first element),
// so this computes those and tempers the result: the same word, a quarter of the work.
// The constants are the standard's mt19937_64 ([rand.predef]).
#pragma once

#include <cstdint>

namespace nodeemu::layers::detail {

constexpr std::uint64_t mt19937_64_first_word(std::uint64_t seed) {
  constexpr std::uint64_t f = 6364136223846793005ULL;
  constexpr std::uint64_t a = 0xb5026f5aa96619e9ULL;
  constexpr std::uint64_t lower = (std::uint64_t(1) << 31) - 1;  // r = 31
  constexpr int m = 156;
  // Seeding: x[i] = f * (x[i-1] ^ (x[i-1] >> 62)) + i.
  std::uint64_t x0 = seed, x1 = 0, x = seed;
  for (std::uint64_t i = 1; i <= std::uint64_t(m); ++i) {
    x = f * (x ^ (x >> 62)) + i;
    if (i == 1) x1 = x;
  }
  // The twist of element 0: its upper bits, element 1's lower bits, then element m.
  const std::uint64_t y = (x0 & ~lower) | (x1 & lower);
  std::uint64_t z = x ^ (y >> 1) ^ ((y & 1) ? a : 0);
  // Tempering (u, d, s, b, t, c, l).
  z ^= (z >> 29) & 0x5555555555555555ULL;
  z ^= (z << 17) & 0x71d67fffeda60000ULL;
  z ^= (z << 37) & 0xfff7eee000000000ULL;
  z ^= z >> 43;
  return z;
}

}  // namespace nodeemu::layers::detail
