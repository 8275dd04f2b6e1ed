#include "layers/kernels/attention.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "devices/worker_pool.hpp"
#include "layers/gemm.hpp"
#include "layers/kernels/partition.hpp"

namespace nodeemu::layers::kernels {

double AttentionShape::scale() const {
  return softmax_scale > 0 ? softmax_scale : 1.0 / std::sqrt(double(head_dim));
}

double yarn_mscale(double scale, double mscale) {
  return scale <= 1 ? 1.0 : 0.1 * mscale * std::log(scale) + 1.0;
}

std::vector<double> Rotary::inverse_frequencies(std::int64_t dim) const {
  const std::int64_t half = dim / 2;
  std::vector<double> f(static_cast<std::size_t>(half));
  for (std::int64_t i = 0; i < half; ++i)
    f[std::size_t(i)] = std::pow(base, -2.0 * double(i) / double(dim));
  if (!yarn) return f;
  // The dimension whose wavelength fits `rotations` turns in the original context.
  const double pi = 3.14159265358979323846;
  auto correction_dim = [&](double rotations) {
    return double(dim) * std::log(original_max_position_embeddings / (rotations * 2 * pi)) /
           (2 * std::log(base));
  };
  const double low = std::max(0.0, std::floor(correction_dim(beta_fast)));
  double high = std::min(double(dim - 1), std::ceil(correction_dim(beta_slow)));
  if (high == low) high += 0.001;
  for (std::int64_t i = 0; i < half; ++i) {
    const double ramp = std::clamp((double(i) - low) / (high - low), 0.0, 1.0);
    const double keep = 1 - ramp;  // 1: the original frequency (high-frequency dims)
    double& x = f[std::size_t(i)];
    x = x / scaling_factor * (1 - keep) + x * keep;
  }
  return f;
}

double Rotary::cos_sin_scale() const {
  return yarn ? yarn_mscale(scaling_factor, mscale) / yarn_mscale(scaling_factor, mscale_all_dim)
              : 1.0;
}

double Rotary::softmax_mscale() const {
  return yarn ? yarn_mscale(scaling_factor, mscale_all_dim) : 1.0;
}

template <class T>
void rope_apply(T* qkv, const AttentionShape& s, const Rotary& rot, bool inverse) {
  const std::int64_t d = s.head_dim, r = s.rotated(), half = r / 2, width = s.qkv_width();
  const std::int64_t rotated_heads = s.heads + s.kv_heads;  // queries, then keys
  const std::vector<double> inv = rot.inverse_frequencies(r);
  const double m = rot.cos_sin_scale();
  for_row_blocks(s.rows(), [&](std::int64_t row) {
    const double pos = double(s.position(row % s.seq));
    for (std::int64_t i = 0; i < half; ++i) {
      const double angle = pos * inv[std::size_t(i)];
      const T c = T(m * std::cos(angle)),
              sn = T(m * (inverse ? -std::sin(angle) : std::sin(angle)));
      for (std::int64_t h = 0; h < rotated_heads; ++h) {
        T* x = qkv + row * width + h * d + (d - r);
        const std::int64_t a = rot.interleaved ? 2 * i : i, b = rot.interleaved ? a + 1 : i + half;
        const T x1 = x[a], x2 = x[b];
        x[a] = x1 * c - x2 * sn;
        x[b] = x2 * c + x1 * sn;
      }
    }
  });
}

namespace {

// One (batch, head) block of causal attention: lq queries against keys 0 .. lk-1, the first query
// at position lk - lq (bottom-right aligned: query i sees keys j <= i + lk - lq). Without CP a
// block is a whole sequence (lq = lk); with CP, one local chunk against the keys before it.
template <class T>
struct Block {
  const T *q, *k, *v;
  std::int64_t q_stride, kv_stride, lq, lk;
  std::int64_t offset() const { return lk - lq; }
};

// S[i][j] = scale * q_i . k_j, masked to j <= i + offset.
template <class T>
void scores(const Block<T>& b, std::int64_t d, T scale, T* S) {
  const std::int64_t lq = b.lq, lk = b.lk, off = b.offset();
  gemm<T>(false, true, lq, lk, d, b.q, b.q_stride, b.k, b.kv_stride, T(0), S, lk);
  for (std::int64_t i = 0; i < lq; ++i)
    for (std::int64_t j = 0; j < lk; ++j)
      S[i * lk + j] = j <= i + off ? S[i * lk + j] * scale : -std::numeric_limits<T>::infinity();
}

// out [lq][dv] (row stride os) and lse [lq] of one block.
template <class T>
void block_forward(const Block<T>& b, const AttentionShape& s, T* out, std::int64_t os, T* lse) {
  const std::int64_t lq = b.lq, lk = b.lk, off = b.offset();
  std::vector<T> P(static_cast<std::size_t>(lq * lk));
  scores(b, s.head_dim, T(s.scale()), P.data());
  for (std::int64_t i = 0; i < lq; ++i) {
    T* p = P.data() + i * lk;
    T m = p[0];
    for (std::int64_t j = 1; j <= i + off; ++j) m = std::max(m, p[j]);
    T sum = 0;
    for (std::int64_t j = 0; j < lk; ++j) {
      p[j] = j <= i + off ? std::exp(p[j] - m) : T(0);
      sum += p[j];
    }
    for (std::int64_t j = 0; j <= i + off; ++j) p[j] /= sum;
    lse[i] = m + std::log(sum);
  }
  gemm<T>(false, false, lq, s.dv(), lk, P.data(), lk, b.v, b.kv_stride, T(0), out, os);
}

// One block's backward: dq [lq][d] (stride qs) written; dk [lk][d] and dv [lk][dv] (stride ks)
// accumulated. P and dP are the caller's scratch of lq * lk.
template <class T>
void block_backward(const Block<T>& b, const AttentionShape& s, const T* dO, const T* O,
                    std::int64_t os, const T* lse, T* dq, std::int64_t qs, T* dk, T* dvals,
                    std::int64_t ks, std::vector<T>& P, std::vector<T>& dP) {
  const std::int64_t d = s.head_dim, dv = s.dv(), lq = b.lq, lk = b.lk, off = b.offset();
  const T scale = T(s.scale());
  P.resize(static_cast<std::size_t>(lq * lk));
  dP.resize(static_cast<std::size_t>(lq * lk));
  scores(b, d, scale, P.data());
  for (std::int64_t i = 0; i < lq; ++i)
    for (std::int64_t j = 0; j < lk; ++j)
      P[i * lk + j] = j <= i + off ? std::exp(P[i * lk + j] - lse[i]) : T(0);
  gemm<T>(true, false, lk, dv, lq, P.data(), lk, dO, os, T(1), dvals, ks);          // dV += P^T dO
  gemm<T>(false, true, lq, lk, dv, dO, os, b.v, b.kv_stride, T(0), dP.data(), lk);  // dP = dO V^T
  for (std::int64_t i = 0; i < lq; ++i) {
    T Di = 0;  // rowsum(dO * O) = rowsum(P * dP)
    for (std::int64_t j = 0; j < dv; ++j) Di += dO[i * os + j] * O[i * os + j];
    for (std::int64_t j = 0; j < lk; ++j)
      dP[i * lk + j] = j <= i + off ? P[i * lk + j] * (dP[i * lk + j] - Di) * scale : T(0);
  }
  gemm<T>(false, false, lq, d, lk, dP.data(), lk, b.k, b.kv_stride, T(0), dq, qs);  // dQ
  gemm<T>(true, false, lk, d, lq, dP.data(), lk, b.q, b.q_stride, T(1), dk, ks);    // dK += dS^T Q
}

// Zeroes rows of `cols` columns at `at`, stride `stride`.
template <class T>
void zero_rows(T* at, std::int64_t rows, std::int64_t cols, std::int64_t stride) {
  for (std::int64_t i = 0; i < rows; ++i) std::fill(at + i * stride, at + i * stride + cols, T(0));
}

}  // namespace

template <class T>
void attention_forward(const T* qkv, T* out, T* lse, const AttentionShape& s) {
  const std::int64_t d = s.head_dim, dv = s.dv(), w = s.qkv_width(), L = s.seq;
  const std::int64_t ow = s.out_width();
  // One chunk per (batch, head): each writes its own output columns and lse row.
  WorkerPool::parallel_for(std::size_t(s.batch * s.heads), [&](std::size_t c) {
    const std::int64_t b = std::int64_t(c) / s.heads, h = std::int64_t(c) % s.heads;
    const std::int64_t g = h / (s.heads / s.kv_heads);
    const T* base = qkv + b * L * w;
    const Block<T> blk{base + h * d,
                       base + (s.heads + g) * d,
                       base + (s.heads + s.kv_heads) * d + g * dv,
                       w,
                       w,
                       L,
                       L};
    block_forward(blk, s, out + b * L * ow + h * dv, ow, lse + (b * s.heads + h) * L);
  });
}

template <class T>
void attention_backward(const T* dout, const T* qkv, const T* out, const T* lse, T* dqkv,
                        const AttentionShape& s) {
  const std::int64_t d = s.head_dim, dv = s.dv(), w = s.qkv_width(), L = s.seq;
  const std::int64_t ow = s.out_width(), group = s.heads / s.kv_heads;
  // One chunk per (batch, kv head): its query heads run in order and accumulate into the
  // shared dK and dV, so the sums have one fixed order.
  WorkerPool::parallel_for(std::size_t(s.batch * s.kv_heads), [&](std::size_t c) {
    const std::int64_t b = std::int64_t(c) / s.kv_heads, g = std::int64_t(c) % s.kv_heads;
    const std::int64_t base = b * L * w;
    T* dk = dqkv + base + (s.heads + g) * d;
    T* dvals = dqkv + base + (s.heads + s.kv_heads) * d + g * dv;
    zero_rows(dk, L, d, w);
    zero_rows(dvals, L, dv, w);
    std::vector<T> P, dP;
    for (std::int64_t h = g * group; h < (g + 1) * group; ++h) {
      const Block<T> blk{qkv + base + h * d,
                         qkv + base + (s.heads + g) * d,
                         qkv + base + (s.heads + s.kv_heads) * d + g * dv,
                         w,
                         w,
                         L,
                         L};
      block_backward(blk, s, dout + b * L * ow + h * dv, out + b * L * ow + h * dv, ow,
                     lse + (b * s.heads + h) * L, dqkv + base + h * d, w, dk, dvals, w, P, dP);
    }
  });
}

// With CP: each local chunk is a block against the keys up to its last position.
template <class T>
void attention_forward_cp(const T* qkv, const T* kv, T* out, T* lse, const AttentionShape& s) {
  const std::int64_t d = s.head_dim, dv = s.dv(), w = s.qkv_width(), L = s.seq;
  const std::int64_t ow = s.out_width(), kw = s.kv_width(), C = s.chunk(), S = s.full_seq();
  WorkerPool::parallel_for(std::size_t(s.batch * s.heads), [&](std::size_t c) {
    const std::int64_t b = std::int64_t(c) / s.heads, h = std::int64_t(c) % s.heads;
    const std::int64_t g = h / (s.heads / s.kv_heads);
    const T* keys = kv + b * S * kw;
    for (std::int64_t half = 0; half < 2; ++half) {
      const std::int64_t row = b * L + half * C, lk = (s.chunk_index(half) + 1) * C;
      const Block<T> blk{
          qkv + row * w + h * d, keys + g * d, keys + s.kv_heads * d + g * dv, w, kw, C, lk};
      block_forward(blk, s, out + row * ow + h * dv, ow, lse + (b * s.heads + h) * L + half * C);
    }
  });
}

template <class T>
void attention_backward_cp(const T* dout, const T* qkv, const T* kv, const T* out, const T* lse,
                           T* dqkv, T* dkv, const AttentionShape& s) {
  const std::int64_t d = s.head_dim, dv = s.dv(), w = s.qkv_width(), L = s.seq;
  const std::int64_t ow = s.out_width(), kw = s.kv_width(), C = s.chunk(), S = s.full_seq();
  const std::int64_t group = s.heads / s.kv_heads;
  // As without CP: one chunk per (batch, kv head), its query heads and halves in a fixed order.
  WorkerPool::parallel_for(std::size_t(s.batch * s.kv_heads), [&](std::size_t c) {
    const std::int64_t b = std::int64_t(c) / s.kv_heads, g = std::int64_t(c) % s.kv_heads;
    const T* keys = kv + b * S * kw;
    T* dk = dkv + b * S * kw + g * d;
    T* dvals = dkv + b * S * kw + s.kv_heads * d + g * dv;
    zero_rows(dk, S, d, kw);
    zero_rows(dvals, S, dv, kw);
    std::vector<T> P, dP;
    for (std::int64_t h = g * group; h < (g + 1) * group; ++h)
      for (std::int64_t half = 0; half < 2; ++half) {
        const std::int64_t row = b * L + half * C, lk = (s.chunk_index(half) + 1) * C;
        const Block<T> blk{
            qkv + row * w + h * d, keys + g * d, keys + s.kv_heads * d + g * dv, w, kw, C, lk};
        block_backward(blk, s, dout + row * ow + h * dv, out + row * ow + h * dv, ow,
                       lse + (b * s.heads + h) * L + half * C, dqkv + row * w + h * d, w, dk, dvals,
                       kw, P, dP);
      }
  });
}

double AttentionShape::causal_pairs() const {
  // Each local chunk of C queries at chunk index i sees i whole chunks before it and its own
  // lower triangle.
  const double C = double(chunk());
  if (cp == 1) return C * (C + 1) / 2;
  double pairs = 0;
  for (std::int64_t h = 0; h < 2; ++h) pairs += C * C * double(chunk_index(h)) + C * (C + 1) / 2;
  return pairs;
}

double attention_forward_flops(const AttentionShape& s) {
  return 2.0 * double(s.batch) * double(s.heads) * s.causal_pairs() * double(s.head_dim + s.dv());
}

double attention_backward_flops(const AttentionShape& s) {
  return 2.5 * attention_forward_flops(s);
}

template void rope_apply<float>(float*, const AttentionShape&, const Rotary&, bool);
template void rope_apply<double>(double*, const AttentionShape&, const Rotary&, bool);
template void attention_forward<float>(const float*, float*, float*, const AttentionShape&);
template void attention_forward<double>(const double*, double*, double*, const AttentionShape&);
template void attention_backward<float>(const float*, const float*, const float*, const float*,
                                        float*, const AttentionShape&);
template void attention_backward<double>(const double*, const double*, const double*, const double*,
                                         double*, const AttentionShape&);
template void attention_forward_cp<float>(const float*, const float*, float*, float*,
                                          const AttentionShape&);
template void attention_forward_cp<double>(const double*, const double*, double*, double*,
                                           const AttentionShape&);
template void attention_backward_cp<float>(const float*, const float*, const float*, const float*,
                                           const float*, float*, float*, const AttentionShape&);
template void attention_backward_cp<double>(const double*, const double*, const double*,
                                            const double*, const double*, double*, double*,
                                            const AttentionShape&);

}  // namespace nodeemu::layers::kernels
