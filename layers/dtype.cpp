#include "layers/dtype.hpp"

#include <immintrin.h>
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <vector>

#include "devices/check.hpp"

namespace nodeemu::layers {

std::size_t dtype_bytes(DType t) {
  switch (t) {
    case DType::F32:
    case DType::I32:
      return 4;
    case DType::BF16:
    case DType::F16:
      return 2;
    case DType::I64:
      return 8;
  }
  return 0;
}

const char* dtype_name(DType t) {
  switch (t) {
    case DType::F32:
      return "fp32";
    case DType::BF16:
      return "bf16";
    case DType::F16:
      return "fp16";
    case DType::I32:
      return "int32";
    case DType::I64:
      return "int64";
  }
  return "?";
}

std::uint16_t f32_to_f16(float f) {
  const std::uint32_t u = std::bit_cast<std::uint32_t>(f);
  const std::uint32_t sign = (u >> 16) & 0x8000u;
  const std::uint32_t absu = u & 0x7fffffffu;
  if (absu >= 0x7f800000u)  // inf or NaN
    return static_cast<std::uint16_t>(sign | 0x7c00u | (absu > 0x7f800000u ? 0x200u : 0u));
  if (absu >= 0x477ff000u) return static_cast<std::uint16_t>(sign | 0x7c00u);  // rounds to inf
  if (absu < 0x38800000u) {
    // Subnormal half (or zero): scale by 2^24 so the half's units are integers, round to even.
    const float a = std::bit_cast<float>(absu) * 16777216.0f;
    return static_cast<std::uint16_t>(sign | static_cast<std::uint32_t>(std::nearbyint(a)));
  }
  // Normal: rebias the exponent (127 -> 15), keep 10 mantissa bits, ties to even.
  std::uint32_t v = absu - 0x38000000u;
  v += 0xfffu + ((v >> 13) & 1u);
  return static_cast<std::uint16_t>(sign | (v >> 13));
}

float f16_to_f32(std::uint16_t h) {
  const std::uint32_t sign = std::uint32_t(h & 0x8000u) << 16;
  const std::uint32_t e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
  if (e == 0) {
    const float v = static_cast<float>(m) / 16777216.0f;  // m x 2^-24
    return sign ? -v : v;
  }
  if (e == 31) return std::bit_cast<float>(sign | 0x7f800000u | (m << 13));
  return std::bit_cast<float>(sign | ((e + 112u) << 23) | (m << 13));
}

namespace {

// The bf16 conversions with AVX2, 8 values a step, the same integer arithmetic as
// f32_to_bf16 / bf16_to_f32 (devices/bf16.hpp): the same bits. A functional run spent 14 % of its
// time in the scalar loops (the build targets baseline x86-64, so they ran 4 or 1 at a time).
const bool kHaveAvx2 = __builtin_cpu_supports("avx2");

__attribute__((target("avx2"))) std::size_t bf16_to_f32_avx2(const std::uint16_t* h, float* dst,
                                                             std::size_t n) {
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(h + i));
    const __m256i w = _mm256_slli_epi32(_mm256_cvtepu16_epi32(v), 16);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i), w);
  }
  return i;
}

__attribute__((target("avx2"))) __m256i round_to_bf16_avx2(__m256i u) {
  const __m256i exp = _mm256_set1_epi32(0x7f800000), man = _mm256_set1_epi32(0x007fffff);
  const __m256i is_nan =
      _mm256_andnot_si256(_mm256_cmpeq_epi32(_mm256_and_si256(u, man), _mm256_setzero_si256()),
                          _mm256_cmpeq_epi32(_mm256_and_si256(u, exp), exp));
  const __m256i quiet = _mm256_or_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(0x40));
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
  const __m256i rounded =
      _mm256_srli_epi32(_mm256_add_epi32(u, _mm256_add_epi32(_mm256_set1_epi32(0x7fff), lsb)), 16);
  return _mm256_blendv_epi8(rounded, quiet, is_nan);
}

__attribute__((target("avx2"))) std::size_t f32_to_bf16_avx2(const float* src, std::uint16_t* h,
                                                             std::size_t n) {
  std::size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m256i a =
        round_to_bf16_avx2(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i)));
    const __m256i b =
        round_to_bf16_avx2(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i + 8)));
    // Both halves hold values below 2^16, so the saturating pack is exact; it packs within each
    // 128-bit lane, and the permute puts the four 64-bit pieces back in order.
    const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(a, b), 0xd8);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(h + i), packed);
  }
  return i;
}

