#include "layers/tensor_parallel.hpp"

#include <cstring>

#include "devices/check.hpp"
#include "devices/errors.hpp"

namespace nodeemu::layers {

TensorParallel TensorParallel::of(Group group, int rank) {
  TensorParallel tp;
  tp.rank = group.index_of(rank);
  if (tp.rank < 0)
    throw UsageError("tensor parallel group '" + group.name() + "' does not hold rank " +
                     std::to_string(rank));
  tp.size = group.size();
  tp.group = std::move(group);
  return tp;
}

ShardIndex column_shard(const std::vector<std::int64_t>& segments, std::int64_t in,
                        const TensorParallel& tp) {
  std::vector<std::int64_t> local_start, global_start;  // per segment
  std::int64_t local = 0, global = 0;
  for (std::int64_t seg : segments) {
    NE_CHECK(seg % tp.size == 0, "a column-parallel segment does not split over TP");
    local_start.push_back(local);
    global_start.push_back(global + tp.rank * (seg / tp.size));
    local += seg / tp.size;
    global += seg;
  }
  return [=](std::int64_t i) {
    const std::int64_t row = i / in, col = i % in;
    std::size_t k = local_start.size() - 1;
    while (row < local_start[k]) --k;
    return (global_start[k] + row - local_start[k]) * in + col;
  };
}

ShardIndex row_shard(std::int64_t in, const TensorParallel& tp) {
  NE_CHECK(in % tp.size == 0, "a row-parallel weight does not split over TP");
  const std::int64_t local = in / tp.size, first = tp.rank * local;
  return [=](std::int64_t i) { return (i / local) * in + first + i % local; };
}

Tensor gather_tokens(ops::At at, const TensorParallel& tp, const Tensor& x, const char* name) {
  Tensor out = at.empty({x.dim(0) * tp.size, x.dim(1)}, x.dtype());
  Group g = tp.group;  // a handle: the collectives are not const
  g.all_gather(x.buffer(), out.buffer(), x.bytes(), at.stream,
               {.async = true, .name = at.named(name)});
  return out;
}

Tensor scatter_tokens(ops::At at, const TensorParallel& tp, const Tensor& x, const char* name) {
  NE_CHECK(x.dim(0) % tp.size == 0, "token rows do not split over TP");
  Tensor out = at.empty({x.dim(0) / tp.size, x.dim(1)}, x.dtype());
  Reduction op = Reduction::SumF32;
  if (x.dtype() == DType::BF16)
    op = Reduction::SumBF16;
  else
    NE_CHECK(x.dtype() == DType::F32, "sequence-parallel reduce-scatter of fp16 is not modelled");
  const std::size_t part = static_cast<std::size_t>(out.numel());
  Group g = tp.group;
  g.reduce_scatter(x.buffer(), out.buffer(), std::vector<std::size_t>(size_t(tp.size), part),
                   at.stream, {.async = true, .name = at.named(name)}, op);
  return out;
}

Tensor features_to_tokens(ops::At at, const TensorParallel& tp, const Tensor& x, const char* name) {
  const std::int64_t T = x.dim(0), cols = x.dim(1), t = tp.size, local = T / t;
  NE_CHECK(T % t == 0, "token rows do not split over TP");
  const Tensor all = gather_tokens(at, tp, x, name);  // [t][T][cols], rank-major
  Tensor out = at.empty({local, cols * t}, x.dtype());
  const View va = view(all), vo = view(out);
  const std::int64_t first = tp.rank * local, e = std::int64_t(dtype_bytes(x.dtype()));
  launch(
      at.stream, at.named(std::string(name) + "_to_tokens"),
      Work{.bytes = 2.0 * double(out.bytes()), .shape = KernelShape::memory(MemoryOp::Copy)},
      [=] {
        const char* in = static_cast<const char*>(va.data);
        char* o = static_cast<char*>(vo.data);
        for (std::int64_t i = 0; i < local; ++i)
          for (std::int64_t r = 0; r < t; ++r)
            std::memcpy(o + (i * cols * t + r * cols) * e, in + ((r * T + first + i) * cols) * e,
                        std::size_t(cols * e));
      },
      {all, out}, at.tally);
  return out;
}

Tensor tokens_to_features(ops::At at, const TensorParallel& tp, const Tensor& g, const char* name) {
  const std::int64_t H = g.dim(1), t = tp.size, cols = H / t;
  NE_CHECK(H % t == 0, "features do not split over TP");
  const Tensor all = gather_tokens(at, tp, g, name);  // [T][H]
  const std::int64_t T = all.dim(0), e = std::int64_t(dtype_bytes(g.dtype()));
  Tensor out = at.empty({T, cols}, g.dtype());
  const View va = view(all), vo = view(out);
  const std::int64_t first = tp.rank * cols;
  launch(
      at.stream, at.named(std::string(name) + "_to_features"),
      Work{.bytes = 2.0 * double(out.bytes()), .shape = KernelShape::memory(MemoryOp::Copy)},
      [=] {
        const char* in = static_cast<const char*>(va.data);
        char* o = static_cast<char*>(vo.data);
        for (std::int64_t i = 0; i < T; ++i)
          std::memcpy(o + i * cols * e, in + (i * H + first) * e, std::size_t(cols * e));
      },
      {all, out}, at.tally);
  return out;
}

}  // namespace nodeemu::layers
