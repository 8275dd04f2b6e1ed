// The token shuffles around the experts, as device kernels: Megatron's permute / unpermute and
// the sort by local expert (REFERENCE §2). A "slot" names one (token, top-k choice) pair as
// token * topk + choice; a row that carries slot s came from token s / topk.
#pragma once
#include <cstdint>
#include <vector>

#include "layers/ops.hpp"

namespace nodeemu::layers {

struct Sorted {
  Tensor rows;   // [n][h]: the input's rows, one per kept (token, expert) pair
  Tensor probs;  // f32 [n]
  Tensor slots;  // int32 [n]: token * topk + choice, -1 for padding rows
};

// Rows grouped by expert for experts [first, first + count), token order within an expert:
// for each slot whose idx is in range, its token's row of x and its probability. With `pad`
// > 0 every expert gets exactly `pad` rows (zero rows, probability 0, slot -1 after its own).
// `total` (the output rows) must be host-known: the caller got it from the dispatcher's counts.
Sorted sort_by_expert(ops::At at, const std::string& name, const Tensor& x, const Tensor& idx,
                      const Tensor& probs, int topk, std::int64_t first, std::int64_t count,
                      std::int64_t pad, std::int64_t total);

// HybridEP's permute in its sync-free mode (a non_blocking dispatch_with_permute given
// num_permuted_tokens; the token-drop path of hybrid_ep_backend.cuh's preprocessing kernel): the
// rows of experts [0, count) into `budget` rows, in sort_by_expert's order. Expert e's rows start
// after the previous experts' pairs, each expert's padded to `align`; a pair whose place would be
// at or past the budget is dropped. Worked out on the device: `rows` gets each expert's kept
// pairs padded to `align` (int64 [count]: what the grouped GEMM reads), and `overflow` (int32
// [1]) is set to 1 when a pair was dropped (never cleared here: Megatron or-s it into
// over_budget until the step's check).
Sorted sort_within_budget(ops::At at, const std::string& name, const Tensor& x, const Tensor& idx,
                          const Tensor& probs, int topk, std::int64_t count, std::int64_t align,
                          std::int64_t budget, Tensor& rows, const Tensor& overflow);

// The reverse: out[s / topk] += rows[i] for every row i with slot s >= 0, in row order, summed
// in fp32. With `probs` (fp32 [n]) the output is [tokens][h + topk] and column h + s % topk of
// token s / topk receives probs[i] (how the probabilities' gradients travel back). The sum is
// stored in `out` (fp32 unless given; only fp32 with `probs`). `into`: zero-filled memory of the
// output's size to write into (a library's buffer), rather than a new allocation.
Tensor unpermute(ops::At at, const std::string& name, const Tensor& rows, const Tensor& probs,
                 const Tensor& slots, int topk, std::int64_t tokens, DType out = DType::F32,
                 const Buffer& into = {});

// fp32 [tokens][topk]: column s % topk of row s / topk holds probs[i] for every row i with slot
// s >= 0, zero elsewhere (the probabilities' gradients, placed where their choice was). `into`
// as for unpermute.
Tensor scatter_probs(ops::At at, const std::string& name, const Tensor& probs, const Tensor& slots,
                     int topk, std::int64_t tokens, const Buffer& into = {});

// out[i] = src[slots[i] / topk] (zero for slot -1): unpermute's backward. out has src's type.
Tensor gather_rows(ops::At at, const std::string& name, const Tensor& src, const Tensor& slots,
                   int topk);

// A host-known reordering of row blocks: out rows [dst, dst + n) = in rows [src, src + n).
struct RowBlock {
  std::int64_t src, dst, n;
};
Tensor permute_blocks(ops::At at, const std::string& name, const Tensor& in,
                      const std::vector<RowBlock>& blocks);
// The inverse reordering of the same blocks.
std::vector<RowBlock> inverse(const std::vector<RowBlock>& blocks);

// Splits [tokens][h + topk] fp32 into the hidden gradient (`dtype`) and fp32 [tokens][topk].
void split_packed(ops::At at, const std::string& name, const Tensor& packed, std::int64_t h,
                  int topk, DType dtype, Tensor& hidden, Tensor& probs);

// Kept pairs per expert in [first, first + count) of an idx table [rows][topk] (host-side,
// after the host has synchronized on it).
std::vector<std::int64_t> count_per_expert(const std::int64_t* idx, std::int64_t rows, int topk,
                                           std::int64_t first, std::int64_t count);
// The counts round-robin routing (moe_router_force_load_balancing) gives `tokens` tokens.
std::vector<std::int64_t> balanced_counts(std::int64_t tokens, int topk, std::int64_t experts);

}  // namespace nodeemu::layers
