// Internal (layers/meta_routing.cpp): meta mode's forced-balance draw for a plain top-k router.
//
// Plain top-k of iid continuous scores (softmax and sigmoid keep the order) picks a uniformly
// random set of k of the E experts per token. It is drawn directly, expert by expert without
// replacement (a repeat is drawn again, which keeps every set equally likely), from the
// splitmix64 stream (layers/detail/splitmix64.hpp): each 64-bit word gives two 32-bit picks,
// its low half first, and a pick w maps to expert (w * E) >> 32, drawn again while the low half
// of w * E is below 2^32 mod E (Lemire's rejection step: exactly uniform). Drawing the E logits
// per token would cost E / k times more.
//
// The counts feed every meta-mode timeline (the all-to-all splits and each expert's GEMM), and
// MetaRouting.ForcedDrawsArePinned pins them: every SubsetDrawPath gives the same counts.
#pragma once
#include <cstdint>
#include <vector>

namespace nodeemu::layers::detail {

// Picks per expert (each at most `tokens`, summing to tokens * k) for `tokens` tokens, each
// picking k distinct of `experts` experts, from the stream that starts at `state`.
// Requires 1 <= k <= experts.
std::vector<std::int64_t> uniform_subset_counts(int experts, int k, std::int64_t tokens,
                                                std::uint64_t state);

// The code paths, for tests and benchmarks: uniform_subset_counts takes the fastest one this
// CPU runs. Every path gives the same counts.
enum class SubsetDrawPath {
  Portable,  // any CPU
  Avx2,      // the picks made eight at a time
  Avx512,    // AVX-512 F/DQ: the stream's words eight at a time, its picks sixteen
};
bool subset_draw_path_runs_here(SubsetDrawPath path);
std::vector<std::int64_t> uniform_subset_counts(int experts, int k, std::int64_t tokens,
                                                std::uint64_t state, SubsetDrawPath path);

}  // namespace nodeemu::layers::detail
