// The model's two ends over a vocabulary that TP splits (Megatron's VocabParallelEmbedding and
// the output layer's _VocabParallelCrossEntropy, tensor_parallel/layers.py and cross_entropy.py).
// Without TP each is the one kernel it always was.
#pragma once
#include <cstdint>
#include <memory>

#include "layers/ops.hpp"
#include "layers/tensor_parallel.hpp"

namespace nodeemu::layers {

// The embedding of this rank's tokens ([T / tp][h]): each rank looks up the ids its vocabulary
// shard holds (zeros elsewhere) for all T tokens, and the partial rows are reduce-scattered to
// the token split (LanguageModelEmbedding's reduce_scatter_embeddings).
Tensor embedding_forward(ops::At at, const TensorParallel& tp, const Tensor& tokens,
                         const Parameter& table, DType dtype);
// The embedding's input gradient for all T tokens: this rank's share all-gathered (the
// reduce-scatter's backward). Identity without TP.
Tensor embedding_grad_all(ops::At at, const TensorParallel& tp, const Tensor& grad);
// table.main_grad += the gradient of the shard's rows, from all T tokens' gradient.
void embedding_wgrad(ops::At at, const TensorParallel& tp, const Tensor& tokens,
                     const Tensor& grad_all, Parameter& table);

// The per-token cross-entropy of logits [T][vocab / tp] (fp32), summed in token order into
// `*loss_sum` when the kernel runs; every TP rank gets the same sum. `saved` keeps what the
// backward reads (the reduced maxima and statistics, under TP).
struct CrossEntropySaved {
  Tensor max, stats;
};
void cross_entropy_forward(ops::At at, const TensorParallel& tp, const Tensor& logits,
                           const Tensor& labels, const std::shared_ptr<double>& loss_sum,
                           CrossEntropySaved& saved);
// The logits' gradient, times `scale`.
Tensor cross_entropy_backward(ops::At at, const TensorParallel& tp, const Tensor& logits,
                              const Tensor& labels, const CrossEntropySaved& saved, double scale);

}  // namespace nodeemu::layers
