// The ends of the model: the embedding lookup, and cross-entropy on the output layer's logits
// (the output layer itself is a plain linear layer, layers/gemm.hpp). Loss math is fp32 or wider.
#pragma once
#include <cstdint>

namespace nodeemu::layers::kernels {

// y[t] = table[ids[t]]; table: [vocab][h].
template <class T>
void embedding_forward(const std::int32_t* ids, const T* table, T* y, std::int64_t tokens,
                       std::int64_t h);
// dtable[ids[t]] += dy[t], tokens in order for every column (no atomics, a fixed order).
template <class T>
void embedding_wgrad(const std::int32_t* ids, const T* dy, T* dtable, std::int64_t tokens,
                     std::int64_t h);

// loss[t] = logsumexp(logits[t]) - logits[t][targets[t]].
template <class T>
void cross_entropy_forward(const T* logits, const std::int32_t* targets, T* loss,
                           std::int64_t tokens, std::int64_t vocab);
// dlogits[t] = (softmax(logits[t]) - onehot(targets[t])) * scale.
template <class T>
void cross_entropy_backward(const T* logits, const std::int32_t* targets, T* dlogits,
                            std::int64_t tokens, std::int64_t vocab, double scale);

}  // namespace nodeemu::layers::kernels
