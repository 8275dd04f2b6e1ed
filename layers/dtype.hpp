// Element types of layer tensors. bf16 and fp16 are real 16-bit storage; every kernel computes in
// fp32 and rounds to nearest-even when it stores, as tensor cores do with an fp32 accumulator.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

#include "devices/bf16.hpp"

namespace nodeemu::layers {

// I32 and I64 hold indices (routing, token slots); they are never widened or rounded.
enum class DType { F32, BF16, F16, I32, I64 };

std::size_t dtype_bytes(DType t);
const char* dtype_name(DType t);

// Round-to-nearest-even conversions. NaN stays NaN (quiet); overflow goes to infinity.
using ::nodeemu::bf16_to_f32;
using ::nodeemu::f32_to_bf16;
std::uint16_t f32_to_f16(float f);
float f16_to_f32(std::uint16_t h);

// Bulk conversion between a tensor's storage and fp32 (n elements).
void to_f32(DType t, const void* src, float* dst, std::size_t n);
void from_f32(DType t, const float* src, void* dst, std::size_t n);
// The same widening of a [rows][cols] matrix, written transposed: dst[c * rows + r] = src[r][c].
void to_f32_transposed(DType t, const void* src, float* dst, std::int64_t rows, std::int64_t cols);
// What storing in `t` does to a value: identity for fp32.
float round_to(DType t, float f);

}  // namespace nodeemu::layers
