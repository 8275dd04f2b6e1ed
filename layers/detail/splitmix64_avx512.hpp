// Internal (layers/detail/): splitmix64's finaliser (layers/detail/splitmix64.hpp) on eight words
// at once, for the AVX-512 paths of the draws that read its stream (uniform_subset_draw.cpp,
// normal_fill.cpp). The functions carry their target: callers are compiled for at least
// AVX-512 F and DQ (vpmullq) and check the CPU before calling them.
#pragma once
#if defined(__x86_64__)
#include <immintrin.h>

#include <cstdint>

#include "layers/detail/splitmix64.hpp"

#define NODEEMU_TARGET_AVX512_F_DQ __attribute__((target("avx512f,avx512dq")))

namespace nodeemu::layers::detail {

// Every lane. Intrinsics are used in their zero-masking form with it where GCC 12's unmasked
// form starts from an undefined vector, which -Wmaybe-uninitialized reports.
inline constexpr __mmask8 kAllLanes = 0xFF;

// z >> N per lane.
template <int N>
NODEEMU_TARGET_AVX512_F_DQ inline __m512i shift_right_x8(__m512i z) {
  return _mm512_maskz_srli_epi64(kAllLanes, z, N);
}

// splitmix64_finalise of each lane.
NODEEMU_TARGET_AVX512_F_DQ inline __m512i splitmix64_finalise_x8(__m512i z) {
  z = _mm512_mullo_epi64(_mm512_xor_si512(z, shift_right_x8<30>(z)),
                         _mm512_set1_epi64(std::int64_t(kSplitMixMul1)));
  z = _mm512_mullo_epi64(_mm512_xor_si512(z, shift_right_x8<27>(z)),
                         _mm512_set1_epi64(std::int64_t(kSplitMixMul2)));
  return _mm512_xor_si512(z, shift_right_x8<31>(z));
}

}  // namespace nodeemu::layers::detail
#endif
