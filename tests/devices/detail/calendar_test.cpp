#include "devices/detail/calendar.hpp"

#include <gtest/gtest.h>

#include <vector>

namespace nodeemu::detail {
namespace {

std::vector<std::uint32_t> drain(Calendar& c) {
  std::vector<std::uint32_t> order;
  for (; !c.empty(); c.pop()) order.push_back(c.next().target);
  return order;
}

TEST(Calendar, TakesEventsInTimeOrder) {
  Calendar c;
  c.schedule(30, Calendar::What::Gate, 3);
  c.schedule(10, Calendar::What::Wake, 1);
  c.schedule(20, Calendar::What::Complete, 2, 7);
  EXPECT_EQ(c.next().what, Calendar::What::Wake);
  EXPECT_EQ(drain(c), (std::vector<std::uint32_t>{1, 2, 3}));
}

// The determinism contract: events at one instant come out in the order they were scheduled,
// however many there are (a heap alone would order them by its layout).
TEST(Calendar, TiesAtOneInstantKeepTheirSchedulingOrder) {
  Calendar c;
  for (std::uint32_t i = 0; i < 100; ++i) c.schedule(i % 2 == 0 ? 5 : 4, Calendar::What::Gate, i);
  std::vector<std::uint32_t> expected;
  for (std::uint32_t i = 1; i < 100; i += 2) expected.push_back(i);
  for (std::uint32_t i = 0; i < 100; i += 2) expected.push_back(i);
  EXPECT_EQ(drain(c), expected);
}

TEST(Calendar, CarriesTheVersionOfARetimedTarget) {
  Calendar c;
  c.schedule(8, Calendar::What::FlowComplete, 4, 2);
  EXPECT_EQ(c.next().time, 8);
  EXPECT_EQ(c.next().version, 2u);
}

// Lanes change the cost, never the order: a random mix of events into lanes (in and out of
// each lane's time order) and straight into the heap comes out exactly as one heap takes it.
TEST(Calendar, LanesTakeEventsInTheSameOrderAsOneHeap) {
  Calendar with_lanes, plain;
  std::vector<std::int32_t> lanes;
  for (int i = 0; i < 4; ++i) lanes.push_back(with_lanes.add_lane());
  std::uint64_t x = 12345;
  auto next = [&] {
    x = x * 6364136223846793005ULL + 1442695040888963407ULL;
    return x >> 33;
  };
  std::vector<VTime> clock(4, 0);
  std::vector<std::uint32_t> expected, got;
  for (std::uint32_t id = 0; id < 5000; ++id) {
    const std::uint64_t r = next();
    const int lane = static_cast<int>(r % 5);  // 4: no lane
    VTime t;
    if (lane < 4) {
      clock[std::size_t(lane)] += VTime(r % 7);              // mostly forward, often ties
      t = clock[std::size_t(lane)] - (r % 11 == 0 ? 5 : 0);  // now and then out of order
    } else {
      t = VTime(r % 2000);
    }
    plain.schedule(t, Calendar::What::Gate, id);
    if (lane < 4)
      with_lanes.schedule(lanes[std::size_t(lane)], t, Calendar::What::Gate, id);
    else
      with_lanes.schedule(t, Calendar::What::Gate, id);
    // Take some as the engine does, between schedules.
    if (r % 3 == 0) {
      expected.push_back(plain.next().target);
      plain.pop();
      got.push_back(with_lanes.next().target);
      with_lanes.pop();
    }
  }
  for (; !plain.empty(); plain.pop()) expected.push_back(plain.next().target);
  for (; !with_lanes.empty(); with_lanes.pop()) got.push_back(with_lanes.next().target);
  EXPECT_EQ(got, expected);
}

// The point of a lane: only its head waits in the heap.
TEST(Calendar, ALaneInTimeOrderKeepsOnlyItsHeadInTheHeap) {
  Calendar c;
  const std::int32_t lane = c.add_lane();
  for (std::uint32_t i = 0; i < 1000; ++i) c.schedule(lane, VTime(i), Calendar::What::Gate, i);
  EXPECT_EQ(c.heap_size(), 1u);
  c.schedule(lane, 3, Calendar::What::Gate, 1000);  // behind the lane's tail: into the heap
  EXPECT_EQ(c.heap_size(), 2u);
  std::vector<std::uint32_t> order = drain(c);
  ASSERT_EQ(order.size(), 1001u);
  EXPECT_EQ(order[4], 1000u);  // after the gates at 0..3 scheduled before it
}

}  // namespace
}  // namespace nodeemu::detail
