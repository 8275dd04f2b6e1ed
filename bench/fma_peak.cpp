#include "bench/fma_peak.hpp"

#include <benchmark/benchmark.h>
#include <immintrin.h>

#include <algorithm>
#include <chrono>
#include <vector>

namespace nodeemu {
namespace {

using Clock = std::chrono::steady_clock;

// Twelve independent FMA chains in named registers hide the FMA latency (an array of
// accumulators would round-trip through memory every step).
#define NE_FMA12(F, a, m, c)                                                              \
  a##0 = F(a##0, m, c), a##1 = F(a##1, m, c), a##2 = F(a##2, m, c), a##3 = F(a##3, m, c), \
  a##4 = F(a##4, m, c), a##5 = F(a##5, m, c), a##6 = F(a##6, m, c), a##7 = F(a##7, m, c), \
  a##8 = F(a##8, m, c), a##9 = F(a##9, m, c), a##10 = F(a##10, m, c), a##11 = F(a##11, m, c)

__attribute__((target("avx512f"))) double fma_loop_avx512(long iters) {
  __m512 v0, v1, v2, v3, v4, v5, v6, v7, v8, v9, v10, v11;
  // Distinct starting values, or the compiler merges identical chains into one.
  v0 = _mm512_set1_ps(1.00f);
  v1 = _mm512_set1_ps(1.01f);
  v2 = _mm512_set1_ps(1.02f);
  v3 = _mm512_set1_ps(1.03f);
  v4 = _mm512_set1_ps(1.04f);
  v5 = _mm512_set1_ps(1.05f);
  v6 = _mm512_set1_ps(1.06f);
  v7 = _mm512_set1_ps(1.07f);
  v8 = _mm512_set1_ps(1.08f);
  v9 = _mm512_set1_ps(1.09f);
  v10 = _mm512_set1_ps(1.10f);
  v11 = _mm512_set1_ps(1.11f);
  const __m512 m = _mm512_set1_ps(0.999999f), c = _mm512_set1_ps(1e-7f);
  for (long i = 0; i < iters; ++i) NE_FMA12(_mm512_fmadd_ps, v, m, c);
  __m512 s = _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(v0, v1), _mm512_add_ps(v2, v3)),
                           _mm512_add_ps(_mm512_add_ps(v4, v5), _mm512_add_ps(v6, v7)));
  s = _mm512_add_ps(s, _mm512_add_ps(_mm512_add_ps(v8, v9), _mm512_add_ps(v10, v11)));
  benchmark::DoNotOptimize(s);
  return 2.0 * 16 * 12 * double(iters);
}

__attribute__((target("avx2,fma"))) double fma_loop_avx2(long iters) {
  __m256 v0, v1, v2, v3, v4, v5, v6, v7, v8, v9, v10, v11;
  // Distinct starting values, or the compiler merges identical chains into one.
  v0 = _mm256_set1_ps(1.00f);
  v1 = _mm256_set1_ps(1.01f);
  v2 = _mm256_set1_ps(1.02f);
  v3 = _mm256_set1_ps(1.03f);
  v4 = _mm256_set1_ps(1.04f);
  v5 = _mm256_set1_ps(1.05f);
  v6 = _mm256_set1_ps(1.06f);
  v7 = _mm256_set1_ps(1.07f);
  v8 = _mm256_set1_ps(1.08f);
  v9 = _mm256_set1_ps(1.09f);
  v10 = _mm256_set1_ps(1.10f);
  v11 = _mm256_set1_ps(1.11f);
  const __m256 m = _mm256_set1_ps(0.999999f), c = _mm256_set1_ps(1e-7f);
  for (long i = 0; i < iters; ++i) NE_FMA12(_mm256_fmadd_ps, v, m, c);
  __m256 s = _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(v0, v1), _mm256_add_ps(v2, v3)),
                           _mm256_add_ps(_mm256_add_ps(v4, v5), _mm256_add_ps(v6, v7)));
  s = _mm256_add_ps(s, _mm256_add_ps(_mm256_add_ps(v8, v9), _mm256_add_ps(v10, v11)));
  benchmark::DoNotOptimize(s);
  return 2.0 * 8 * 12 * double(iters);
}
#undef NE_FMA12

}  // namespace

double measure_fma_peak() {
  static const double peak = [] {
    const bool avx512 = __builtin_cpu_supports("avx512f");
    std::vector<double> rates;
    for (int r = 0; r < 7; ++r) {
      const auto t0 = Clock::now();
      const double flops = avx512 ? fma_loop_avx512(20'000'000) : fma_loop_avx2(20'000'000);
      rates.push_back(flops / std::chrono::duration<double>(Clock::now() - t0).count());
    }
    std::sort(rates.begin(), rates.end());
    return rates[rates.size() / 2];
  }();
  return peak;
}

}  // namespace nodeemu
