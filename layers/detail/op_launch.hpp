// Internal: what the ops of layers/ops.hpp share to launch their kernels (ops.cpp,
// ops_attention.cpp).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "layers/ops.hpp"

namespace nodeemu::layers::ops::detail {

inline Precision precision_of(DType t) {
  return t == DType::F32 ? Precision::FP32 : Precision::BF16;
}

inline Work work(const KernelShape& shape, double flops, double bytes, DType t) {
  return Work{.flops = flops, .bytes = bytes, .precision = precision_of(t), .shape = shape};
}

inline Work memory(MemoryOp op, double flops, double bytes, DType t) {
  return work(KernelShape::memory(op), flops, bytes, t);
}

inline std::int64_t rows_of(const Tensor& x) {
  return x.shape().empty() ? 0 : x.dim(0);
}
inline std::int64_t cols_of(const Tensor& x) {
  return x.shape().empty() || x.dim(0) == 0 ? 0 : x.numel() / x.dim(0);
}

// One kernel of an unfused chain whose values the chain's last kernel computes: it takes its
// time on the stream and its host launch, and has no body.
inline void also(const At& at, const std::string& name, MemoryOp op, double bytes, DType t) {
  launch(at.stream, at.named(name), memory(op, 0, bytes, t), nullptr, {}, at.tally);
}
inline void also_gemm(const At& at, const std::string& name, GemmLayout l, std::int64_t m,
                      std::int64_t n, std::int64_t k, DType t) {
  launch(at.stream, at.named(name),
         work(KernelShape::gemm(l, m, n, k), 2.0 * double(m) * double(n) * double(k), 0, t),
         nullptr, {}, at.tally);
}

// A row slice of a view: rows [first, first + count) of a [rows][width] tensor.
inline View rows_view(const View& v, std::int64_t first, std::int64_t count, std::int64_t width) {
  if (!v.data) return View{nullptr, v.dtype, count * width};
  return View{static_cast<char*>(v.data) + first * width * std::int64_t(dtype_bytes(v.dtype)),
              v.dtype, count * width};
}

inline std::vector<std::int64_t> offsets(const std::vector<std::int64_t>& rows) {
  std::vector<std::int64_t> off(rows.size() + 1, 0);
  for (std::size_t g = 0; g < rows.size(); ++g) off[g + 1] = off[g] + rows[g];
  return off;
}

}  // namespace nodeemu::layers::ops::detail
