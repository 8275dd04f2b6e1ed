#include "layers/kernels/swiglu.hpp"

#include <cmath>

#include "layers/kernels/partition.hpp"

namespace nodeemu::layers::kernels {

namespace {
template <class T>
T sigmoid(T x) {
  return T(1) / (T(1) + std::exp(-x));
}
}  // namespace

template <class T>
void swiglu_forward(const T* h, const T* probs, T* a, std::int64_t rows, std::int64_t f) {
  for_row_blocks(rows, [&](std::int64_t r) {
    const T* g = h + r * 2 * f;
    const T* u = g + f;
    const T p = probs ? probs[r] : T(1);
    for (std::int64_t j = 0; j < f; ++j) a[r * f + j] = g[j] * sigmoid(g[j]) * u[j] * p;
  });
}

template <class T>
void swiglu_backward(const T* da, const T* h, const T* probs, T* dh, T* dprobs, std::int64_t rows,
                     std::int64_t f) {
  for_row_blocks(rows, [&](std::int64_t r) {
    const T* g = h + r * 2 * f;
    const T* u = g + f;
    T* dg = dh + r * 2 * f;
    T* du = dg + f;
    const T p = probs ? probs[r] : T(1);
    T dp = 0;
    for (std::int64_t j = 0; j < f; ++j) {
      const T s = sigmoid(g[j]);
      const T silu = g[j] * s;
      const T d = da[r * f + j];
      dp += d * silu * u[j];
      du[j] = d * p * silu;
      dg[j] = d * p * u[j] * s * (T(1) + g[j] * (T(1) - s));
    }
    if (probs) dprobs[r] = dp;
  });
}

template void swiglu_forward<float>(const float*, const float*, float*, std::int64_t, std::int64_t);
template void swiglu_forward<double>(const double*, const double*, double*, std::int64_t,
                                     std::int64_t);
template void swiglu_backward<float>(const float*, const float*, const float*, float*, float*,
                                     std::int64_t, std::int64_t);
template void swiglu_backward<double>(const double*, const double*, const double*, double*, double*,
                                      std::int64_t, std::int64_t);

}  // namespace nodeemu::layers::kernels
