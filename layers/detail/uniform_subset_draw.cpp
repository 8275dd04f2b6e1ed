#include "layers/detail/uniform_subset_draw.hpp"

#include <bit>
#include <cstddef>
#include <cstring>

#include "devices/check.hpp"
#include "layers/detail/splitmix64.hpp"
#include "layers/detail/splitmix64_avx512.hpp"

namespace nodeemu::layers::detail {

namespace {

// The stream is read a block at a time: its words, then their picks, then the picks in order.
constexpr std::size_t kWordsPerBlock = 256;
constexpr std::size_t kPicksPerBlock = 2 * kWordsPerBlock;

struct Block {
  alignas(64) std::uint64_t words[kWordsPerBlock];
  // Each pick's expert, or `experts` (the sentinel) where the word is rejected.
  alignas(64) std::uint32_t picks[kPicksPerBlock];
};

// The picks of a block's words: each word's low half, then its high half.
inline void pick_experts(Block& b, std::uint32_t experts) {
  if ((experts & (experts - 1)) == 0) {
    // A power of two: (w * E) >> 32 is w's top log2(E) bits, 2^32 mod E is 0 (nothing is
    // rejected), and the picks in order are the words' halves in memory order, low first.
    const int keep = std::countr_zero(experts);
    if (keep == 0) {
      std::memset(b.picks, 0, sizeof b.picks);
      return;
    }
    const auto* halves = reinterpret_cast<const unsigned char*>(b.words);
    for (std::size_t i = 0; i < kPicksPerBlock; ++i) {
      std::uint32_t w;
      std::memcpy(&w, halves + 4 * i, 4);
      b.picks[i] = w >> (32 - keep);
    }
    return;
  }
  const std::uint32_t reject_below = std::uint32_t(-experts) % experts;  // 2^32 mod E
  const auto pick = [&](std::uint32_t w) {
    const std::uint64_t m = std::uint64_t(w) * experts;
    return std::uint32_t(m) < reject_below ? experts : std::uint32_t(m >> 32);
  };
  for (std::size_t i = 0; i < kWordsPerBlock; ++i) {
    b.picks[2 * i] = pick(std::uint32_t(b.words[i]));
    b.picks[2 * i + 1] = pick(std::uint32_t(b.words[i] >> 32));
  }
}

// The tokens' picks so far. A local of draw() (its methods are inlined there), so the compiler
// keeps the counters in registers: through a pointer it would reload them after every store to
// the counts, which are 32-bit too and could alias them.
struct Tally {
  // Per expert, side by side (one address for both): the last token that picked it and its
  // count. [experts + 1]: the sentinel's (a rejected pick's) mark is always the current token,
  // so that one test finds a rejection or a repeat.
  struct Expert {
    std::uint32_t mark;
    std::uint32_t count;
  };
  Expert* expert;
  std::uint32_t experts;
  std::uint32_t token;  // numbered from 1, so that a zeroed mark is no token's
  std::uint32_t last;
  int picked;  // the current token's distinct picks
  int k;

