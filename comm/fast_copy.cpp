#include "comm/fast_copy.hpp"

#include <immintrin.h>

#include <cmath>
#include <cstdint>
#include <cstring>

#include "devices/bf16.hpp"

namespace nodeemu::detail {
namespace {

// Bytes to copy with plain stores before `dst` reaches a 64-byte boundary: streaming stores of
// whole aligned lines never merge with a partially written line in the cache.
std::size_t head_to_line(const void* dst, std::size_t n) {
  const auto misalign = reinterpret_cast<std::uintptr_t>(dst) & 63u;
  const std::size_t head = misalign == 0 ? 0 : 64 - misalign;
  return head < n ? head : n;
}

__attribute__((target("avx512f"))) void stream_avx512(std::byte* dst, const std::byte* src,
                                                      std::size_t n) {
  const std::size_t head = head_to_line(dst, n);
  std::memcpy(dst, src, head);
  dst += head, src += head, n -= head;
  // Four lines per iteration keeps four independent loads in flight per store burst.
  for (; n >= 256; dst += 256, src += 256, n -= 256) {
    const __m512i a = _mm512_loadu_si512(src);
    const __m512i b = _mm512_loadu_si512(src + 64);
    const __m512i c = _mm512_loadu_si512(src + 128);
    const __m512i d = _mm512_loadu_si512(src + 192);
    _mm512_stream_si512(reinterpret_cast<__m512i*>(dst), a);
    _mm512_stream_si512(reinterpret_cast<__m512i*>(dst + 64), b);
    _mm512_stream_si512(reinterpret_cast<__m512i*>(dst + 128), c);
    _mm512_stream_si512(reinterpret_cast<__m512i*>(dst + 192), d);
  }
  for (; n >= 64; dst += 64, src += 64, n -= 64)
    _mm512_stream_si512(reinterpret_cast<__m512i*>(dst), _mm512_loadu_si512(src));
  std::memcpy(dst, src, n);
}

__attribute__((target("avx2"))) void stream_avx2(std::byte* dst, const std::byte* src,
                                                 std::size_t n) {
  const std::size_t head = head_to_line(dst, n);
  std::memcpy(dst, src, head);
  dst += head, src += head, n -= head;
  for (; n >= 128; dst += 128, src += 128, n -= 128) {
    const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src));
    const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + 32));
    const __m256i c = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + 64));
    const __m256i d = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + 96));
    _mm256_stream_si256(reinterpret_cast<__m256i*>(dst), a);
    _mm256_stream_si256(reinterpret_cast<__m256i*>(dst + 32), b);
    _mm256_stream_si256(reinterpret_cast<__m256i*>(dst + 64), c);
    _mm256_stream_si256(reinterpret_cast<__m256i*>(dst + 96), d);
  }
  for (; n >= 32; dst += 32, src += 32, n -= 32)
    _mm256_stream_si256(reinterpret_cast<__m256i*>(dst),
                        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src)));
  std::memcpy(dst, src, n);
}

// Plain-store copies for cache-resident data. glibc's memcpy switches to `rep movsb` between a
// few KiB and its non-temporal threshold, which on the development host's Zen4 (under KVM) is
// slower than a vector loop (median of 7, source and destination hot in cache):
//   4 KiB: memcpy 98 GB/s, loop 116 GB/s; 256 KiB: 37 vs 53; 1 MiB: 46 vs 46; 4 MiB: 46 vs 42.
// The ring's slot copies are exactly such sizes, so up to kLoopMax the loop is used.
constexpr std::size_t kLoopMax = std::size_t{1} << 20;

__attribute__((target("avx512f"))) void cached_avx512(std::byte* dst, const std::byte* src,
                                                      std::size_t n) {
  for (; n >= 256; dst += 256, src += 256, n -= 256) {
    const __m512i a = _mm512_loadu_si512(src);
    const __m512i b = _mm512_loadu_si512(src + 64);
    const __m512i c = _mm512_loadu_si512(src + 128);
    const __m512i d = _mm512_loadu_si512(src + 192);
    _mm512_storeu_si512(dst, a);
    _mm512_storeu_si512(dst + 64, b);
    _mm512_storeu_si512(dst + 128, c);
    _mm512_storeu_si512(dst + 192, d);
  }
  for (; n >= 64; dst += 64, src += 64, n -= 64) _mm512_storeu_si512(dst, _mm512_loadu_si512(src));
  std::memcpy(dst, src, n);
}

