#include "layers/kernels/rmsnorm.hpp"

#include <algorithm>
#include <cmath>

#include "devices/worker_pool.hpp"
#include "layers/kernels/partition.hpp"

namespace nodeemu::layers::kernels {

template <class T>
void rmsnorm_forward(const T* x, const T* w, T* y, T* rstd, std::int64_t rows, std::int64_t h,
                     double eps) {
  for_row_blocks(rows, [&](std::int64_t r) {
    const T* xr = x + r * h;
    T ss = 0;
    for (std::int64_t j = 0; j < h; ++j) ss += xr[j] * xr[j];
    const T rs = T(1) / std::sqrt(ss / T(h) + T(eps));
    rstd[r] = rs;
    for (std::int64_t j = 0; j < h; ++j) y[r * h + j] = xr[j] * rs * w[j];
  });
}

template <class T>
void rmsnorm_dgrad(const T* dy, const T* x, const T* w, const T* rstd, T* dx, std::int64_t rows,
                   std::int64_t h) {
  for_row_blocks(rows, [&](std::int64_t r) {
    const T* xr = x + r * h;
    const T* gr = dy + r * h;
    const T rs = rstd[r];
    T dot = 0;  // sum_j (dy_j w_j) x_j
    for (std::int64_t j = 0; j < h; ++j) dot += gr[j] * w[j] * xr[j];
    const T c = rs * rs * rs * dot / T(h);
    for (std::int64_t j = 0; j < h; ++j) dx[r * h + j] = rs * gr[j] * w[j] - xr[j] * c;
  });
}

template <class T>
void rmsnorm_wgrad(const T* dy, const T* x, const T* rstd, T* dw, std::int64_t rows, std::int64_t h,
                   bool accumulate) {
  // A reduction over rows: chunks cut the columns, and each sums its rows in order. The rows are
  // the outer loop, so that a block's columns are summed side by side along contiguous rows:
  // each column's sum still adds its rows in order (the same bits), but as 64 independent
  // chains instead of one chain at a time down a strided column, which was bound by the adds'
  // latency (2.6 % of a mid-size functional run, bench_emu BM_FunctionalMidSize).
  for_column_blocks(h, [&](std::int64_t j0, std::int64_t j1) {
    T s[kColumnBlock] = {};
    const std::int64_t n = j1 - j0;
    for (std::int64_t r = 0; r < rows; ++r) {
      const T* a = dy + r * h + j0;
      const T* b = x + r * h + j0;
      const T rs = rstd[r];
      for (std::int64_t j = 0; j < n; ++j) s[j] += a[j] * b[j] * rs;
    }
    for (std::int64_t j = 0; j < n; ++j) dw[j0 + j] = accumulate ? dw[j0 + j] + s[j] : s[j];
  });
}

template void rmsnorm_forward<float>(const float*, const float*, float*, float*, std::int64_t,
                                     std::int64_t, double);
template void rmsnorm_forward<double>(const double*, const double*, double*, double*, std::int64_t,
                                      std::int64_t, double);
template void rmsnorm_dgrad<float>(const float*, const float*, const float*, const float*, float*,
                                   std::int64_t, std::int64_t);
template void rmsnorm_dgrad<double>(const double*, const double*, const double*, const double*,
                                    double*, std::int64_t, std::int64_t);
template void rmsnorm_wgrad<float>(const float*, const float*, const float*, float*, std::int64_t,
                                   std::int64_t, bool);
template void rmsnorm_wgrad<double>(const double*, const double*, const double*, double*,
                                    std::int64_t, std::int64_t, bool);

}  // namespace nodeemu::layers::kernels