  // Takes a pick into the current token, unless it is rejected or a repeat (a repeat is drawn
  // again: every k-set stays equally likely). True once the last token is complete.
  bool take(std::uint32_t e) {
    Expert& x = expert[e];
    if (x.mark == token) return false;
    x.mark = token;
    ++x.count;
    if (++picked < k) return false;
    picked = 0;
    expert[experts].mark = token + 1;
    return token++ == last;
  }
};

// A block of the stream, words and picks: word n of the stream that starts at `state` is
// splitmix64_finalise(state + n * gamma), n = 1, 2, ...
using FillBlock = void (*)(std::uint64_t state, std::uint32_t experts, Block& b);

inline void fill_block_portable(std::uint64_t state, std::uint32_t experts, Block& b) {
  SplitMix64 stream{state};
  for (auto& w : b.words) w = stream.next();
  pick_experts(b, experts);
}

std::vector<std::int64_t> draw(int experts, int k, std::int64_t tokens, std::uint64_t state,
                               FillBlock fill_block) {
  // The counts and marks of this thread's last draw, cleared: a meta step makes ~50 k draws,
  // and two fresh vectors each were two of its allocations.
  thread_local std::vector<Tally::Expert> scratch;
  scratch.assign(std::size_t(experts) + 1, {0, 0});
  Tally t{scratch.data(), std::uint32_t(experts), 1, std::uint32_t(tokens), 0, k};
  t.expert[experts].mark = t.token;
  Block b;
  for (;;) {
    fill_block(state, t.experts, b);
    state += kSplitMixGamma * kWordsPerBlock;
    for (std::size_t i = 0; i < kPicksPerBlock; ++i)
      if (t.take(b.picks[i])) {
        std::vector<std::int64_t> counts(static_cast<std::size_t>(experts));
        for (std::size_t e = 0; e < counts.size(); ++e) counts[e] = t.expert[e].count;
        return counts;
      }
  }
}

#if defined(__x86_64__)
#define NODEEMU_AVX512_DRAW NODEEMU_TARGET_AVX512_F_DQ

// fill_block_portable with the words made eight at a time (they need nothing from each other),
// and the picks vectorised for AVX-512 (inlined here). Also tried: a token's k picks checked for
// a repeat at once with vpconflictd, and taken together where there is none (~80 % of tokens at
// 128 experts and top-8): no faster on Zen 4, and Intel microcodes vpconflictd. Not kept.
NODEEMU_AVX512_DRAW void fill_block_avx512(std::uint64_t state, std::uint32_t experts, Block& b) {
  const __m512i gamma = _mm512_set1_epi64(std::int64_t(kSplitMixGamma));
  const __m512i step = _mm512_set1_epi64(std::int64_t(kSplitMixGamma * 8));
  __m512i x = _mm512_add_epi64(_mm512_set1_epi64(std::int64_t(state)),
                               _mm512_mullo_epi64(_mm512_set_epi64(8, 7, 6, 5, 4, 3, 2, 1), gamma));
  for (std::size_t i = 0; i < kWordsPerBlock; i += 8) {
    _mm512_store_si512(b.words + i, splitmix64_finalise_x8(x));
    x = _mm512_add_epi64(x, step);
  }
  pick_experts(b, experts);
}

// fill_block_portable, its picks vectorised for AVX2 (inlined here). Making the words four at a
// time with AVX2 (a 64-bit multiply from three 32-bit ones) was no faster.
__attribute__((target("avx2"))) void fill_block_avx2(std::uint64_t state, std::uint32_t experts,
                                                     Block& b) {
  fill_block_portable(state, experts, b);
}

bool cpu_runs(SubsetDrawPath path) {
  __builtin_cpu_init();
  switch (path) {
    case SubsetDrawPath::Portable:
      return true;
    case SubsetDrawPath::Avx2:
      return __builtin_cpu_supports("avx2");
    case SubsetDrawPath::Avx512:
      return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq");
  }
  return false;
}
#else
bool cpu_runs(SubsetDrawPath path) {
  return path == SubsetDrawPath::Portable;
}
#endif

}  // namespace

bool subset_draw_path_runs_here(SubsetDrawPath path) {
  static const bool avx2 = cpu_runs(SubsetDrawPath::Avx2);
  static const bool avx512 = cpu_runs(SubsetDrawPath::Avx512);
  return path == SubsetDrawPath::Portable || (path == SubsetDrawPath::Avx2 ? avx2 : avx512);
}

std::vector<std::int64_t> uniform_subset_counts(int experts, int k, std::int64_t tokens,
                                                std::uint64_t state, SubsetDrawPath path) {
  NE_CHECK(k >= 1 && k <= experts, "uniform subset draw: top-k must be in 1..experts");
  NE_CHECK(tokens >= 0 && tokens < std::int64_t(UINT32_MAX),
           "uniform subset draw: tokens out of range");
  NE_CHECK(subset_draw_path_runs_here(path), "uniform subset draw: a path this CPU cannot run");
  if (tokens == 0) return std::vector<std::int64_t>(std::size_t(experts), 0);
#if defined(__x86_64__)
  if (path == SubsetDrawPath::Avx512) return draw(experts, k, tokens, state, fill_block_avx512);
  if (path == SubsetDrawPath::Avx2) return draw(experts, k, tokens, state, fill_block_avx2);
#endif
  return draw(experts, k, tokens, state, fill_block_portable);
}

std::vector<std::int64_t> uniform_subset_counts(int experts, int k, std::int64_t tokens,
                                                std::uint64_t state) {
  static const SubsetDrawPath fastest =
      subset_draw_path_runs_here(SubsetDrawPath::Avx512) ? SubsetDrawPath::Avx512
      : subset_draw_path_runs_here(SubsetDrawPath::Avx2) ? SubsetDrawPath::Avx2
                                                         : SubsetDrawPath::Portable;
  return uniform_subset_counts(experts, k, tokens, state, fastest);
}

}  // namespace nodeemu::layers::detail
