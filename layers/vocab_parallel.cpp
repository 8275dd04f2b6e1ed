#include "layers/vocab_parallel.hpp"

#include <vector>

#include "layers/kernels/vocab.hpp"
#include "layers/launch.hpp"

namespace nodeemu::layers {

namespace {

kernels::VocabShard shard_of(const TensorParallel& tp, const Tensor& table_or_logits, int dim) {
  const std::int64_t rows = table_or_logits.dim(dim);
  return {tp.rank * rows, rows};
}

}  // namespace

Tensor embedding_forward(ops::At at, const TensorParallel& tp, const Tensor& tokens,
                         const Parameter& table, DType dtype) {
  const std::int64_t T = tokens.dim(0), H = table.value.dim(1);
  Tensor y = at.empty({T, H}, dtype);
  View vt = view(tokens), vw = view(table.value), vy = view(y);
  const kernels::VocabShard shard = tp.on() ? shard_of(tp, table.value, 0) : kernels::VocabShard{};
  launch(
      at.stream, "embedding",
      Work{.bytes = 2.0 * double(y.bytes()), .shape = KernelShape::memory(MemoryOp::Gather)},
      [=] {
        F32Scope f;
        kernels::embedding_forward(vt.as<const std::int32_t>(), f.in(vw), f.out(vy), T, H, shard);
      },
      {tokens, table.value, y}, at.tally);
  return tp.on() ? scatter_tokens(at, tp, y, "sp_reducescatter_embedding") : y;
}

Tensor embedding_grad_all(ops::At at, const TensorParallel& tp, const Tensor& grad) {
  return tp.on() ? gather_tokens(at, tp, grad, "sp_allgather_embedding_bwd") : grad;
}

void embedding_wgrad(ops::At at, const TensorParallel& tp, const Tensor& tokens,
                     const Tensor& grad_all, Parameter& table) {
  const std::int64_t T = tokens.dim(0), H = table.value.dim(1);
  View vt = view(tokens), vg = view(grad_all), vw = view(table.main_grad);
  const kernels::VocabShard shard = tp.on() ? shard_of(tp, table.value, 0) : kernels::VocabShard{};
  launch(
      at.stream, "embedding_wgrad",
      Work{.bytes = 3.0 * double(grad_all.bytes()),
           .shape = KernelShape::memory(MemoryOp::Scatter)},
      [=] {
        F32Scope f;
        kernels::embedding_wgrad(vt.as<const std::int32_t>(), f.in(vg), vw.as<float>(), T, H,
                                 shard);
      },
      {tokens, grad_all, table.main_grad}, at.tally);
}

void cross_entropy_forward(ops::At at, const TensorParallel& tp, const Tensor& logits,
                           const Tensor& labels, const std::shared_ptr<double>& loss_sum,
                           CrossEntropySaved& saved) {
  const std::int64_t T = logits.dim(0), V = logits.dim(1);
  View vl = view(logits), vy = view(labels);
  const Work work{.flops = 4.0 * double(T * V),
                  .bytes = double(logits.bytes()),
                  .precision = Precision::FP32,
                  .shape = KernelShape::memory(MemoryOp::Elementwise)};
  // The per-token losses summed in token order: a fixed reduction order.
  auto sum_in_order = [loss_sum](const std::vector<float>& per) {
    double total = 0;
    for (float v : per) total += v;
    *loss_sum = total;
  };
  if (!tp.on()) {
    launch(
        at.stream, "cross_entropy", work,
        [=] {
          std::vector<float> per(static_cast<std::size_t>(T));
          kernels::cross_entropy_forward(vl.as<const float>(), vy.as<const std::int32_t>(),
                                         per.data(), T, V);
          sum_in_order(per);
        },
        {logits, labels}, at.tally);
    return;
  }
  saved.max = at.empty({T}, DType::F32);
  saved.stats = at.empty({2, T}, DType::F32);
  View vm = view(saved.max), vs = view(saved.stats);
  const kernels::VocabShard shard = shard_of(tp, logits, 1);
  launch(
      at.stream, "cross_entropy_max",
      Work{.bytes = double(logits.bytes()), .shape = KernelShape::memory(MemoryOp::Elementwise)},
      [=] { kernels::shard_logits_max(vl.as<const float>(), vm.as<float>(), T, V); },
      {logits, saved.max}, at.tally);
  Group g = tp.group;  // a handle: the collectives are not const
  g.all_reduce(saved.max.buffer(), saved.max.buffer(), std::size_t(T), at.stream,
               {.async = true, .name = "vocab_parallel_max_allreduce"}, Reduction::MaxF32);
  launch(
      at.stream, "cross_entropy_stats", work,
      [=] {
        kernels::shard_softmax_stats(vl.as<const float>(), vm.as<const float>(),
                                     vy.as<const std::int32_t>(), shard, vs.as<float>(), T, V);
      },
      {logits, labels, saved.max, saved.stats}, at.tally);
  g.all_reduce(saved.stats.buffer(), saved.stats.buffer(), std::size_t(2 * T), at.stream,
               {.async = true, .name = "vocab_parallel_stats_allreduce"});
  launch(
      at.stream, "cross_entropy",
      Work{.bytes = double(saved.stats.bytes()),
           .shape = KernelShape::memory(MemoryOp::Elementwise)},
      [=] {
        std::vector<float> per(static_cast<std::size_t>(T));
        kernels::shard_cross_entropy(vs.as<const float>(), vy.as<const std::int32_t>(), per.data(),
                                     T);
        sum_in_order(per);
      },
      {saved.stats, labels}, at.tally);
}

Tensor cross_entropy_backward(ops::At at, const TensorParallel& tp, const Tensor& logits,
                              const Tensor& labels, const CrossEntropySaved& saved, double scale) {
  const std::int64_t T = logits.dim(0), V = logits.dim(1);
  Tensor g = at.empty({T, V}, DType::F32);
  View vl = view(logits), vy = view(labels), vg = view(g);
  const Work work{.flops = 4.0 * double(T * V),
                  .bytes = 2.0 * double(logits.bytes()),
                  .precision = Precision::FP32,
                  .shape = KernelShape::memory(MemoryOp::Elementwise)};
  if (!tp.on()) {
    launch(
        at.stream, "cross_entropy_bwd", work,
        [=] {
          kernels::cross_entropy_backward(vl.as<const float>(), vy.as<const std::int32_t>(),
                                          vg.as<float>(), T, V, scale);
        },
        {logits, labels, g}, at.tally);
    return g;
  }
  View vm = view(saved.max), vs = view(saved.stats);
  const kernels::VocabShard shard = shard_of(tp, logits, 1);
  launch(
      at.stream, "cross_entropy_bwd", work,
      [=] {
        kernels::shard_cross_entropy_backward(vl.as<const float>(), vm.as<const float>(),
                                              vs.as<const float>(), vy.as<const std::int32_t>(),
                                              shard, vg.as<float>(), T, V, scale);
      },
      {logits, labels, saved.max, saved.stats, g}, at.tally);
  return g;
}

}  // namespace nodeemu::layers
