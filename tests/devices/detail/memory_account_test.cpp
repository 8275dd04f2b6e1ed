#include "devices/detail/memory_account.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <random>
#include <utility>
#include <vector>

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

// The peak as defined, from every change kept apart: the level after each change at an instant,
// frees first, and the level the window opens at.
std::uint64_t reference_peak(std::vector<std::pair<VTime, std::int64_t>> d, VTime from, VTime to) {
  std::stable_sort(d.begin(), d.end(), [](const auto& x, const auto& y) {
    return x.first != y.first ? x.first < y.first : x.second < y.second;
  });
  std::int64_t level = 0, peak = 0;
  for (auto& [t, v] : d) {
    if (t < from) {
      level += v;
      peak = level;
    } else if (t < to) {
      level += v;
      peak = std::max(peak, level);
    }
  }
  return static_cast<std::uint64_t>(from > 0 ? peak : std::max<std::int64_t>(peak, 0));
}

// The account sums changes booked at one instant, whatever their signs; every window's peak stays
// what the changes kept apart give, and the log is shorter.
TEST(MemoryAccount, SummingChangesAtAnInstantKeepsEveryWindowsPeak) {
  std::mt19937_64 rng(7);
  for (int trial = 0; trial < 200; ++trial) {
    MemoryAccount m(1u << 30);
    std::vector<std::pair<VTime, std::int64_t>> changes;
    std::vector<std::pair<VTime, std::uint64_t>> held;  // (allocated at, bytes)
    VTime now = 0;
    for (int step = 0; step < 60; ++step) {
      if (rng() % 3 == 0) now += VTime(rng() % 3);  // runs of changes at one instant
      if (held.empty() || rng() % 2 == 0) {
        const std::uint64_t bytes = 1 + rng() % 100;
        m.allocate(now, bytes);
        held.push_back({now, bytes});
        changes.push_back({now, std::int64_t(bytes)});
      } else {
        // Released at or after its allocation, possibly earlier than the host's clock (the
        // last use of a dropped block completes behind it).
        const std::size_t i = rng() % held.size();
        const VTime at = std::max(held[i].first, now - VTime(rng() % 2));
        m.release(at, held[i].second, false);
        changes.push_back({at, -std::int64_t(held[i].second)});
        held.erase(held.begin() + std::ptrdiff_t(i));
      }
    }
    for (VTime from = 0; from <= now + 1; ++from)
      for (VTime to = from + 1; to <= now + 2; ++to)
        ASSERT_EQ(m.peak(from, to), reference_peak(changes, from, to))
            << "trial " << trial << ", window [" << from << ", " << to << ")";
    ASSERT_EQ(m.peak(0, kEnd), reference_peak(changes, 0, kEnd));
    EXPECT_LT(m.entries(), changes.size());
  }
}

}  // namespace
}  // namespace nodeemu::detail
