#include "layers/kernels/vocab.hpp"

#include <algorithm>
#include <cmath>

#include "layers/kernels/logsumexp.hpp"
#include "layers/kernels/partition.hpp"

namespace nodeemu::layers::kernels {

template <class T>
void embedding_forward(const std::int32_t* ids, const T* table, T* y, std::int64_t tokens,
                       std::int64_t h, VocabShard shard) {
  for_row_blocks(tokens, [&](std::int64_t t) {
    if (!shard.holds(ids[t])) {
      std::fill(y + t * h, y + (t + 1) * h, T(0));
      return;
    }
    const T* row = table + (std::int64_t(ids[t]) - shard.first) * h;
    std::copy(row, row + h, y + t * h);
  });
}

template <class T>
void embedding_wgrad(const std::int32_t* ids, const T* dy, T* dtable, std::int64_t tokens,
                     std::int64_t h, VocabShard shard) {
  for_column_blocks(h, [&](std::int64_t j0, std::int64_t j1) {
    for (std::int64_t t = 0; t < tokens; ++t) {
      if (!shard.holds(ids[t])) continue;
      T* row = dtable + (std::int64_t(ids[t]) - shard.first) * h;
      for (std::int64_t j = j0; j < j1; ++j) row[j] += dy[t * h + j];
    }
  });
}

template <class T>
void shard_logits_max(const T* logits, T* max, std::int64_t tokens, std::int64_t vocab) {
  for_row_blocks(tokens, [&](std::int64_t t) {
    max[t] = *std::max_element(logits + t * vocab, logits + (t + 1) * vocab);
  });
}

template <class T>
void shard_softmax_stats(const T* logits, const T* max, const std::int32_t* targets,
                         VocabShard shard, T* stats, std::int64_t tokens, std::int64_t vocab) {
  for_row_blocks(tokens, [&](std::int64_t t) {
    const T* l = logits + t * vocab;
    T sum = 0;
    for (std::int64_t v = 0; v < vocab; ++v) sum += std::exp(l[v] - max[t]);
    stats[t] = sum;
    stats[tokens + t] = shard.holds(targets[t]) ? l[targets[t] - shard.first] - max[t] : T(0);
  });
}

template <class T>
void shard_cross_entropy(const T* stats, const std::int32_t* targets, T* loss,
                         std::int64_t tokens) {
  for (std::int64_t t = 0; t < tokens; ++t)
    loss[t] = targets[t] < 0 ? T(0) : std::log(stats[t]) - stats[tokens + t];
}

template <class T>
void shard_cross_entropy_backward(const T* logits, const T* max, const T* stats,
                                  const std::int32_t* targets, VocabShard shard, T* dlogits,
                                  std::int64_t tokens, std::int64_t vocab, double scale) {
  for_row_blocks(tokens, [&](std::int64_t t) {
    const T* l = logits + t * vocab;
    T* d = dlogits + t * vocab;
    if (targets[t] < 0) {
      std::fill(d, d + vocab, T(0));
      return;
    }
    for (std::int64_t v = 0; v < vocab; ++v) d[v] = std::exp(l[v] - max[t]) / stats[t] * T(scale);
    if (shard.holds(targets[t])) d[targets[t] - shard.first] -= T(scale);
  });
}

template <class T>
void cross_entropy_forward(const T* logits, const std::int32_t* targets, T* loss,
                           std::int64_t tokens, std::int64_t vocab) {
  for_row_blocks(tokens, [&](std::int64_t t) {
    const T* l = logits + t * vocab;
    loss[t] = targets[t] < 0 ? T(0) : logsumexp(l, vocab) - l[targets[t]];
  });
}

template <class T>
void cross_entropy_backward(const T* logits, const std::int32_t* targets, T* dlogits,
                            std::int64_t tokens, std::int64_t vocab, double scale) {
  for_row_blocks(tokens, [&](std::int64_t t) {
    const T* l = logits + t * vocab;
    T* d = dlogits + t * vocab;
    if (targets[t] < 0) {
      std::fill(d, d + vocab, T(0));
      return;
    }
    const T lse = logsumexp(l, vocab);
    for (std::int64_t v = 0; v < vocab; ++v) d[v] = std::exp(l[v] - lse) * T(scale);
    d[targets[t]] -= T(scale);
  });
}

#define NE_INSTANTIATE(T)                                                                          \
  template void embedding_forward<T>(const std::int32_t*, const T*, T*, std::int64_t,              \
                                     std::int64_t, VocabShard);                                    \
  template void embedding_wgrad<T>(const std::int32_t*, const T*, T*, std::int64_t, std::int64_t,  \
                                   VocabShard);                                                    \
  template void shard_logits_max<T>(const T*, T*, std::int64_t, std::int64_t);                     \
  template void shard_softmax_stats<T>(const T*, const T*, const std::int32_t*, VocabShard, T*,    \
                                       std::int64_t, std::int64_t);                                \
  template void shard_cross_entropy<T>(const T*, const std::int32_t*, T*, std::int64_t);           \
  template void shard_cross_entropy_backward<T>(const T*, const T*, const T*, const std::int32_t*, \
                                                VocabShard, T*, std::int64_t, std::int64_t,        \
                                                double);                                           \
  template void cross_entropy_forward<T>(const T*, const std::int32_t*, T*, std::int64_t,          \
                                         std::int64_t);                                            \
  template void cross_entropy_backward<T>(const T*, const std::int32_t*, T*, std::int64_t,         \
                                          std::int64_t, double);
NE_INSTANTIATE(float)
NE_INSTANTIATE(double)
#undef NE_INSTANTIATE

}  // namespace nodeemu::layers::kernels
