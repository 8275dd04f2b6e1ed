// The data-parallel buffer's layout, by Megatron's rules (param_and_grad_buffer.py,
// _ParamAndGradBuffer.__init__): reverse order, 64-element parameter starts and lcm(DP, 128)
// bucket ends with the distributed optimizer, buckets closed at bucket_size, the shared word
// embedding alone in its bucket.
#include <gtest/gtest.h>

#include "layers/param_and_grad_buffer.hpp"

namespace nodeemu::layers {
namespace {

TEST(BucketLayout, PlainDdpPacksInReverseOrderWithoutPadding) {
  const BucketLayout l = bucket_layout({100, 30, 7}, -1, {.dp = 4});
  ASSERT_EQ(l.buckets.size(), 1u);
  EXPECT_EQ(l.params[2].start, 0);  // the last parameter first: backward's order
  EXPECT_EQ(l.params[1].start, 7);
  EXPECT_EQ(l.params[0].start, 37);
  EXPECT_EQ(l.numel, 137);
}

TEST(BucketLayout, DistributedOptimizerPadsStartsAndBucketEnds) {
  const BucketLayout l = bucket_layout({100, 30, 7}, -1, {.dp = 3, .distributed_optimizer = true});
  EXPECT_EQ(l.params[2].start, 0);
  EXPECT_EQ(l.params[1].start, 64);
  EXPECT_EQ(l.params[0].start, 128);
  EXPECT_EQ(l.numel, 384);  // 228 rounded up to lcm(3, 128)
  EXPECT_EQ(l.shard_numel(0), 128);
}

TEST(BucketLayout, BucketsCloseAtBucketSizeAndTheSharedEmbeddingStandsAlone) {
  // Module order: embedding (shared), two layers' weights, the output layer.
  const std::vector<std::int64_t> numels = {500, 300, 300, 200};
  const BucketLayout l =
      bucket_layout(numels, 0, {.dp = 2, .distributed_optimizer = true, .bucket_size = 450});
  // Reverse: 200 (bucket 0 holds 200, then 300 more reaches 500 >= 450: closed), 300 alone
  // until the embedding, which closes the bucket before it and takes one of its own.
  ASSERT_EQ(l.buckets.size(), 3u);
  EXPECT_EQ(l.params[3].bucket, 0);
  EXPECT_EQ(l.params[2].bucket, 0);
  EXPECT_EQ(l.params[1].bucket, 1);
  EXPECT_EQ(l.params[0].bucket, 2);
  for (const auto& b : l.buckets) EXPECT_EQ(b.start % 128, 0);
  EXPECT_EQ(l.params[0].start, l.buckets[2].start);
}

}  // namespace
}  // namespace nodeemu::layers
