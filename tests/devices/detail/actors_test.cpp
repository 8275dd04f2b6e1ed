#include "devices/detail/actors.hpp"

#include <gtest/gtest.h>

#include <thread>
#include <vector>

namespace nodeemu::detail {
namespace {

TEST(Actors, TheMainProgramIsActorZeroAndRunning) {
  Actors a;
  ASSERT_EQ(a.size(), 1u);
  EXPECT_EQ(a[0].name, "main");
  EXPECT_EQ(a[0].state, Actor::State::Running);
  EXPECT_EQ(a.pick(), nullptr);  // nobody else can run
}

// The determinism rule: the runnable actor with the smallest (clock, id) runs next, whatever
// order they became runnable in.
TEST(Actors, PicksTheSmallestClockThenTheSmallestId) {
  Actors a;
  a.add("r2", 2, 50, 0);
  a.add("r1", 1, 20, 0);
  a.add("r3", 3, 20, 0);
  std::vector<std::string> order;
  while (Actor* next = a.pick()) {
    EXPECT_EQ(next->state, Actor::State::Running);
    order.push_back(next->name);
  }
  EXPECT_EQ(order, (std::vector<std::string>{"r1", "r3", "r2"}));
}

TEST(Actors, AWakeMovesABlockedActorToItsWakeTimeAndCountsIt) {
  Actors a;
  Actor& r = a.add("r", 0, 10, 0);
  ASSERT_EQ(a.pick(), &r);
  a.block(r);
  a.wake(r, 5);  // never back in time
  EXPECT_EQ(r.clock, 10);
  a.wake(r, 30);  // not blocked any more: left alone, not counted
  EXPECT_EQ(r.clock, 10);
  EXPECT_EQ(a.wakes(), 1u);
  ASSERT_EQ(a.pick(), &r);
  a.block(r);
  a.wake(r, 30);
  EXPECT_EQ(r.clock, 30);
  EXPECT_EQ(a.wakes(), 2u);
}

// The hand-over: the giver's thread waits until the baton comes back; a finished actor does not.
TEST(Actors, HandOverPassesTheBatonBetweenThreads) {
  Actors a;
  Actor& main = a[0];
  Actor& r = a.add("r", 0, 0, 0);
  std::vector<int> trace;
  std::thread t([&] {
    r.sem.acquire();
    trace.push_back(1);
    r.state = Actor::State::Done;
    a.wake(main, 0);
    Actors::hand_over(r, *a.pick());  // back to main; returns at once: r is done
  });
  a.block(main);
  Actor* next = a.pick();
  ASSERT_EQ(next, &r);
  Actors::hand_over(main, *next);
  trace.push_back(2);
  t.join();
  EXPECT_EQ(trace, (std::vector<int>{1, 2}));
  EXPECT_EQ(main.state, Actor::State::Running);
}

}  // namespace
}  // namespace nodeemu::detail
