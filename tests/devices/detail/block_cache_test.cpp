// The cache of released host blocks: a block is handed out again for any size of its class (or a
// smaller one, down to half), the newest first; a full cache gives up its oldest blocks rather than
// refusing new ones; and it may hold what keeps the blocks within the most ever in use at once.
#include "devices/detail/block_cache.hpp"

#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

namespace nodeemu::numa::detail {
namespace {

constexpr std::size_t kPage = 4096;

Placement block(std::uintptr_t id, std::size_t capacity, int node = 0) {
  Placement p;
  p.ptr = reinterpret_cast<void*>(id * kPage);
  p.bytes = capacity;
  p.capacity = capacity;
  p.requested_node = node;
  return p;
}

TEST(BlockCacheCapacity, WholePagesThenAnEighthOfThePowerOfTwo) {
  EXPECT_EQ(capacity_for(1, kPage), kPage);
  EXPECT_EQ(capacity_for(16 * kPage, kPage), 16 * kPage);
  EXPECT_EQ(capacity_for(16 * kPage + 1, kPage), 18 * kPage);         // 17 pages: steps of 2
  EXPECT_EQ(capacity_for(512 << 10, kPage), std::size_t(512) << 10);  // a power of two stays
  EXPECT_EQ(capacity_for((512 << 10) + 1, kPage), std::size_t(576) << 10);
  // Every size maps into [bytes, 1.125 * bytes + a page], and sizes of one class share it.
  for (std::size_t b = 1; b < (std::size_t(8) << 20); b = b * 5 / 4 + 4093) {
    const std::size_t c = capacity_for(b, kPage);
    EXPECT_GE(c, b);
    EXPECT_LE(double(c), 1.125 * double(b) + double(kPage)) << b;
    EXPECT_EQ(c % kPage, 0u);
    EXPECT_EQ(capacity_for(c, kPage), c) << b;
  }
}

TEST(BlockCache, HandsOutTheNewestBlockOfTheClassOnItsNode) {
  std::vector<void*> released;
  BlockCache cache(100 * kPage, [&](const Placement& p) { released.push_back(p.ptr); });
  ASSERT_TRUE(cache.keep(block(1, 8 * kPage)));
  ASSERT_TRUE(cache.keep(block(2, 8 * kPage)));
  ASSERT_TRUE(cache.keep(block(3, 8 * kPage, 1)));
  EXPECT_EQ(cache.cached_bytes(), 24 * kPage);
  Placement out;
  EXPECT_FALSE(cache.take(0, 4 * kPage, out));  // another class
  ASSERT_TRUE(cache.take(0, 8 * kPage, out));
  EXPECT_EQ(out.ptr, block(2, 0).ptr);  // the newest
  ASSERT_TRUE(cache.take(1, 8 * kPage, out));
  EXPECT_EQ(out.ptr, block(3, 0).ptr);  // its own node's
  ASSERT_TRUE(cache.take(0, 8 * kPage, out));
  EXPECT_EQ(out.ptr, block(1, 0).ptr);
  EXPECT_FALSE(cache.take(0, 8 * kPage, out));
  EXPECT_EQ(cache.cached_bytes(), 0u);
  EXPECT_TRUE(released.empty());
}

TEST(BlockCache, AFullCacheGivesUpItsOldestBlocks) {
  std::vector<void*> released;
  BlockCache cache(10 * kPage, [&](const Placement& p) { released.push_back(p.ptr); });
  ASSERT_TRUE(cache.keep(block(1, 4 * kPage)));
  ASSERT_TRUE(cache.keep(block(2, 2 * kPage)));
  ASSERT_TRUE(cache.keep(block(3, 4 * kPage)));
  EXPECT_TRUE(released.empty());
  // 6 more pages need 6 freed: block 1 (4), then block 2 (2), the two released longest ago.
  ASSERT_TRUE(cache.keep(block(4, 6 * kPage)));
  EXPECT_EQ(released, (std::vector<void*>{block(1, 0).ptr, block(2, 0).ptr}));
  EXPECT_EQ(cache.cached_bytes(), 10 * kPage);
  Placement out;
  EXPECT_FALSE(cache.take(0, 2 * kPage, out));
  ASSERT_TRUE(cache.take(0, 4 * kPage, out));
  EXPECT_EQ(out.ptr, block(3, 0).ptr);
  // A block larger than the whole cap is not kept, and nothing is given up for it.
  EXPECT_FALSE(cache.keep(block(5, 11 * kPage)));
  EXPECT_EQ(released.size(), 2u);
  EXPECT_EQ(cache.cached_bytes(), 6 * kPage);
}

TEST(BlockCache, AKeptBlockServesSmallerClassesDownToHalfItsSize) {
  BlockCache cache(100 * kPage, [](const Placement&) {});
  ASSERT_TRUE(cache.keep(block(1, 8 * kPage)));
  ASSERT_TRUE(cache.keep(block(2, 16 * kPage)));
  Placement out;
  EXPECT_FALSE(cache.take(0, 4 * kPage, out));  // 8 pages would waste half
  ASSERT_TRUE(cache.take(0, 5 * kPage, out));   // the smallest class that fits
  EXPECT_EQ(out.ptr, block(1, 0).ptr);
  EXPECT_EQ(out.capacity, 8 * kPage);  // it keeps its own size, and comes back under it
  EXPECT_EQ(cache.cached_bytes(), 16 * kPage);
  EXPECT_FALSE(cache.take(1, 10 * kPage, out));  // another node's request
  ASSERT_TRUE(cache.take(0, 10 * kPage, out));
  EXPECT_EQ(out.ptr, block(2, 0).ptr);
  EXPECT_EQ(cache.cached_bytes(), 0u);
}

// The end of an iteration frees more than the cap at once; the next iteration asks for the same
// blocks again. The cache keeps them while held blocks stay within the most ever in use.
TEST(BlockCache, TheBudgetStretchesToTheMostEverInUse) {
  std::vector<void*> released;
  BlockCache cache(10 * kPage, [&](const Placement& p) { released.push_back(p.ptr); });
  for (int i = 0; i < 3; ++i) cache.mapped(10 * kPage);  // 30 pages in use
  for (std::uintptr_t id = 1; id <= 3; ++id) ASSERT_TRUE(cache.keep(block(id, 10 * kPage)));
  EXPECT_EQ(cache.cached_bytes(), 30 * kPage);  // past the cap, within the 30 once in use
  EXPECT_TRUE(released.empty());
  Placement out;
  ASSERT_TRUE(cache.take(0, 10 * kPage, out));  // in use 10, kept 20: still 30
  // A fresh block of another class: in use 14, so at most 16 kept; the oldest gives way.
  cache.mapped(4 * kPage);
  EXPECT_EQ(released, (std::vector<void*>{block(1, 0).ptr}));
  EXPECT_EQ(cache.cached_bytes(), 10 * kPage);
  // Blocks unmapped while in use (pinned ones) lower what is in use, not the mark.
  cache.unmapped(4 * kPage);
  ASSERT_TRUE(cache.keep(block(3, 10 * kPage)));
  EXPECT_EQ(cache.cached_bytes(), 20 * kPage);
  EXPECT_EQ(released.size(), 1u);
  // Never above the cap or the mark: a block larger than both is refused, nothing given up.
  EXPECT_FALSE(cache.keep(block(4, 31 * kPage)));
  EXPECT_EQ(released.size(), 1u);
}

TEST(BlockCache, ThePeakIsTheMostHeldAtOnceSinceTheLastReset) {
  BlockCache cache(10 * kPage, [](const Placement&) {});
  ASSERT_TRUE(cache.keep(block(1, 4 * kPage)));
  ASSERT_TRUE(cache.keep(block(2, 4 * kPage)));
  Placement out;
  ASSERT_TRUE(cache.take(0, 4 * kPage, out));
  EXPECT_EQ(cache.peak_bytes(), 8 * kPage);
  cache.reset_peak();  // restarts from what is held now
  EXPECT_EQ(cache.peak_bytes(), 4 * kPage);
  ASSERT_TRUE(cache.keep(block(3, 6 * kPage)));
  ASSERT_TRUE(cache.keep(block(4, 4 * kPage)));  // gives up block 1: never above the cap
  EXPECT_EQ(cache.peak_bytes(), 10 * kPage);
}

}  // namespace
}  // namespace nodeemu::numa::detail