__attribute__((target("avx2"))) void cached_avx2(std::byte* dst, const std::byte* src,
                                                 std::size_t n) {
  for (; n >= 128; dst += 128, src += 128, n -= 128) {
    const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src));
    const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + 32));
    const __m256i c = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + 64));
    const __m256i d = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + 96));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst), a);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + 32), b);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + 64), c);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + 96), d);
  }
  for (; n >= 32; dst += 32, src += 32, n -= 32)
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst),
                        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src)));
  std::memcpy(dst, src, n);
}

void plain_memcpy(std::byte* dst, const std::byte* src, std::size_t n) {
  std::memcpy(dst, src, n);
}

__attribute__((target("avx512f"))) void add_avx512(float* dst, const float* src, std::size_t n) {
  std::size_t i = 0;
  for (; i + 16 <= n; i += 16)
    _mm512_storeu_ps(dst + i, _mm512_add_ps(_mm512_loadu_ps(dst + i), _mm512_loadu_ps(src + i)));
  for (; i < n; ++i) dst[i] += src[i];
}

__attribute__((target("avx2"))) void add_avx2(float* dst, const float* src, std::size_t n) {
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(dst + i, _mm256_add_ps(_mm256_loadu_ps(dst + i), _mm256_loadu_ps(src + i)));
  for (; i < n; ++i) dst[i] += src[i];
}

void add_scalar(float* dst, const float* src, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) dst[i] += src[i];
}

using StreamFn = void (*)(std::byte*, const std::byte*, std::size_t);
using AddFn = void (*)(float*, const float*, std::size_t);

struct Kernels {
  StreamFn stream;  // non-temporal stores, not fenced
  StreamFn cached;  // plain stores, for copies below kLoopMax
  AddFn add;
};

Kernels pick_kernels() {
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f")) return {stream_avx512, cached_avx512, add_avx512};
  if (__builtin_cpu_supports("avx2")) return {stream_avx2, cached_avx2, add_avx2};
  return {plain_memcpy, plain_memcpy, add_scalar};
}

// A function-local static: resolved on first use (thread-safe), so no static-initialisation
// order question arises for callers in other translation units' initialisers.
const Kernels& kernels() {
  static const Kernels k = pick_kernels();
  return k;
}

}  // namespace

void copy_bytes(void* dst, const void* src, std::size_t n, bool streaming) {
  if (n == 0) return;
  auto* to = static_cast<std::byte*>(dst);
  const auto* from = static_cast<const std::byte*>(src);
  if (streaming) {
    kernels().stream(to, from, n);
    store_fence();
  } else if (n < kLoopMax) {
    kernels().cached(to, from, n);
  } else {
    std::memcpy(to, from, n);
  }
}

void stream_bytes_unfenced(void* dst, const void* src, std::size_t n) {
  if (n == 0) return;
  kernels().stream(static_cast<std::byte*>(dst), static_cast<const std::byte*>(src), n);
}

void store_fence() {
  _mm_sfence();
}

void add_f32(float* dst, const float* src, std::size_t n) {
  kernels().add(dst, src, n);
}

void max_f32(float* dst, const float* src, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i)
    if (std::isnan(src[i]) || src[i] > dst[i]) dst[i] = src[i];
}

void add_bf16(std::uint16_t* dst, const std::uint16_t* src, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i)
    dst[i] = f32_to_bf16(bf16_to_f32(dst[i]) + bf16_to_f32(src[i]));
}

// Chosen by measurement on the development host (AMD EPYC Zen4 under KVM, 2 cores, 1 MiB L2 per
// core, 32 MiB L3, one NUMA node), median of 7 runs of copy_bytes with and without streaming:
//   size     buffers reused ("hot")         fresh buffers each copy ("cold")
//   256 KiB  memcpy 52 GB/s, stream 27 GB/s  memcpy 11 GB/s, stream 21 GB/s
//   8 MiB    memcpy 21-37 GB/s, stream 27    memcpy 10 GB/s, stream 20 GB/s
//   10 MiB   memcpy 15-21 GB/s, stream 27    memcpy  9 GB/s, stream 19 GB/s
//   64 MiB   memcpy 10 GB/s, stream 22 GB/s  memcpy 10 GB/s, stream 21 GB/s
// (glibc's memcpy does not switch to non-temporal stores by itself at 64 MiB here.) Streaming
// always wins on cold buffers, but it leaves the destination in DRAM, and a collective's output
// is usually read by the next kernel at once; with reused buffers memcpy wins by up to 2x while
// source plus destination fit in the L3 and loses from ~8 MiB (16 MiB of footprint, half the L3:
// the break-even point moved between 8 and 9 MiB from run to run). So streaming starts where
// the destination could not have stayed cached anyway.
std::size_t streaming_threshold() {
  return std::size_t{8} << 20;
}

}  // namespace nodeemu::detail
