// The kept forward copy of a 16-bit expert weight: made once per weight change, never stale, and
// never a change to the numerics.
#include "layers/transposed_weight_copy.hpp"

#include <gtest/gtest.h>

#include "layers/kernel_choices.hpp"
#include "layers/ops.hpp"
#include "layers/parameter.hpp"
#include "tests/layers/model_support.hpp"

namespace nodeemu::layers {
namespace {

TEST(TransposedWeightCopy, IsKeptWhileTheBitsHoldAndRemadeWhenTheyChange) {
  // 2 groups of a [3][2] weight ([g][out][in]), element k holding k + 1.
  std::vector<std::uint16_t> w(12);
  for (std::size_t i = 0; i < w.size(); ++i) w[i] = f32_to_bf16(float(i + 1));
  const View v{w.data(), DType::BF16, 12};
  TransposedWeightCopy copy;
  const auto first = copy.of(v, 2, 3, 2);
  // [g][in][out]: group 1, in 1, out 2 is the weight's group 1, out 2, in 1 (element 6 + 5).
  EXPECT_EQ(first->transposed[6 + 1 * 3 + 2], 12.0f);
  EXPECT_EQ(first->transposed[0 * 3 + 1], 3.0f);  // group 0, in 0, out 1: element 2
  EXPECT_EQ(copy.of(v, 2, 3, 2), first) << "the same bits: the kept copy";
  w[11] = f32_to_bf16(-4.0f);  // as an optimizer step would write it
  const auto second = copy.of(v, 2, 3, 2);
  EXPECT_NE(second, first);
  EXPECT_EQ(second->transposed[6 + 1 * 3 + 2], -4.0f);
  EXPECT_EQ(first->transposed[6 + 1 * 3 + 2], 12.0f) << "a holder's copy is never changed";
}

// A weights generation is the caller's promise that nothing writes the weight while it lasts
// (the trainer's iteration): only its first use compares the bits; a new generation compares
// again and sees a write made between the two; generation 0 compares at every use.
TEST(TransposedWeightCopy, WithinAGenerationOnlyTheFirstUseComparesTheBits) {
  std::vector<std::uint16_t> w(4096, f32_to_bf16(1.0f));
  const View v{w.data(), DType::BF16, 4096};
  TransposedWeightCopy copy;
  const auto first = copy.of(v, 1, 64, 64, 1);
  EXPECT_EQ(copy.made(), 1u);
  const std::uint64_t compared = copy.compared();
  for (int microbatch = 1; microbatch < 4; ++microbatch) EXPECT_EQ(copy.of(v, 1, 64, 64, 1), first);
#ifdef NDEBUG
  EXPECT_EQ(copy.compared(), compared) << "the promise saves the comparison";
#else
  EXPECT_EQ(copy.compared(), compared + 3) << "a build with assertions checks every promise";
#endif
  w[7] = f32_to_bf16(3.0f);  // the optimizer step, between two iterations
  const auto second = copy.of(v, 1, 64, 64, 2);
  EXPECT_EQ(copy.made(), 2u);
  EXPECT_EQ(second->transposed[7 * 64], 3.0f);
  EXPECT_EQ(copy.of(v, 1, 64, 64, 2), second);
  // A generation whose first use finds the bits unchanged keeps the copy, and trusts it after.
  const auto third = copy.of(v, 1, 64, 64, 3);
  EXPECT_EQ(third, second);
  EXPECT_EQ(copy.made(), 2u);
  const std::uint64_t before = copy.compared();
  copy.of(v, 1, 64, 64, 0);
  copy.of(v, 1, 64, 64, 0);
  EXPECT_EQ(copy.compared(), before + 2) << "no generation: every use compares";
#ifdef NDEBUG
  copy.of(v, 1, 64, 64, 3);
  EXPECT_EQ(copy.compared(), before + 2) << "and leaves generation 3's comparison standing";
#endif
}

#ifndef NDEBUG
// With assertions on (the ASan+UBSan preset), a weight written inside a generation is a broken
// promise, reported, not a silently stale copy.
TEST(TransposedWeightCopyDeathTest, AWriteInsideAGenerationIsReportedWhereAssertionsAreOn) {
  std::vector<std::uint16_t> w(4096, f32_to_bf16(1.0f));
  const View v{w.data(), DType::BF16, 4096};
  TransposedWeightCopy copy;
  copy.of(v, 1, 64, 64, 5);
  w[0] = f32_to_bf16(2.0f);
  EXPECT_DEATH(copy.of(v, 1, 64, 64, 5), "written inside a weights generation");
}
#endif

// A weight changes once a step; its new copy refills the old one's storage when nobody holds the
// old one any more, so the host keeps one copy per weight, not two.
TEST(TransposedWeightCopy, ANewCopyReusesTheStorageOfOneNobodyHolds) {
  std::vector<std::uint16_t> w(4096, f32_to_bf16(1.0f));
  const View v{w.data(), DType::BF16, 4096};
  TransposedWeightCopy copy;
  const float* first = copy.of(v, 1, 64, 64)->transposed.data();
  w[5] = f32_to_bf16(2.0f);
  const auto second = copy.of(v, 1, 64, 64);
  EXPECT_EQ(second->transposed.data(), first);
  EXPECT_EQ(second->transposed[5 * 64], 2.0f);
}

// Through the op: the grouped expert forward of a bf16 weight with a kept copy gives the bits of
// the plain path, and still does after the weight is written between calls.
TEST(TransposedWeightCopy, TheExpertForwardGivesThePlainPathsBitsAcrossAWeightWrite) {
  Node node(testing::model_options(1));
  node.run([&](Host& host) {
    Device& dev = host.device();
    Stream s = dev.default_stream();
    KernelChoices k;
    k.grouped_gemm = true;
    const ops::At at{s, nullptr, nullptr, &k};
    Parameter w =
        make_parameter(dev, "experts.fc1", {3, 40, 24}, DType::BF16, Init::Normal, 0.1, 7, 0, true);
    keep_forward_copy(w);
    ASSERT_TRUE(w.forward_copy);
    Tensor x = Tensor::empty(dev, {50, 24}, DType::BF16);
    std::vector<float> xv(50 * 24);
    for (std::size_t i = 0; i < xv.size(); ++i) xv[i] = float(int(i % 17) - 8) * 0.125f;
    x.copy_from_f32(xv);
    const ops::Rows rows{20, 0, 30};
    for (int round = 0; round < 2; ++round) {
      const Tensor kept = ops::linear_forward(at, "fc1", x, w, rows, DType::BF16);
      const Tensor again = ops::linear_forward(at, "fc1", x, w, rows, DType::BF16);
      const Tensor plain = ops::linear_forward(at, "fc1", x, w.value, rows, DType::BF16);
      s.synchronize();
      EXPECT_EQ(kept.to_f32(), plain.to_f32()) << "round " << round;
      EXPECT_EQ(again.to_f32(), plain.to_f32()) << "round " << round;
      // One copy per weight version: the second forward of a round used the kept one.
      EXPECT_EQ(w.forward_copy->made(), std::uint64_t(round + 1));
      auto values = w.value.to_f32();
      for (auto& v : values) v = -2.0f * v + 0.25f;
      w.value.copy_from_f32(values);
    }
  });
}

}  // namespace
}  // namespace nodeemu::layers