// dst[c * rows + r] = src[r][c] for the rows and columns that fill whole 8 x 8 blocks; returns
// the rows done (0 when there are no whole blocks). Panels of 64 source rows stay in cache while
// each destination row gets 64 consecutive values, so the writes stream.
__attribute__((target("avx2"))) std::int64_t bf16_to_f32_transposed_avx2(const std::uint16_t* h,
                                                                         float* dst,
                                                                         std::int64_t rows,
                                                                         std::int64_t cols) {
  const std::int64_t R = rows / 8 * 8, C = cols / 8 * 8;
  if (R == 0 || C == 0) return 0;
  for (std::int64_t r0 = 0; r0 < R; r0 += 64)
    for (std::int64_t c = 0; c < C; c += 8)
      for (std::int64_t r = r0; r < std::min(R, r0 + 64); r += 8) {
        __m256 v[8];
        for (int k = 0; k < 8; ++k) {
          const __m128i x =
              _mm_loadu_si128(reinterpret_cast<const __m128i*>(h + (r + k) * cols + c));
          v[k] = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(x), 16));
        }
        // The 8 x 8 transpose: pairs of rows interleaved, then quads, then the 128-bit halves.
        __m256 a[8], b[8];
        for (int k = 0; k < 8; k += 2) {
          a[k] = _mm256_unpacklo_ps(v[k], v[k + 1]);
          a[k + 1] = _mm256_unpackhi_ps(v[k], v[k + 1]);
        }
        for (int k = 0; k < 8; k += 4) {
          b[k] = _mm256_shuffle_ps(a[k], a[k + 2], 0x44);
          b[k + 1] = _mm256_shuffle_ps(a[k], a[k + 2], 0xee);
          b[k + 2] = _mm256_shuffle_ps(a[k + 1], a[k + 3], 0x44);
          b[k + 3] = _mm256_shuffle_ps(a[k + 1], a[k + 3], 0xee);
        }
        for (int k = 0; k < 4; ++k) {
          _mm256_storeu_ps(dst + (c + k) * rows + r, _mm256_permute2f128_ps(b[k], b[k + 4], 0x20));
          _mm256_storeu_ps(dst + (c + k + 4) * rows + r,
                           _mm256_permute2f128_ps(b[k], b[k + 4], 0x31));
        }
      }
  return R;
}

}  // namespace

void to_f32(DType t, const void* src, float* dst, std::size_t n) {
  NE_CHECK(t != DType::I32 && t != DType::I64, "to_f32 of an index tensor");
  if (t == DType::F32) {
    std::memcpy(dst, src, n * 4);
    return;
  }
  const auto* h = static_cast<const std::uint16_t*>(src);
  if (t == DType::BF16)
    for (std::size_t i = kHaveAvx2 ? bf16_to_f32_avx2(h, dst, n) : 0; i < n; ++i)
      dst[i] = bf16_to_f32(h[i]);
  else
    for (std::size_t i = 0; i < n; ++i) dst[i] = f16_to_f32(h[i]);
}

void from_f32(DType t, const float* src, void* dst, std::size_t n) {
  NE_CHECK(t != DType::I32 && t != DType::I64, "from_f32 into an index tensor");
  if (t == DType::F32) {
    std::memcpy(dst, src, n * 4);
    return;
  }
  auto* h = static_cast<std::uint16_t*>(dst);
  if (t == DType::BF16)
    for (std::size_t i = kHaveAvx2 ? f32_to_bf16_avx2(src, h, n) : 0; i < n; ++i)
      h[i] = f32_to_bf16(src[i]);
  else
    for (std::size_t i = 0; i < n; ++i) h[i] = f32_to_f16(src[i]);
}

void to_f32_transposed(DType t, const void* src, float* dst, std::int64_t rows, std::int64_t cols) {
  // It runs once per weight change, not per call, but at 128 rows per expert a slow one cost more
  // than the calls it saves (bench/README.md, Layers). bf16 takes the AVX2 path for whole 8 x 8
  // blocks; the edges and fp16 are widened a strip of rows at a time and written out a tile of
  // columns at a time, so both sides stay in cache.
  const auto* bytes = static_cast<const unsigned char*>(src);
  const std::int64_t done_rows =
      t == DType::BF16 && kHaveAvx2
          ? bf16_to_f32_transposed_avx2(static_cast<const std::uint16_t*>(src), dst, rows, cols)
          : 0;
  const std::int64_t done_cols = done_rows > 0 ? cols / 8 * 8 : 0;
  constexpr std::int64_t kTile = 32;
  std::vector<float> strip(std::size_t(std::min(rows, kTile) * cols));
  // With every column done, only the rows below the vector path's are left.
  for (std::int64_t r0 = done_cols == cols ? done_rows : 0; r0 < rows; r0 += kTile) {
    const std::int64_t n = std::min(kTile, rows - r0);
    to_f32(t, bytes + std::size_t(r0 * cols) * dtype_bytes(t), strip.data(), std::size_t(n * cols));
    for (std::int64_t c0 = 0; c0 < cols; c0 += kTile)
      for (std::int64_t c = c0; c < std::min(cols, c0 + kTile); ++c)
        for (std::int64_t r = 0; r < n; ++r)
          if (r0 + r >= done_rows || c >= done_cols)  // what the vector path left
            dst[c * rows + r0 + r] = strip[std::size_t(r * cols + c)];
  }
}

float round_to(DType t, float f) {
  switch (t) {
    case DType::F32:
      return f;
    case DType::BF16:
      return bf16_to_f32(f32_to_bf16(f));
    case DType::F16:
      return f16_to_f32(f32_to_f16(f));
    default:
      break;
  }
  return f;
}

}  // namespace nodeemu::layers
