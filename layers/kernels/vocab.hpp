// The ends of the model: the embedding lookup, and cross-entropy on the output layer's logits
// (the output layer itself is a plain linear layer, layers/gemm.hpp). Loss math is fp32 or wider.
#pragma once
#include <climits>
#include <cstdint>

namespace nodeemu::layers::kernels {

// The rows of the vocabulary a table or a logits shard holds: [first, first + rows) (TP splits
// the vocabulary, VocabParallelEmbedding and the output layer).
struct VocabShard {
  std::int64_t first = 0;
  std::int64_t rows = INT64_MAX;
  bool holds(std::int64_t id) const { return id >= first && id - first < rows; }
};

// y[t] = table[ids[t] - first], or zeros for an id outside the shard; table: [rows][h].
template <class T>
void embedding_forward(const std::int32_t* ids, const T* table, T* y, std::int64_t tokens,
                       std::int64_t h, VocabShard shard = {});
// dtable[ids[t] - first] += dy[t] for the shard's ids, tokens in order for every column (no
// atomics, a fixed order).
template <class T>
void embedding_wgrad(const std::int32_t* ids, const T* dy, T* dtable, std::int64_t tokens,
                     std::int64_t h, VocabShard shard = {});

// A target below 0 (kIgnoreTarget) is a masked position (Megatron's loss_mask 0: multi-token
// prediction's rolled-out tail): no loss and no gradient.
inline constexpr std::int32_t kIgnoreTarget = -1;

// The cross-entropy over a vocabulary split in shards (Megatron's _VocabParallelCrossEntropy):
// each shard's maximum logit per token, reduced (max) over the shards; then each shard's
// sum of exp(logit - max) and its target logit minus max (0 when the target is elsewhere),
// reduced (sum); then the loss, and the gradient of each shard's logits.
template <class T>
void shard_logits_max(const T* logits, T* max, std::int64_t tokens, std::int64_t vocab);
// stats: [2][tokens]: sum of exps, then target logit - max.
template <class T>
void shard_softmax_stats(const T* logits, const T* max, const std::int32_t* targets,
                         VocabShard shard, T* stats, std::int64_t tokens, std::int64_t vocab);
// loss[t] = log(sum of exps) - (target logit - max), from the reduced stats.
template <class T>
void shard_cross_entropy(const T* stats, const std::int32_t* targets, T* loss, std::int64_t tokens);
// dlogits[t] = (exp(logit - max) / sum - onehot(target)) * scale, for the shard's columns.
template <class T>
void shard_cross_entropy_backward(const T* logits, const T* max, const T* stats,
                                  const std::int32_t* targets, VocabShard shard, T* dlogits,
                                  std::int64_t tokens, std::int64_t vocab, double scale);

// loss[t] = logsumexp(logits[t]) - logits[t][targets[t]].
template <class T>
void cross_entropy_forward(const T* logits, const std::int32_t* targets, T* loss,
                           std::int64_t tokens, std::int64_t vocab);
// dlogits[t] = (softmax(logits[t]) - onehot(targets[t])) * scale.
template <class T>
void cross_entropy_backward(const T* logits, const std::int32_t* targets, T* dlogits,
                            std::int64_t tokens, std::int64_t vocab, double scale);

}  // namespace nodeemu::layers::kernels
