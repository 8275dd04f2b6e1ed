// RMSNorm (Megatron's `normalization: RMSNorm`): y = x / sqrt(mean(x^2) + eps) * w, row by row.
// Templated on the compute type: float runs in the model, double in the gradient tests.
#pragma once
#include <cstdint>

namespace nodeemu::layers::kernels {

// x, y: [rows][h]; w: [h]; rstd (saved for backward): [rows].
template <class T>
void rmsnorm_forward(const T* x, const T* w, T* y, T* rstd, std::int64_t rows, std::int64_t h,
                     double eps);
// dx = d(loss)/dx given dy; dx may not alias dy.
template <class T>
void rmsnorm_dgrad(const T* dy, const T* x, const T* w, const T* rstd, T* dx, std::int64_t rows,
                   std::int64_t h);
// dw (+)= sum over rows of dy * x * rstd.
template <class T>
void rmsnorm_wgrad(const T* dy, const T* x, const T* rstd, T* dw, std::int64_t rows, std::int64_t h,
                   bool accumulate);

}  // namespace nodeemu::layers::kernels
