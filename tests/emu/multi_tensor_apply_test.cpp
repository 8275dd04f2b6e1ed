// How the optimizer's fused steps are cut into launches: as Transformer Engine's
// multi_tensor_apply cuts its lists (emu/multi_tensor_apply.hpp), which decides how many kernels,
// and how much host time, a step costs.
#include <gtest/gtest.h>

#include "emu/multi_tensor_apply.hpp"

namespace nodeemu::emu {
namespace {

constexpr std::int64_t kChunk = 65536;

std::int64_t elements(const MultiTensorLaunch& l) {
  std::int64_t n = 0;
  for (const auto& s : l) n += s.end - s.begin;
  return n;
}

TEST(MultiTensorApply, LaunchesWhenTheTensorsOfOneLaunchAreFull) {
  // Adam's four lists take 36 tensors a launch; SGD's two (without momentum) 64.
  const std::vector<std::int64_t> forty(40, 1000);
  const auto adam = multi_tensor_launches(forty, 4);
  ASSERT_EQ(adam.size(), 2u);
  EXPECT_EQ(adam[0].size(), 36u);
  EXPECT_EQ(adam[1].size(), 4u);
  EXPECT_EQ(adam[1].front().tensor, 36u);
  EXPECT_EQ(multi_tensor_launches(forty, 2).size(), 1u);
  EXPECT_EQ(multi_tensor_launches(std::vector<std::int64_t>(111, 10), 1).size(), 2u);
}

TEST(MultiTensorApply, ATensorCutByTheBlockLimitCarriesOnIntoTheNextLaunch) {
  // 300 chunks, then 30: the first launch fills its 320 blocks with 20 chunks of the second.
  const auto l = multi_tensor_launches({300 * kChunk, 30 * kChunk}, 1);
  ASSERT_EQ(l.size(), 2u);
  EXPECT_EQ(elements(l[0]), 320 * kChunk);
  ASSERT_EQ(l[1].size(), 1u);
  EXPECT_EQ(l[1][0].tensor, 1u);
  EXPECT_EQ(l[1][0].begin, 20 * kChunk);
  EXPECT_EQ(l[1][0].end, 30 * kChunk);
  // A last chunk shorter than the others ends where its tensor does.
  const auto tail = multi_tensor_launches({320 * kChunk + 7}, 4);
  ASSERT_EQ(tail.size(), 2u);
  EXPECT_EQ(elements(tail[1]), 7);
}

TEST(MultiTensorApply, EmptyTensorsLaunchNothing) {
  EXPECT_TRUE(multi_tensor_launches({}, 4).empty());
  EXPECT_TRUE(multi_tensor_launches({0, 0}, 4).empty());
  const auto l = multi_tensor_launches({5, 0}, 4);
  ASSERT_EQ(l.size(), 1u);
  EXPECT_EQ(elements(l[0]), 5);
}

}  // namespace
}  // namespace nodeemu::emu
