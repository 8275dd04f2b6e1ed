// Byte copies and float accumulation for the comm/ data paths, with runtime CPU dispatch: the
// SIMD variants are compiled with per-function target attributes and picked once with
// __builtin_cpu_supports, so the binary still runs on CPUs without AVX-512 or AVX2.
#pragma once

#include <cstddef>
#include <cstdint>

namespace nodeemu::detail {

// Copies n bytes. With `streaming` (the destination will not be read again soon and n is large),
// uses non-temporal stores (AVX-512 when the CPU has avx512f, else AVX2, else memcpy), aligning
// the destination to 64 bytes with a plain head copy, and ends with an sfence so that the
// weakly-ordered stores are visible before any later release store. Otherwise plain stores: a
// vector loop below 1 MiB (faster than glibc's memcpy for cache-sized copies here), else memcpy.
void copy_bytes(void* dst, const void* src, std::size_t n, bool streaming);

// copy_bytes(dst, src, n, true) without the closing sfence, for a caller that streams many
// pieces: it must call store_fence() before anything that publishes the destination (a release
// store, an unlock), because non-temporal stores are not ordered by those.
void stream_bytes_unfenced(void* dst, const void* src, std::size_t n);
void store_fence();

// dst[i] += src[i] for i < n. Each element is one IEEE single-precision addition whatever the
// vector width or the position of i in the call, so the result does not depend on how a sum is
// split into calls. dst == src is allowed (it doubles); otherwise they must not overlap.
void add_f32(float* dst, const float* src, std::size_t n);
// dst[i] = max(dst[i], src[i]) (a NaN in either stays NaN), and dst[i] = bf16(dst[i] + src[i])
// on bf16 bit patterns, each addition in fp32 rounded to nearest-even once.
void max_f32(float* dst, const float* src, std::size_t n);
void add_bf16(std::uint16_t* dst, const std::uint16_t* src, std::size_t n);

// The copy size in bytes from which streaming stores beat memcpy on this machine.
std::size_t streaming_threshold();

}  // namespace nodeemu::detail
