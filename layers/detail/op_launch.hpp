// Internal: what the ops of layers/ops.hpp share to launch their kernels (ops.cpp,
// ops_attention.cpp).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "devices/cost_model.hpp"
#include "devices/device.hpp"
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

// One kernel of an op that the profile's table prices as a whole (a cuDNN attention pass, the
// router's softmax and top-k): its name suffix ("" for the main kernel, which runs the body) and
// the time a real trace measured it at, whose share of the pieces' sum it takes of the table's
// price. `optional` pieces run only where the caller says (GQA's head reductions).
struct KernelPiece {
  const char* suffix;
  double us;
  bool optional = false;
};

// Launches `whole` as its pieces: each priced at its share of whole's table price (Work::fixed_s),
// so the op's total stays the table's while the trace shows each kernel and the host pays a
// launch for each.
template <std::size_t N, BodyLambda Body>
void launch_pieces(Stream& stream, const std::string& name, const Work& whole,
                   const KernelPiece (&pieces)[N], bool with_optional, Body&& body, KernelUses uses,
                   WorkTally* tally) {
  double total_us = 0;
  for (const auto& p : pieces)
    if (with_optional || !p.optional) total_us += p.us;
  const double seconds = kernel_price(stream.device().spec(), whole).seconds;
  for (const auto& p : pieces) {
    if (p.optional && !with_optional) continue;
    const bool main = p.suffix[0] == '\0';
    Work w = main ? whole : Work{.shape = whole.shape};
    w.fixed_s = seconds * p.us / total_us;
    if (main)
      launch(stream, name, w, std::forward<Body>(body), uses, tally);
    else
      launch(stream, name + p.suffix, w, nullptr, {}, tally);
  }
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
