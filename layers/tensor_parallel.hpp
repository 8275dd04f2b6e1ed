// Tensor parallelism with sequence parallelism, as Megatron-Core lays it out
// (megatron/core/tensor_parallel/layers.py ColumnParallelLinear / RowParallelLinear,
// mappings.py):
//
//   - Between the blocks, activations are split along the tokens: each TP rank holds rows
//     [rank * T / tp, (rank + 1) * T / tp) of the micro-batch's [batch * seq] tokens.
//   - A column-parallel linear (QKV, fc1 of the dense MLP and of the shared experts, the output
//     layer) all-gathers its input first (gather_from_sequence_parallel_region) and holds
//     out/tp of the output features; its backward reduce-scatters the input gradient.
//   - A row-parallel linear (the attention projection, fc2) holds in/tp of the input features,
//     and its partial output is reduce-scattered back to the token split
//     (reduce_scatter_to_sequence_parallel_region); its backward all-gathers the gradient.
//   - The vocabulary is split over TP: the embedding's partial rows are reduce-scattered, and
//     the cross-entropy reduces its per-token statistics over the group
//     (cross_entropy.py _VocabParallelCrossEntropy).
//
// Where Megatron's layout differs: Megatron's activations are [seq, batch, hidden], so its split
// is along the sequence of every sample; NodeEmu's are [batch * seq, hidden] and the split is of
// that order. The two agree for micro_batch_size 1 (every MoE recipe here); with more, the same
// tokens are grouped differently over the ranks, which changes no result of the step except
// which tokens a capacity factor drops (capacity is per rank, on its own tokens).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "comm/group.hpp"
#include "layers/ops.hpp"
#include "layers/parameter.hpp"

namespace nodeemu::layers {

// This rank's place in its TP group. Size 1 (the default) is no tensor parallelism; the group
// is then not used and may be empty.
struct TensorParallel {
  Group group;
  int size = 1;
  int rank = 0;
  bool on() const { return size > 1; }
  // The TP group of `rank` in `group` (which must hold it).
  static TensorParallel of(Group group, int rank);
};

// Where a column-parallel shard's elements sit in the whole [sum(segments)][in] weight: the
// output features are segments ([q | k | v] heads, [gate | up]), each split over TP, and the
// shard holds its part of every segment, in segment order.
ShardIndex column_shard(const std::vector<std::int64_t>& segments, std::int64_t in,
                        const TensorParallel& tp);
// A row-parallel shard of a whole [out][in] weight: columns [rank * in / tp, ...) of every row.
ShardIndex row_shard(std::int64_t in, const TensorParallel& tp);

// The token split's all-gather: [rows][h] on each rank -> [tp * rows][h], rank order.
Tensor gather_tokens(ops::At at, const TensorParallel& tp, const Tensor& x, const char* name);
// The reduce-scatter back to the token split: [rows][h] partial sums -> [rows / tp][h], summed in
// rank order in the tensor's type (fp32 or bf16).
Tensor scatter_tokens(ops::At at, const TensorParallel& tp, const Tensor& x, const char* name);

// A column-parallel output gathered along its features and split back to the tokens (MTP's
// eh_proj: gather_from_tensor_model_parallel_region, then scatter_to_sequence_parallel_region):
// [T][H / tp] for every token -> [T / tp][H] for this rank's. One all-gather, then a local
// reordering.
Tensor features_to_tokens(ops::At at, const TensorParallel& tp, const Tensor& x, const char* name);
// Its backward: [T / tp][H] -> [T][H / tp] (the tokens all-gathered, this rank's columns kept).
Tensor tokens_to_features(ops::At at, const TensorParallel& tp, const Tensor& g, const char* name);

}  // namespace nodeemu::layers
