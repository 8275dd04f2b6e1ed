#include "layers/detail/uniform_subset_draw.hpp"

#include <immintrin.h>

#include <algorithm>
#include <cstddef>

#include "devices/check.hpp"
#include "layers/detail/splitmix64.hpp"

namespace nodeemu::layers::detail {

namespace {

// The stream is read a block at a time: its words, then their picks, then the picks in order.
constexpr std::size_t kWordsPerBlock = 256;
constexpr std::size_t kPicksPerBlock = 2 * kWordsPerBlock;
// Sentinels after a block's picks, so that a check of up to 16 picks never reads past them.
constexpr std::size_t kPickPadding = 16;

struct Block {
  alignas(64) std::uint64_t words[kWordsPerBlock];
  // Each pick's expert, or `experts` (the sentinel) where the word is rejected.
  alignas(64) std::uint32_t picks[kPicksPerBlock + kPickPadding];
};

// The picks of a block's words: each word's low half, then its high half.
inline void pick_experts(Block& b, std::uint32_t experts) {
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

// The tokens' picks so far. Kept in locals of the drawing function (it is inlined there), so
// the compiler need not reload the counters after every store to the counts: they are all
// 32-bit, and a store through one could alias another in memory.
struct Tally {
  std::uint32_t* count;  // [experts + 1]: the last slot takes nothing
  std::uint32_t* mark;   // [experts + 1]: the last token that picked each expert
  std::uint32_t experts;
  std::uint32_t token;  // numbered from 1, so that a zeroed mark is no token's
  std::uint32_t last;
  int picked;  // the current token's distinct picks
  int k;

  // Takes a pick into the current token, unless it is rejected or a repeat (a repeat is drawn
  // again: every k-set stays equally likely). True once the last token is complete.
  bool take(std::uint32_t e) {
    if (e == experts || mark[e] == token) return false;
    mark[e] = token;
    ++count[e];
    if (++picked < k) return false;
    picked = 0;
    return token++ == last;
  }
  // Takes a whole token's k picks, known to be accepted and distinct. Its marks are not set:
  // the next token has another number, so they would never be read.
  bool take_token(const std::uint32_t* e) {
    for (int q = 0; q < k; ++q) ++count[e[q]];
    return token++ == last;
  }
};

std::vector<std::int64_t> counts_of(const std::vector<std::uint32_t>& count, int experts) {
  return {count.begin(), count.begin() + experts};
}

std::vector<std::int64_t> draw_portable(int experts, int k, std::int64_t tokens,
                                        std::uint64_t state) {
  std::vector<std::uint32_t> count(std::size_t(experts) + 1, 0), mark(count.size(), 0);
  Tally t{count.data(), mark.data(), std::uint32_t(experts), 1, std::uint32_t(tokens), 0, k};
  SplitMix64 stream{state};
  Block b;
  for (;;) {
    for (auto& w : b.words) w = stream.next();
    pick_experts(b, t.experts);
    for (std::size_t i = 0; i < kPicksPerBlock; ++i)
      if (t.take(b.picks[i])) return counts_of(count, experts);
  }
}

#if defined(__x86_64__)
#define NODEEMU_AVX512_DRAW __attribute__((target("avx512f,avx512dq,avx512cd")))

// z >> N per lane. The zero-masking form with every lane kept: GCC 12's unmasked form starts from
// _mm512_undefined_epi32(), which -Wmaybe-uninitialized reports.
template <int N>
NODEEMU_AVX512_DRAW __m512i shift_right(__m512i z) {
  return _mm512_maskz_srli_epi64(__mmask8(0xFF), z, N);
}

// A block of the stream's words, eight at a time: word n is splitmix64_finalise(state + n *
// gamma), so the lanes need nothing from each other.
NODEEMU_AVX512_DRAW void fill_words_avx512(std::uint64_t state, std::uint64_t* words) {
  const __m512i gamma = _mm512_set1_epi64(std::int64_t(kSplitMixGamma));
  const __m512i m1 = _mm512_set1_epi64(std::int64_t(0xbf58476d1ce4e5b9ULL));
  const __m512i m2 = _mm512_set1_epi64(std::int64_t(0x94d049bb133111ebULL));
  const __m512i step = _mm512_set1_epi64(std::int64_t(kSplitMixGamma * 8));
  __m512i x = _mm512_add_epi64(_mm512_set1_epi64(std::int64_t(state)),
                               _mm512_mullo_epi64(_mm512_set_epi64(8, 7, 6, 5, 4, 3, 2, 1), gamma));
  for (std::size_t i = 0; i < kWordsPerBlock; i += 8) {
    __m512i z = _mm512_mullo_epi64(_mm512_xor_si512(x, shift_right<30>(x)), m1);
    z = _mm512_mullo_epi64(_mm512_xor_si512(z, shift_right<27>(z)), m2);
    _mm512_store_si512(words + i, _mm512_xor_si512(z, shift_right<31>(z)));
    x = _mm512_add_epi64(x, step);
  }
}

// As draw_portable, with one more step: at a token's start, its next k picks are checked at
// once for a rejection or a repeat (vpconflictd), and taken together where there is none, as
// for ~80 % of tokens at 128 experts and top-8. The rest go pick by pick, exactly as before.
NODEEMU_AVX512_DRAW std::vector<std::int64_t> draw_avx512(int experts, int k, std::int64_t tokens,
                                                          std::uint64_t state) {
  std::vector<std::uint32_t> count(std::size_t(experts) + 1, 0), mark(count.size(), 0);
  Tally t{count.data(), mark.data(), std::uint32_t(experts), 1, std::uint32_t(tokens), 0, k};
  const bool checks_tokens = k <= 16;
  const auto lanes = __mmask16((1u << std::min(k, 16)) - 1);
  const __m512i sentinel = _mm512_set1_epi32(experts);
  Block b;
  for (std::size_t i = kPicksPerBlock; i < kPicksPerBlock + kPickPadding; ++i)
    b.picks[i] = t.experts;  // a token that runs past the block is never taken at once
  for (;;) {
    fill_words_avx512(state, b.words);
    state += kSplitMixGamma * kWordsPerBlock;
    pick_experts(b, t.experts);
    std::size_t i = 0;
    while (i < kPicksPerBlock) {
      if (checks_tokens && t.picked == 0) {
        const __m512i e = _mm512_maskz_loadu_epi32(lanes, b.picks + i);
        const __m512i earlier_equal = _mm512_maskz_conflict_epi32(lanes, e);
        const __mmask16 bad = _mm512_mask_test_epi32_mask(lanes, earlier_equal, earlier_equal) |
                              _mm512_mask_cmpeq_epi32_mask(lanes, e, sentinel);
        if (bad == 0) {
          if (t.take_token(b.picks + i)) return counts_of(count, experts);
          i += std::size_t(k);
          continue;
        }
      }
      if (t.take(b.picks[i++])) return counts_of(count, experts);
    }
  }
}

bool cpu_has_avx512_draw() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq") &&
         __builtin_cpu_supports("avx512cd");
}
#else
bool cpu_has_avx512_draw() {
  return false;
}
#endif

}  // namespace

bool subset_draw_path_runs_here(SubsetDrawPath path) {
  static const bool avx512 = cpu_has_avx512_draw();
  return path == SubsetDrawPath::Portable || avx512;
}

std::vector<std::int64_t> uniform_subset_counts(int experts, int k, std::int64_t tokens,
                                                std::uint64_t state, SubsetDrawPath path) {
  NE_CHECK(k >= 1 && k <= experts, "uniform subset draw: top-k must be in 1..experts");
  NE_CHECK(tokens >= 0 && tokens < std::int64_t(UINT32_MAX),
           "uniform subset draw: tokens out of range");
  NE_CHECK(subset_draw_path_runs_here(path), "uniform subset draw: a path this CPU cannot run");
  if (tokens == 0) return std::vector<std::int64_t>(std::size_t(experts), 0);
#if defined(__x86_64__)
  if (path == SubsetDrawPath::Avx512) return draw_avx512(experts, k, tokens, state);
#endif
  return draw_portable(experts, k, tokens, state);
}

std::vector<std::int64_t> uniform_subset_counts(int experts, int k, std::int64_t tokens,
                                                std::uint64_t state) {
  const bool fast = subset_draw_path_runs_here(SubsetDrawPath::Avx512);
  return uniform_subset_counts(experts, k, tokens, state,
                               fast ? SubsetDrawPath::Avx512 : SubsetDrawPath::Portable);
}

}  // namespace nodeemu::layers::detail
