// The plain forced-balance draw (layers/detail/uniform_subset_draw.hpp): every code path gives
// the counts of the draw as specified, one stream word at a time, so a faster path can never
// move a meta timeline.
#include "layers/detail/uniform_subset_draw.hpp"

#include <gtest/gtest.h>

#include <cstdio>
#include <numeric>
#include <utility>
#include <vector>

#include "layers/detail/splitmix64.hpp"

namespace nodeemu::layers::detail {
namespace {

// The draw as the header states it, in its plainest form: each stream word's low half, then its
// high half; Lemire's rejection; a repeat within a token drawn again.
std::vector<std::int64_t> reference(int experts, int k, std::int64_t tokens, std::uint64_t state) {
  const auto E = std::uint32_t(experts);
  const std::uint32_t reject_below = std::uint32_t(-E) % E;
  SplitMix64 stream{state};
  std::vector<std::uint32_t> halves;
  std::vector<std::int64_t> count(E, 0);
  for (std::int64_t t = 0; t < tokens; ++t) {
    std::vector<bool> taken(E, false);
    for (int j = 0; j < k;) {
      if (halves.empty()) {
        const std::uint64_t w = stream.next();
        halves = {std::uint32_t(w >> 32), std::uint32_t(w)};  // popped from the back: low first
      }
      const std::uint64_t m = std::uint64_t(halves.back()) * E;
      halves.pop_back();
      if (std::uint32_t(m) < reject_below || taken[m >> 32]) continue;
      taken[m >> 32] = true;
      ++count[m >> 32];
      ++j;
    }
  }
  return count;
}

TEST(UniformSubsetDraw, EveryPathDrawsTheSpecifiedCounts) {
  std::vector<SubsetDrawPath> paths;
  for (const auto path : {SubsetDrawPath::Portable, SubsetDrawPath::Avx2, SubsetDrawPath::Avx512})
    if (subset_draw_path_runs_here(path)) paths.push_back(path);
  if (paths.size() < 3)
    std::printf("this CPU runs %zu of the 3 draw paths: the others are not checked here\n",
                paths.size());
  int cases = 0;
  // Powers of two (no rejection) and not (Lemire's rejection), top-k up to the whole set, token
  // counts that end inside the first block of picks and past many.
  for (int experts : {1, 2, 8, 16, 60, 64, 100, 128, 160, 256, 512})
    for (int k : {1, 2, 6, 8, 10, 16, 17, experts}) {
      if (k > experts) continue;
      for (std::int64_t tokens :
           {std::int64_t(0), std::int64_t(1), std::int64_t(7), std::int64_t(4099)}) {
        const std::uint64_t state = 0x1234567ULL * std::uint64_t(experts * 131 + k) + 99;
        const auto want = reference(experts, k, tokens, state);
        for (const auto path : paths) {
          EXPECT_EQ(uniform_subset_counts(experts, k, tokens, state, path), want)
              << experts << " experts, top-" << k << ", " << tokens << " tokens, path "
              << int(path);
          ++cases;
        }
      }
    }
  EXPECT_GE(cases, 250 * int(paths.size()));  // 73 (experts, top-k) pairs x 4 token counts
}

TEST(UniformSubsetDraw, EachTokenPicksKDistinctExperts) {
  for (const auto& [experts, k] : {std::pair{128, 8}, std::pair{60, 6}, std::pair{16, 16}}) {
    const std::int64_t tokens = 5000;
    const auto counts = uniform_subset_counts(experts, k, tokens, 42);
    EXPECT_EQ(std::accumulate(counts.begin(), counts.end(), std::int64_t(0)), tokens * k);
    for (const auto c : counts) EXPECT_LE(c, tokens) << "an expert picked twice by a token";
    if (k == experts) {
      for (const auto c : counts) EXPECT_EQ(c, tokens);
    }
  }
}

}  // namespace
}  // namespace nodeemu::layers::detail
