#include "layers/gemm.hpp"

#include <cblas.h>

#include <algorithm>
#include <type_traits>

#include "devices/blas_kernel.hpp"
#include "devices/check.hpp"
#include "devices/worker_pool.hpp"

namespace nodeemu::layers {

namespace {

CBLAS_TRANSPOSE tr(bool t) {
  return t ? CblasTrans : CblasNoTrans;
}

struct Chunk {
  std::int64_t group, begin, end;  // rows [begin, end) of the group's output
};

// Cuts each group's `extent[g]` output rows into kGemmRowBlock pieces.
std::vector<Chunk> chunks_of(const std::vector<std::int64_t>& extent) {
  std::vector<Chunk> out;
  for (std::size_t g = 0; g < extent.size(); ++g)
    for (std::int64_t b = 0; b < extent[g]; b += kGemmRowBlock)
      out.push_back({static_cast<std::int64_t>(g), b, std::min(extent[g], b + kGemmRowBlock)});
  return out;
}

std::vector<std::int64_t> offsets_of(const std::vector<std::int64_t>& rows) {
  std::vector<std::int64_t> off(rows.size() + 1, 0);
  for (std::size_t g = 0; g < rows.size(); ++g) {
    NE_CHECK(rows[g] >= 0, "negative group size");
    off[g + 1] = off[g] + rows[g];
  }
  return off;
}

template <class F>
void run_chunks(const std::vector<Chunk>& chunks, F&& f) {
  WorkerPool::parallel_for(chunks.size(), [&](std::size_t i) { f(chunks[i]); });
}

}  // namespace

template <class T>
void gemm(bool ta, bool tb, std::int64_t M, std::int64_t N, std::int64_t K, const T* A,
          std::int64_t lda, const T* B, std::int64_t ldb, T beta, T* C, std::int64_t ldc) {
  if (M == 0 || N == 0) return;
  // The numerics promises hold for the wanted kernel only (devices/blas_kernel.hpp); a Node
  // decides it first, but a GEMM may also run without one (tests, benchmarks). Once decided this
  // is one atomic load.
  blas::ensure_kernel();
  if (K == 0) {  // BLAS leaves C untouched only for beta = 1; an empty sum is beta * C
    for (std::int64_t i = 0; i < M; ++i)
      for (std::int64_t j = 0; j < N; ++j) C[i * ldc + j] = beta == 0 ? 0 : beta * C[i * ldc + j];
    return;
  }
  if constexpr (std::is_same_v<T, float>)
    cblas_sgemm(CblasRowMajor, tr(ta), tr(tb), int(M), int(N), int(K), 1.0f, A, int(lda), B,
                int(ldb), beta, C, int(ldc));
  else
    cblas_dgemm(CblasRowMajor, tr(ta), tr(tb), int(M), int(N), int(K), 1.0, A, int(lda), B,
                int(ldb), beta, C, int(ldc));
}

template <class T>
void grouped_linear_forward(const T* x, const T* w, T* y, const std::vector<std::int64_t>& rows,
                            std::int64_t in, std::int64_t out) {
  const auto off = offsets_of(rows);
  run_chunks(chunks_of(rows), [&](const Chunk& c) {
    const std::int64_t r0 = off[std::size_t(c.group)] + c.begin;
    gemm<T>(false, true, c.end - c.begin, out, in, x + r0 * in, in, w + c.group * out * in, in,
            T(0), y + r0 * out, out);
  });
}

template <class T>
void grouped_linear_forward_transposed(const T* x, const T* wt, T* y,
                                       const std::vector<std::int64_t>& rows, std::int64_t in,
                                       std::int64_t out) {
  const auto off = offsets_of(rows);
  run_chunks(chunks_of(rows), [&](const Chunk& c) {
    const std::int64_t r0 = off[std::size_t(c.group)] + c.begin;
    gemm<T>(false, false, c.end - c.begin, out, in, x + r0 * in, in, wt + c.group * in * out, out,
            T(0), y + r0 * out, out);
  });
}

template <class T>
void grouped_linear_dgrad(const T* dy, const T* w, T* dx, const std::vector<std::int64_t>& rows,
                          std::int64_t in, std::int64_t out) {
  const auto off = offsets_of(rows);
  run_chunks(chunks_of(rows), [&](const Chunk& c) {
    const std::int64_t r0 = off[std::size_t(c.group)] + c.begin;
    gemm<T>(false, false, c.end - c.begin, in, out, dy + r0 * out, out, w + c.group * out * in, in,
            T(0), dx + r0 * in, in);
  });
}

template <class T>
void grouped_linear_wgrad(const T* dy, const T* x, T* dw, const std::vector<std::int64_t>& rows,
                          std::int64_t in, std::int64_t out, bool accumulate) {
  const auto off = offsets_of(rows);
  // Chunks cut dw's output features; each sums over all of its group's rows in one call.
  std::vector<std::int64_t> extent(rows.size(), out);
  run_chunks(chunks_of(extent), [&](const Chunk& c) {
    const std::int64_t r0 = off[std::size_t(c.group)];
    T* dst = dw + c.group * out * in + c.begin * in;
    gemm<T>(true, false, c.end - c.begin, in, rows[std::size_t(c.group)], dy + r0 * out + c.begin,
            out, x + r0 * in, in, accumulate ? T(1) : T(0), dst, in);
  });
}

#define NE_INSTANTIATE(T)                                                                         \
  template void grouped_linear_forward<T>(                                                        \
      const T*, const T*, T*, const std::vector<std::int64_t>&, std::int64_t, std::int64_t);      \
  template void grouped_linear_forward_transposed<T>(                                             \
      const T*, const T*, T*, const std::vector<std::int64_t>&, std::int64_t, std::int64_t);      \
  template void grouped_linear_dgrad<T>(const T*, const T*, T*, const std::vector<std::int64_t>&, \
                                        std::int64_t, std::int64_t);                              \
  template void grouped_linear_wgrad<T>(const T*, const T*, T*, const std::vector<std::int64_t>&, \
                                        std::int64_t, std::int64_t, bool);
template void gemm<float>(bool, bool, std::int64_t, std::int64_t, std::int64_t, const float*,
                          std::int64_t, const float*, std::int64_t, float, float*, std::int64_t);
template void gemm<double>(bool, bool, std::int64_t, std::int64_t, std::int64_t, const double*,
                           std::int64_t, const double*, std::int64_t, double, double*,
                           std::int64_t);
NE_INSTANTIATE(float)
NE_INSTANTIATE(double)
#undef NE_INSTANTIATE

std::string gemm_kernel_name() {
  return "openblas-sgemm/" + blas::ensure_kernel().kernel;
}

}  // namespace nodeemu::layers
