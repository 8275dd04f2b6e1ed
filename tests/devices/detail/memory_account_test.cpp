#include "devices/detail/memory_account.hpp"

#include <gtest/gtest.h>

#include <limits>

namespace nodeemu::detail {
namespace {

constexpr VTime kEnd = std::numeric_limits<VTime>::max();

TEST(MemoryAccount, KeepsLiveBytesAgainstTheCapacity) {
  MemoryAccount m(100);
  EXPECT_TRUE(m.fits(100));
  m.allocate(0, 60);
  EXPECT_EQ(m.live(), 60u);
  EXPECT_TRUE(m.fits(40));
  EXPECT_FALSE(m.fits(41));
  m.release(5, 60, false);
  EXPECT_EQ(m.live(), 0u);
}

// record_stream semantics: bytes the host dropped stay live (and deferred) until released.
TEST(MemoryAccount, DeferredBytesStayLiveUntilReleased) {
  MemoryAccount m(100);
  m.allocate(0, 30);
  m.defer(30);
  EXPECT_EQ(m.live(), 30u);
  EXPECT_EQ(m.deferred(), 30u);
  m.release(9, 30, true);
  EXPECT_EQ(m.live(), 0u);
  EXPECT_EQ(m.deferred(), 0u);
}

TEST(MemoryAccount, ThePeakCountsFreesBeforeAllocationsAtOneInstant) {
  MemoryAccount m(1000);
  m.allocate(0, 100);
  m.allocate(10, 50);  // booked before the free below, at the same instant
  m.release(10, 100, false);
  EXPECT_EQ(m.peak(0, kEnd), 100u);  // the 50 reuse the 100 handed back at t = 10
}

TEST(MemoryAccount, ThePeakOfAWindowCountsTheLevelItOpensAt) {
  MemoryAccount m(1000);
  m.allocate(0, 100);
  m.allocate(20, 30);
  m.release(30, 30, false);
  m.allocate(40, 5);
  EXPECT_EQ(m.peak(0, kEnd), 130u);
  EXPECT_EQ(m.peak(0, 20), 100u);   // [0, 20): the 30 come at 20
  EXPECT_EQ(m.peak(25, 35), 130u);  // opens at 130
  EXPECT_EQ(m.peak(35, kEnd), 105u);
}

}  // namespace
}  // namespace nodeemu::detail
