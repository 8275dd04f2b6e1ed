#include "layers/kernels/vocab.hpp"

#include <algorithm>
#include <cmath>

#include "layers/kernels/logsumexp.hpp"
#include "layers/kernels/partition.hpp"

namespace nodeemu::layers::kernels {

template <class T>
void embedding_forward(const std::int32_t* ids, const T* table, T* y, std::int64_t tokens,
                       std::int64_t h) {
  for_row_blocks(tokens, [&](std::int64_t t) {
    std::copy(table + std::int64_t(ids[t]) * h, table + (std::int64_t(ids[t]) + 1) * h, y + t * h);
  });
}

template <class T>
void embedding_wgrad(const std::int32_t* ids, const T* dy, T* dtable, std::int64_t tokens,
                     std::int64_t h) {
  for_column_blocks(h, [&](std::int64_t j0, std::int64_t j1) {
    for (std::int64_t t = 0; t < tokens; ++t) {
      T* row = dtable + std::int64_t(ids[t]) * h;
      for (std::int64_t j = j0; j < j1; ++j) row[j] += dy[t * h + j];
    }
  });
}

template <class T>
void cross_entropy_forward(const T* logits, const std::int32_t* targets, T* loss,
                           std::int64_t tokens, std::int64_t vocab) {
  for_row_blocks(tokens, [&](std::int64_t t) {
    const T* l = logits + t * vocab;
    loss[t] = logsumexp(l, vocab) - l[targets[t]];
  });
}

template <class T>
void cross_entropy_backward(const T* logits, const std::int32_t* targets, T* dlogits,
                            std::int64_t tokens, std::int64_t vocab, double scale) {
  for_row_blocks(tokens, [&](std::int64_t t) {
    const T* l = logits + t * vocab;
    const T lse = logsumexp(l, vocab);
    T* d = dlogits + t * vocab;
    for (std::int64_t v = 0; v < vocab; ++v) d[v] = std::exp(l[v] - lse) * T(scale);
    d[targets[t]] -= T(scale);
  });
}

#define NE_INSTANTIATE(T)                                                                          \
  template void embedding_forward<T>(const std::int32_t*, const T*, T*, std::int64_t,              \
                                     std::int64_t);                                                \
  template void embedding_wgrad<T>(const std::int32_t*, const T*, T*, std::int64_t, std::int64_t); \
  template void cross_entropy_forward<T>(const T*, const std::int32_t*, T*, std::int64_t,          \
                                         std::int64_t);                                            \
  template void cross_entropy_backward<T>(const T*, const std::int32_t*, T*, std::int64_t,         \
                                          std::int64_t, double);
NE_INSTANTIATE(float)
NE_INSTANTIATE(double)
#undef NE_INSTANTIATE

}  // namespace nodeemu::layers::kernels
