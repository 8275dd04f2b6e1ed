#include "layers/detail/normal_fill.hpp"

#include <cmath>
#include <numbers>

#include "devices/check.hpp"
#include "layers/parameter.hpp"

#include "layers/detail/splitmix64_avx512.hpp"

namespace nodeemu::layers::detail {

namespace {

float slow_value(std::uint64_t seed, std::uint64_t stream, double std, std::int64_t index) {
  return float(std * counter_normal(seed, stream, std::uint64_t(index)));
}

std::size_t fill_portable(std::uint64_t seed, std::uint64_t stream, double std,
                          const std::function<std::int64_t(std::int64_t)>& global,
                          std::int64_t first, std::size_t n, float* out) {
  for (std::size_t i = 0; i < n; ++i)
    out[i] = slow_value(seed, stream, std, global(first + std::int64_t(i)));
  return n;
}

#if defined(__x86_64__)
// VL for the fp32 half-width vectors of the rounding check.
#define NODEEMU_AVX512_NORMALS __attribute__((target("avx512f,avx512dq,avx512vl")))

// parameter.cpp's splitmix: the finaliser of x + gamma.
NODEEMU_AVX512_NORMALS __m512i splitmix(__m512i x) {
  return splitmix64_finalise_x8(
      _mm512_add_epi64(x, _mm512_set1_epi64(std::int64_t(kSplitMixGamma))));
}

NODEEMU_AVX512_NORMALS __m512d horner(__m512d z, const double* c, int terms) {
  __m512d acc = _mm512_set1_pd(c[terms - 1]);
  for (int j = terms - 2; j >= 0; --j)
    acc = _mm512_add_pd(_mm512_mul_pd(acc, z), _mm512_set1_pd(c[j]));
  return acc;
}

// ln(u) for u in (0, 1]: u = m 2^e with m in [sqrt(1/2), sqrt(2)), ln m = 2 atanh(s) with
// s = (m - 1) / (m + 1), |s| < 0.172, by its series to s^19 (the first term left out is below
// 2^-55 of the sum). Relative error a few ulps: m - 1 is exact, e ln 2 is split in two.
NODEEMU_AVX512_NORMALS __m512d log_unit(__m512d u) {
  static constexpr double kOdd[] = {1.0,      1.0 / 3,  1.0 / 5,  1.0 / 7,  1.0 / 9,
                                    1.0 / 11, 1.0 / 13, 1.0 / 15, 1.0 / 17, 1.0 / 19};
  __m512d e = _mm512_maskz_getexp_pd(kAllLanes, u);
  __m512d m = _mm512_maskz_getmant_pd(kAllLanes, u, _MM_MANT_NORM_1_2, _MM_MANT_SIGN_src);
  const __mmask8 big = _mm512_cmp_pd_mask(m, _mm512_set1_pd(std::numbers::sqrt2), _CMP_GT_OQ);
  m = _mm512_mask_mul_pd(m, big, m, _mm512_set1_pd(0.5));
  e = _mm512_mask_add_pd(e, big, e, _mm512_set1_pd(1.0));
  const __m512d one = _mm512_set1_pd(1.0);
  const __m512d s = _mm512_div_pd(_mm512_sub_pd(m, one), _mm512_add_pd(m, one));
  const __m512d ln_m = _mm512_mul_pd(_mm512_add_pd(s, s), horner(_mm512_mul_pd(s, s), kOdd, 10));
  // fdlibm's split of ln 2: the high part has 32 significant bits, so e * high is exact.
  const __m512d ln2_hi = _mm512_set1_pd(6.93147180369123816490e-01);
  const __m512d ln2_lo = _mm512_set1_pd(1.90821492927058770002e-10);
  return _mm512_add_pd(_mm512_mul_pd(e, ln2_hi), _mm512_add_pd(_mm512_mul_pd(e, ln2_lo), ln_m));
}

// cos(t) for t in [0, 2 pi]: t = k pi/2 + r, |r| <= pi/4, with pi/2 in three parts of 33 bits
// (fdlibm's), so that k * part is exact and r is within 2^-52 of itself plus 1e-30. Taylor
// series of sin r to r^17 and cos r to r^16 (what they leave out is below 2^-55). `tiny` marks
// lanes whose |r| < 2^-40, where that bound no longer holds relative to a result near zero.
NODEEMU_AVX512_NORMALS __m512d cos_turn(__m512d t, __mmask8& tiny) {
  static constexpr double kSin[] = {1.0,
                                    -1.0 / 6,
                                    1.0 / 120,
                                    -1.0 / 5040,
                                    1.0 / 362880,
                                    -1.0 / 39916800,
                                    1.0 / 6227020800,
                                    -1.0 / 1307674368000,
                                    1.0 / 355687428096000};
  static constexpr double kCos[] = {1.0,
                                    -1.0 / 2,
                                    1.0 / 24,
                                    -1.0 / 720,
                                    1.0 / 40320,
                                    -1.0 / 3628800,
                                    1.0 / 479001600,
                                    -1.0 / 87178291200,
                                    1.0 / 20922789888000};
  const __m512d k =
      _mm512_maskz_roundscale_pd(kAllLanes, _mm512_mul_pd(t, _mm512_set1_pd(2 / std::numbers::pi)),
                                 _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512d r = _mm512_sub_pd(t, _mm512_mul_pd(k, _mm512_set1_pd(1.57079632673412561417e+00)));
  r = _mm512_sub_pd(r, _mm512_mul_pd(k, _mm512_set1_pd(6.07710050630396597660e-11)));
  r = _mm512_sub_pd(r, _mm512_mul_pd(k, _mm512_set1_pd(2.02226624871116645580e-21)));
  const __m512d z = _mm512_mul_pd(r, r);
  const __m512d sin_r = _mm512_mul_pd(r, horner(z, kSin, 9));
  const __m512d cos_r = horner(z, kCos, 9);
  tiny = _mm512_cmp_pd_mask(_mm512_abs_pd(r), _mm512_set1_pd(0x1p-40), _CMP_LT_OQ);
  // cos(k pi/2 + r) by k mod 4: cos r, -sin r, -cos r, sin r.
  const __m512i q = _mm512_and_si512(_mm512_cvtpd_epi64(k), _mm512_set1_epi64(3));
  const __mmask8 odd = _mm512_test_epi64_mask(q, _mm512_set1_epi64(1));
  const __mmask8 negative = _mm512_cmpeq_epi64_mask(q, _mm512_set1_epi64(1)) |
                            _mm512_cmpeq_epi64_mask(q, _mm512_set1_epi64(2));
  const __m512d c = _mm512_mask_blend_pd(odd, cos_r, sin_r);
  return _mm512_mask_sub_pd(c, negative, _mm512_setzero_pd(), c);
}

// counter_normal's word for a counter: splitmix(seed ^ splitmix(stream ^ splitmix(counter))).
NODEEMU_AVX512_NORMALS __m512i counter_word(__m512i seed, __m512i stream, __m512i counter) {
  return splitmix(_mm512_xor_si512(seed, splitmix(_mm512_xor_si512(stream, splitmix(counter)))));
}

// Eight values from their indices, as counter_normal makes them up to `log` and `cos`.
NODEEMU_AVX512_NORMALS __m512d eight_values(std::uint64_t seed, std::uint64_t stream, double std,
                                            const std::int64_t* index, __mmask8& unsure) {
  const __m512i seed_v = _mm512_set1_epi64(std::int64_t(seed));
  const __m512i stream_v = _mm512_set1_epi64(std::int64_t(stream));
  const __m512i twice = _mm512_maskz_slli_epi64(kAllLanes, _mm512_loadu_si512(index), 1);

  const __m512i a = counter_word(seed_v, stream_v, twice);
  const __m512i b = counter_word(seed_v, stream_v, _mm512_add_epi64(twice, _mm512_set1_epi64(1)));
  // The same operations as counter_normal: exact conversions (below 2^53), IEEE add and divide.
  const __m512d u1 =
      _mm512_div_pd(_mm512_add_pd(_mm512_cvtepu64_pd(shift_right_x8<11>(a)), _mm512_set1_pd(1.0)),
                    _mm512_set1_pd(9007199254740993.0));
  const __m512d u2 =
      _mm512_div_pd(_mm512_cvtepu64_pd(shift_right_x8<11>(b)), _mm512_set1_pd(9007199254740992.0));
  const __m512d radius =
      _mm512_maskz_sqrt_pd(kAllLanes, _mm512_mul_pd(_mm512_set1_pd(-2.0), log_unit(u1)));
  const __m512d angle = _mm512_mul_pd(_mm512_set1_pd(2.0 * std::numbers::pi), u2);
  const __m512d value = _mm512_mul_pd(radius, cos_turn(angle, unsure));
  return _mm512_mul_pd(_mm512_set1_pd(std), value);
}

// The lanes whose fast result `p` (within 2^-46 of counter_normal's, relative) lies more than
// 2^-40 of itself away from both points where rounding to fp32 leaves `f` = float(p): there
// counter_normal's own value rounds to `f` too. Normal floats only; zero, subnormal, huge or
// NaN lanes are left out. The gaps to the neighbouring floats and the distances are exact in
// double (Sterbenz), so only the margin's own product rounds, far inside the slack.
NODEEMU_AVX512_NORMALS __mmask8 rounds_surely(__m512d p, __m256 f) {
  const __m256i bits = _mm256_and_si256(_mm256_castps_si256(f), _mm256_set1_epi32(0x7fffffff));
  const __m256 af = _mm256_castsi256_ps(bits);
  const __mmask8 normal = _mm256_cmp_ps_mask(af, _mm256_set1_ps(0x1p-126f), _CMP_GE_OQ) &
                          _mm256_cmp_ps_mask(af, _mm256_set1_ps(0x1p127f), _CMP_LT_OQ);
  const __m512d a = _mm512_maskz_cvtps_pd(kAllLanes, af);
  const __m512d up = _mm512_maskz_cvtps_pd(
      kAllLanes, _mm256_castsi256_ps(_mm256_add_epi32(bits, _mm256_set1_epi32(1))));
  const __m512d down = _mm512_maskz_cvtps_pd(
      kAllLanes, _mm256_castsi256_ps(_mm256_sub_epi32(bits, _mm256_set1_epi32(1))));
  const __m512d ap = _mm512_abs_pd(p);
  const __m512d d = _mm512_sub_pd(ap, a);
  const __m512d margin = _mm512_mul_pd(ap, _mm512_set1_pd(0x1p-40));
  const __m512d half = _mm512_set1_pd(0.5);
  const __mmask8 above = _mm512_cmp_pd_mask(d, _mm512_setzero_pd(), _CMP_GE_OQ);
  const __m512d room =
      _mm512_mask_blend_pd(above, _mm512_add_pd(_mm512_mul_pd(_mm512_sub_pd(a, down), half), d),
                           _mm512_sub_pd(_mm512_mul_pd(_mm512_sub_pd(up, a), half), d));
  return normal & _mm512_cmp_pd_mask(room, margin, _CMP_GT_OQ);
}

NODEEMU_AVX512_NORMALS std::size_t fill_avx512(
    std::uint64_t seed, std::uint64_t stream, double std,
    const std::function<std::int64_t(std::int64_t)>& global, std::int64_t first, std::size_t n,
    float* out) {
  std::size_t slow = 0, i = 0;
  alignas(64) std::int64_t index[8];
  for (; i + 8 <= n; i += 8) {
    for (int l = 0; l < 8; ++l) index[l] = global(first + std::int64_t(i) + l);
    __mmask8 unsure = 0;
    const __m512d p = eight_values(seed, stream, std, index, unsure);
    const __m256 f = _mm512_maskz_cvtpd_ps(kAllLanes, p);
    const __mmask8 sure = __mmask8(~unsure) & rounds_surely(p, f);
    _mm256_mask_storeu_ps(out + i, sure, f);
    if (sure == kAllLanes) continue;
    for (int l = 0; l < 8; ++l)
      if (!(sure >> l & 1)) {
        out[i + std::size_t(l)] = slow_value(seed, stream, std, index[l]);
        ++slow;
      }
  }
  return slow + fill_portable(seed, stream, std, global, first + std::int64_t(i), n - i, out + i);
}

bool cpu_runs(NormalFillPath path) {
  if (path == NormalFillPath::Portable) return true;
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq") &&
         __builtin_cpu_supports("avx512vl");
}
#else
bool cpu_runs(NormalFillPath path) {
  return path == NormalFillPath::Portable;
}
#endif

}  // namespace

bool normal_fill_path_runs_here(NormalFillPath path) {
  static const bool avx512 = cpu_runs(NormalFillPath::Avx512);
  return path == NormalFillPath::Portable || avx512;
}

std::size_t fill_counter_normals(std::uint64_t seed, std::uint64_t stream, double std,
                                 const std::function<std::int64_t(std::int64_t)>& global,
                                 std::int64_t first, std::size_t n, float* out,
                                 NormalFillPath path) {
  NE_CHECK(normal_fill_path_runs_here(path), "normal fill: a path this CPU cannot run");
#if defined(__x86_64__)
  if (path == NormalFillPath::Avx512) return fill_avx512(seed, stream, std, global, first, n, out);
#endif
  return fill_portable(seed, stream, std, global, first, n, out);
}

std::size_t fill_counter_normals(std::uint64_t seed, std::uint64_t stream, double std,
                                 const std::function<std::int64_t(std::int64_t)>& global,
                                 std::int64_t first, std::size_t n, float* out) {
  static const NormalFillPath fastest = normal_fill_path_runs_here(NormalFillPath::Avx512)
                                            ? NormalFillPath::Avx512
                                            : NormalFillPath::Portable;
  return fill_counter_normals(seed, stream, std, global, first, n, out, fastest);
}

}  // namespace nodeemu::layers::detail
