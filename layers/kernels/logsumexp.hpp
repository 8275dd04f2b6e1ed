// log(sum(exp(x))) over n values, shifted by the maximum so that it never overflows. Shared by
// the cross-entropy loss and the router's z-loss.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>

namespace nodeemu::layers::kernels {

template <class T>
T logsumexp(const T* x, std::int64_t n) {
  T m = x[0];
  for (std::int64_t i = 1; i < n; ++i) m = std::max(m, x[i]);
  T s = 0;
  for (std::int64_t i = 0; i < n; ++i) s += std::exp(x[i] - m);
  return m + std::log(s);
}

}  // namespace nodeemu::layers::kernels
