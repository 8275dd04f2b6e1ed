// HybridEP's sync-free permute (sort_within_budget) against the rule of its preprocessing kernel:
// each expert starts after the previous experts' pairs padded to the alignment, pairs placed at
// or past the budget are dropped, the kept pairs per expert are padded for the grouped GEMM, and
// the overflow flag is set once anything was dropped.
#include <gtest/gtest.h>

#include "layers/token_permute.hpp"
#include "tests/layers/model_support.hpp"

namespace nodeemu::layers {
namespace {

struct Permuted {
  std::vector<float> rows, probs;
  std::vector<std::int32_t> slots;
  std::vector<std::int64_t> per_expert;
  std::int32_t overflow = 0;
};

// Six received rows (row r's values all r + 1), top-2 local expert ids, into `budget` rows with
// alignment 4: expert 0 gets 5 pairs, expert 1 gets 6, expert 2 gets 1.
Permuted permute(std::int64_t budget) {
  const std::vector<std::int64_t> ids = {0, 1, 0, 1, 0, 1, 1, 0, 1, 0, 1, 2};
  Node node(testing::model_options(1));
  Permuted out;
  node.run([&](Host& host) {
    Device& dev = host.device();
    Stream s = dev.default_stream();
    const ops::At at{s, nullptr};
    Tensor x = Tensor::empty(dev, {6, 3}, DType::F32), idx = Tensor::empty(dev, {6, 2}, DType::I64),
           p = Tensor::empty(dev, {6, 2}, DType::F32);
    std::vector<float> xv(18), pv(12);
    for (int i = 0; i < 18; ++i) xv[std::size_t(i)] = float(i / 3 + 1);
    for (int i = 0; i < 12; ++i) pv[std::size_t(i)] = 0.01f * float(i + 1);
    x.copy_from_f32(xv);
    p.copy_from_f32(pv);
    std::copy(ids.begin(), ids.end(), idx.data<std::int64_t>());
    Tensor overflow = Tensor::empty(dev, {1}, DType::I32), per_expert;
    Sorted sorted = sort_within_budget(at, "hybridep_permute", x, idx, p, 2, 3, 4, budget,
                                       per_expert, overflow);
    s.synchronize();
    out.rows = sorted.rows.to_f32();
    out.probs = sorted.probs.to_f32();
    const auto* sl = sorted.slots.data<std::int32_t>();
    out.slots.assign(sl, sl + budget);
    const auto* n = per_expert.data<std::int64_t>();
    out.per_expert.assign(n, n + 3);
    out.overflow = overflow.data<std::int32_t>()[0];
  });
  return out;
}

TEST(SortWithinBudget, KeepsEveryPairWhenThePaddedExpertsFit) {
  // Expert 0 at 0 (5 pairs, padded to 8), expert 1 at 8 (6, padded to 8), expert 2 at 16.
  const Permuted p = permute(20);
  EXPECT_EQ(p.per_expert, (std::vector<std::int64_t>{8, 8, 4}));
  EXPECT_EQ(p.overflow, 0);
  const std::vector<std::int32_t> want = {0, 2, 4, 7,  9,  -1, -1, -1, 1,  3,
                                          5, 6, 8, 10, -1, -1, 11, -1, -1, -1};
  EXPECT_EQ(p.slots, want);
  for (std::size_t i = 0; i < want.size(); ++i) {
    const float row = want[i] < 0 ? 0.0f : float(want[i] / 2 + 1);
    EXPECT_EQ(p.rows[i * 3 + 2], row) << "place " << i;
    EXPECT_EQ(p.probs[i], want[i] < 0 ? 0.0f : 0.01f * float(want[i] + 1)) << "place " << i;
  }
}

TEST(SortWithinBudget, DropsThePairsPastTheBudgetAndSetsTheOverflowFlag) {
  // Budget 12: expert 1 keeps places 8..11 (4 of its 6 pairs); expert 2 would start at 16.
  const Permuted p = permute(12);
  EXPECT_EQ(p.per_expert, (std::vector<std::int64_t>{8, 4, 0}));
  EXPECT_EQ(p.overflow, 1);
  const std::vector<std::int32_t> want = {0, 2, 4, 7, 9, -1, -1, -1, 1, 3, 5, 6};
  EXPECT_EQ(p.slots, want);
}

}  // namespace
}  // namespace nodeemu::layers
