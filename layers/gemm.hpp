// Every GEMM of the model goes through this file: one small interface, so that a faster kernel
// (an AMX bf16 path through oneDNN, say) can be plugged in behind it later.
//
// Row-major throughout. float runs OpenBLAS sgemm, double runs dgemm (the fp64 instantiation
// exists for the finite-difference tests). Debian's OpenBLAS 0.3.21 exports no sbgemm, so
// 16-bit tensors are widened to fp32 before they get here.
//
// Determinism: the work is cut into chunks by problem size alone (never by thread count), each
// chunk is one BLAS call with one thread, and chunks write disjoint parts of the output with the
// whole reduction inside the call. So 1 or 8 worker threads give the same bits.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace nodeemu::layers {

// C[M,N] = beta * C + op(A)[M,K] * op(B)[K,N]; lda/ldb/ldc are row strides of the stored
// matrices. Runs on the calling thread.
template <class T>
void gemm(bool trans_a, bool trans_b, std::int64_t M, std::int64_t N, std::int64_t K, const T* A,
          std::int64_t lda, const T* B, std::int64_t ldb, T beta, T* C, std::int64_t ldc);

// Linear layers in torch's layout, grouped: `rows[g]` consecutive rows of x belong to group g
// (a local expert), whose weight is w[g] of shape [out][in]. A plain linear layer is one group.
//   forward: y_g = x_g w_g^T          dgrad: dx_g = dy_g w_g
//   wgrad:   dw_g (+)= dy_g^T x_g     (accumulate: add into dw, as main_grad accumulation does)
// Chunks run in parallel on the calling device's worker pool (WorkerPool::parallel_for).
template <class T>
void grouped_linear_forward(const T* x, const T* w, T* y, const std::vector<std::int64_t>& rows,
                            std::int64_t in, std::int64_t out);
// The same forward with each group's weight stored transposed, wt[g] of shape [in][out]: the same
// bits (OpenBLAS packs both layouts into the same panels; a test checks it over a grid of shapes),
// and faster with few rows per group, where packing the weight is a large share of the call and
// the transposing pack of [out][in] is the slower one (bench/README.md, Layers).
template <class T>
void grouped_linear_forward_transposed(const T* x, const T* wt, T* y,
                                       const std::vector<std::int64_t>& rows, std::int64_t in,
                                       std::int64_t out);
template <class T>
void grouped_linear_dgrad(const T* dy, const T* w, T* dx, const std::vector<std::int64_t>& rows,
                          std::int64_t in, std::int64_t out);
template <class T>
void grouped_linear_wgrad(const T* dy, const T* x, T* dw, const std::vector<std::int64_t>& rows,
                          std::int64_t in, std::int64_t out, bool accumulate);

// Rows (or, for wgrad, output features) per chunk. Fixed: part of the numerics contract.
inline constexpr std::int64_t kGemmRowBlock = 256;

// What runs the GEMMs, for summaries: "openblas-sgemm/Haswell".
std::string gemm_kernel_name();

}  // namespace nodeemu::layers
