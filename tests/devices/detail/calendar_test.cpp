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

}  // namespace
}  // namespace nodeemu::detail
