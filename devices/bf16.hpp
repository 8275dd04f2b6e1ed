// bfloat16 bit patterns and fp32, round-to-nearest-even: shared by the layers' tensors and the
// channels' bf16 reductions, so both round the same way.
#pragma once
#include <bit>
#include <cstdint>

namespace nodeemu {

// NaN stays NaN (quiet, sign kept); overflow goes to infinity.
inline std::uint16_t f32_to_bf16(float f) {
  std::uint32_t u = std::bit_cast<std::uint32_t>(f);
  if ((u & 0x7f800000u) == 0x7f800000u && (u & 0x007fffffu))
    return static_cast<std::uint16_t>((u >> 16) | 0x40);
  // Ties to even: add 0x7fff plus the lowest kept bit, then truncate.
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<std::uint16_t>(u >> 16);
}

inline float bf16_to_f32(std::uint16_t h) {
  return std::bit_cast<float>(std::uint32_t(h) << 16);
}

}  // namespace nodeemu
