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
    const double pos = double(row % s.seq);
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

// Scores of one (batch, head): S[i][j] = scale * q_i . k_j, masked to j <= i.
template <class T>
void scores(const T* qkv, const AttentionShape& s, std::int64_t b, std::int64_t h, T* S) {
  const std::int64_t d = s.head_dim, w = s.qkv_width(), L = s.seq;
  const std::int64_t g = h / (s.heads / s.kv_heads);
  const T* q = qkv + b * L * w + h * d;
  const T* k = qkv + b * L * w + (s.heads + g) * d;
  gemm<T>(false, true, L, L, d, q, w, k, w, T(0), S, L);
  const T scale = T(s.scale());
  for (std::int64_t i = 0; i < L; ++i)
    for (std::int64_t j = 0; j < L; ++j)
      S[i * L + j] = j <= i ? S[i * L + j] * scale : -std::numeric_limits<T>::infinity();
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
    std::vector<T> P(static_cast<std::size_t>(L * L));
    scores(qkv, s, b, h, P.data());
    for (std::int64_t i = 0; i < L; ++i) {
      T* p = P.data() + i * L;
      T m = p[0];
      for (std::int64_t j = 1; j <= i; ++j) m = std::max(m, p[j]);
      T sum = 0;
      for (std::int64_t j = 0; j < L; ++j) {
        p[j] = j <= i ? std::exp(p[j] - m) : T(0);
        sum += p[j];
      }
      for (std::int64_t j = 0; j <= i; ++j) p[j] /= sum;
      lse[(b * s.heads + h) * L + i] = m + std::log(sum);
    }
    const T* v = qkv + b * L * w + (s.heads + s.kv_heads) * d + g * dv;
    gemm<T>(false, false, L, dv, L, P.data(), L, v, w, T(0), out + b * L * ow + h * dv, ow);
  });
}

template <class T>
void attention_backward(const T* dout, const T* qkv, const T* out, const T* lse, T* dqkv,
                        const AttentionShape& s) {
  const std::int64_t d = s.head_dim, dv = s.dv(), w = s.qkv_width(), L = s.seq;
  const std::int64_t ow = s.out_width(), group = s.heads / s.kv_heads;
  const T scale = T(s.scale());
  // One chunk per (batch, kv head): its query heads run in order and accumulate into the
  // shared dK and dV, so the sums have one fixed order.
  WorkerPool::parallel_for(std::size_t(s.batch * s.kv_heads), [&](std::size_t c) {
    const std::int64_t b = std::int64_t(c) / s.kv_heads, g = std::int64_t(c) % s.kv_heads;
    const std::int64_t base = b * L * w;
    T* dk = dqkv + base + (s.heads + g) * d;
    T* dvals = dqkv + base + (s.heads + s.kv_heads) * d + g * dv;
    for (std::int64_t i = 0; i < L; ++i) {
      for (std::int64_t j = 0; j < d; ++j) dk[i * w + j] = T(0);
      for (std::int64_t j = 0; j < dv; ++j) dvals[i * w + j] = T(0);
    }
    std::vector<T> P(static_cast<std::size_t>(L * L)), dP(static_cast<std::size_t>(L * L));
    for (std::int64_t h = g * group; h < (g + 1) * group; ++h) {
      scores(qkv, s, b, h, P.data());
      const T* l = lse + (b * s.heads + h) * L;
      for (std::int64_t i = 0; i < L; ++i)
        for (std::int64_t j = 0; j < L; ++j)
          P[i * L + j] = j <= i ? std::exp(P[i * L + j] - l[i]) : T(0);
      const T* dO = dout + b * L * ow + h * dv;
      const T* O = out + b * L * ow + h * dv;
      const T* q = qkv + base + h * d;
      const T* k = qkv + base + (s.heads + g) * d;
      const T* v = qkv + base + (s.heads + s.kv_heads) * d + g * dv;
      gemm<T>(true, false, L, dv, L, P.data(), L, dO, ow, T(1), dvals, w);  // dV += P^T dO
      gemm<T>(false, true, L, L, dv, dO, ow, v, w, T(0), dP.data(), L);     // dP = dO V^T
      for (std::int64_t i = 0; i < L; ++i) {
        T Di = 0;  // rowsum(dO * O) = rowsum(P * dP)
        for (std::int64_t j = 0; j < dv; ++j) Di += dO[i * ow + j] * O[i * ow + j];
        for (std::int64_t j = 0; j < L; ++j)
          dP[i * L + j] = j <= i ? P[i * L + j] * (dP[i * L + j] - Di) * scale : T(0);
      }
      gemm<T>(false, false, L, d, L, dP.data(), L, k, w, T(0), dqkv + base + h * d, w);  // dQ
      gemm<T>(true, false, L, d, L, dP.data(), L, q, w, T(1), dk, w);  // dK += dS^T Q
    }
  });
}

double attention_forward_flops(const AttentionShape& s) {
  const double pairs = double(s.seq) * double(s.seq + 1) / 2;  // causal (i, j <= i)
  return 2.0 * double(s.batch) * double(s.heads) * pairs * double(s.head_dim + s.dv());
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

}  // namespace nodeemu::layers::kernels
