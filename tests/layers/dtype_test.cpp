// bf16 conversions: the vector paths of to_f32 / from_f32 give the bits of the scalar rules
// (devices/bf16.hpp) that the rest of NodeEmu (the channels' reductions, round_to) uses.
#include "layers/dtype.hpp"

#include <gtest/gtest.h>

#include <bit>
#include <cstdint>
#include <vector>

#include "devices/bf16.hpp"

namespace nodeemu::layers {
namespace {

// Every bf16 pattern, in an array whose length is not a multiple of the vector width.
TEST(Bf16, EveryPatternWidensAsTheScalarRule) {
  std::vector<std::uint16_t> h(65536 + 5);
  for (std::size_t i = 0; i < h.size(); ++i) h[i] = static_cast<std::uint16_t>(i);
  std::vector<float> f(h.size());
  to_f32(DType::BF16, h.data(), f.data(), h.size());
  for (std::size_t i = 0; i < h.size(); ++i)
    ASSERT_EQ(std::bit_cast<std::uint32_t>(f[i]), std::bit_cast<std::uint32_t>(bf16_to_f32(h[i])))
        << "pattern " << i;
}

// Every high half of an fp32 pattern (every sign, exponent, the kept mantissa bits, so every
// NaN, infinity and subnormal range) with the low halves where rounding decides: exact, just
// below a tie, the tie (to even), just above it, the largest.
TEST(Bf16, RoundingToNearestEvenMatchesTheScalarRuleAtEveryTie) {
  std::vector<float> f;
  for (std::uint32_t hi = 0; hi < 65536; ++hi)
    for (std::uint32_t lo : {0x0000u, 0x0001u, 0x7fffu, 0x8000u, 0x8001u, 0xffffu})
      f.push_back(std::bit_cast<float>(hi << 16 | lo));
  f.resize(f.size() - 3);  // a tail the vector path leaves to the scalar loop
  std::vector<std::uint16_t> h(f.size());
  from_f32(DType::BF16, f.data(), h.data(), f.size());
  for (std::size_t i = 0; i < f.size(); ++i)
    ASSERT_EQ(h[i], f32_to_bf16(f[i])) << std::hex << std::bit_cast<std::uint32_t>(f[i]);
}

TEST(Bf16, NanStaysAQuietNanAndOverflowGoesToInfinity) {
  std::vector<float> f = {std::bit_cast<float>(0x7f800001u),
                          std::bit_cast<float>(0xff800001u),
                          std::bit_cast<float>(0x7f7fffffu),
                          -0.0f,
                          1.0f,
                          3.0f,
                          1e-40f,
                          std::bit_cast<float>(0x7f800000u)};
  f.insert(f.end(), f.begin(), f.end());  // 16 values: one step of the vector path
  std::vector<std::uint16_t> h(f.size());
  from_f32(DType::BF16, f.data(), h.data(), f.size());
  for (std::size_t i = 0; i < 8; ++i) EXPECT_EQ(h[i], h[i + 8]);
  EXPECT_EQ(h[0], 0x7fc0);  // signalling NaN: quietened, sign kept
  EXPECT_EQ(h[1], 0xffc0);
  EXPECT_EQ(h[2], 0x7f80);  // the largest float rounds up to infinity
  EXPECT_EQ(h[3], 0x8000);
  EXPECT_EQ(h[4], 0x3f80);
  EXPECT_EQ(h[5], 0x4040);
  EXPECT_EQ(h[7], 0x7f80);
}

// The transposed widening gives the plain widening's values, transposed, for both 16-bit types
// and for shapes that are not multiples of its tile.
TEST(ToF32Transposed, IsTheWideningTransposed) {
  for (DType t : {DType::BF16, DType::F16})
    for (auto [rows, cols] :
         {std::pair<std::int64_t, std::int64_t>{1, 1}, {3, 70}, {33, 31}, {64, 96}, {100, 5}}) {
      std::vector<std::uint16_t> h(std::size_t(rows * cols));
      for (std::size_t i = 0; i < h.size(); ++i)
        h[i] = static_cast<std::uint16_t>(0x3c00u + (i * 37u) % 0x3ff);
      std::vector<float> plain(h.size()), transposed(h.size());
      to_f32(t, h.data(), plain.data(), h.size());
      to_f32_transposed(t, h.data(), transposed.data(), rows, cols);
      for (std::int64_t r = 0; r < rows; ++r)
        for (std::int64_t c = 0; c < cols; ++c)
          ASSERT_EQ(std::bit_cast<std::uint32_t>(transposed[std::size_t(c * rows + r)]),
                    std::bit_cast<std::uint32_t>(plain[std::size_t(r * cols + c)]))
              << dtype_name(t) << " " << rows << "x" << cols << " at " << r << "," << c;
    }
}

}  // namespace
}  // namespace nodeemu::layers
