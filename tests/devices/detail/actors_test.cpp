#include "devices/detail/actors.hpp"

#include <gtest/gtest.h>

#include <cstdlib>
#include <exception>
#include <string>
#include <thread>
#include <vector>

#include "devices/host_topology.hpp"

namespace nodeemu::detail {
namespace {

// A body for actors that are picked but never handed the baton.
std::function<Actor&()> unused() {
  return []() -> Actor& { std::abort(); };
}

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
  a.add("r2", 2, 50, 0, unused());
  a.add("r1", 1, 20, 0, unused());
  a.add("r3", 3, 20, 0, unused());
  std::vector<std::string> order;
  while (Actor* next = a.pick()) {
    EXPECT_EQ(next->state, Actor::State::Running);
    order.push_back(next->name);
  }
  EXPECT_EQ(order, (std::vector<std::string>{"r1", "r3", "r2"}));
}

TEST(Actors, AWakeMovesABlockedActorToItsWakeTimeAndCountsIt) {
  Actors a;
  Actor& r = a.add("r", 0, 10, 0, unused());
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

// An actor's body: ends Done and returns whoever runs next (what Engine::run_actors does).
std::function<Actor&()> finishing(Actors& a, std::vector<int>& trace, int mark) {
  return [&a, &trace, mark]() -> Actor& {
    Actor& self = a.running();
    trace.push_back(mark);
    self.state = Actor::State::Done;
    a.wake(a[0], 0);
    return *a.pick();
  };
}

// The hand-over: the giver stops where it is until the baton comes back; a finished actor hands
// it on for good. Everything runs on this one thread.
TEST(Actors, HandOverRunsTheNextActorAndComesBack) {
  Actors a;
  Actor& main = a[0];
  std::vector<int> trace;
  Actor& r = a.add("r", 0, 0, 0, finishing(a, trace, 1));
  a.block(main);
  Actor* next = a.pick();
  ASSERT_EQ(next, &r);
  a.hand_over(main, *next);
  trace.push_back(2);
  EXPECT_EQ(trace, (std::vector<int>{1, 2}));
  EXPECT_EQ(&a.running(), &main);
  EXPECT_EQ(main.state, Actor::State::Running);
  EXPECT_EQ(r.state, Actor::State::Done);
  EXPECT_FALSE(r.context);  // its stack is gone
}

// A finished actor's stack is the next actor's: a node.run makes an actor per rank, and mapping a
// fresh stack for each was most of an empty run's cost.
TEST(Actors, AFinishedActorsStackIsTheNextOnes) {
  Actors a;
  Actor& main = a[0];
  std::vector<int> trace;
  for (int round = 0; round < 3; ++round) {
    Actor& r = a.add("r" + std::to_string(round), 0, 0, 0, finishing(a, trace, round));
    Actor& s = a.add("s" + std::to_string(round), 1, 0, 0, finishing(a, trace, 10 + round));
    a.block(main);
    a.hand_over(main, *a.pick());  // r runs and finishes, back to main (clock 0, id 0)
    a.block(main);
    a.hand_over(main, *a.pick());  // then s
    EXPECT_EQ(r.state, Actor::State::Done);
    EXPECT_EQ(s.state, Actor::State::Done);
    // r's stack went back to the pool before s started, so s ran on it.
    EXPECT_EQ(s.stack_bottom, r.stack_bottom);
    EXPECT_EQ(a.stacks_mapped(), 1u) << "round " << round;
  }
  EXPECT_EQ(trace, (std::vector<int>{0, 10, 1, 11, 2, 12}));
}

// Two actors that block and wake each other resume exactly where they stopped, their locals
// intact (each on its own stack), in the order the baton is passed.
TEST(Actors, BlockedActorsResumeWhereTheyStopped) {
  Actors a;
  Actor& main = a[0];
  std::vector<std::string> trace;
  auto ping_pong = [&a, &trace](const std::string& me, int other_id) {
    return [&a, &trace, me, other_id]() -> Actor& {
      Actor& self = a.running();
      for (int round = 0; round < 3; ++round) {
        const std::string local = me + std::to_string(round);
        trace.push_back(local);
        Actor& other = a[static_cast<std::size_t>(other_id)];
        a.wake(other, self.clock);
        if (round < 2) {
          a.block(self);
          Actor* next = a.pick();
          a.hand_over(self, *next);
          EXPECT_EQ(local, me + std::to_string(round));  // our stack survived the switch
        }
      }
      self.state = Actor::State::Done;
      a.wake(a[0], 0);
      return *a.pick();
    };
  };
  Actor& x = a.add("x", 0, 0, 0, ping_pong("x", 2));
  Actor& y = a.add("y", 1, 0, 0, ping_pong("y", 1));
  // main hands over to x; x and y pass the baton to and fro; x finishes first and hands it to
  // main (clock 0, id 0, before y); main then lets y finish.
  a.block(main);
  a.hand_over(main, *a.pick());
  EXPECT_EQ(x.state, Actor::State::Done);
  EXPECT_EQ(y.state, Actor::State::Runnable);
  a.block(main);
  a.hand_over(main, *a.pick());
  EXPECT_EQ(y.state, Actor::State::Done);
  EXPECT_EQ(trace, (std::vector<std::string>{"x0", "y0", "x1", "y1", "x2", "y2"}));
}

// bindpcie with fibers: every actor runs on one thread, so the thread is re-bound to the next
// actor's CPU set on a hand-over when it differs, and only then.
TEST(Actors, AHandOverRebindsTheThreadToTheNextActorsCpus) {
  const std::vector<int> all = HostTopology::current_thread_binding();
  if (all.size() < 2) GTEST_SKIP() << "needs two PUs to tell two bindings apart";
  std::vector<int> seen_main, seen_r;
  std::uint64_t rebinds = 0;
  std::exception_ptr failure;
  // A thread of its own, whose binding the test may change: the actors' thread.
  std::thread t([&] {
    try {
      Actors a;
      Actor& main = a[0];
      main.binding = a.intern_binding(all);
      Actor& r = a.add("r", 0, 0, 0, [&]() -> Actor& {
        Actor& self = a.running();
        seen_r = HostTopology::current_thread_binding();
        self.state = Actor::State::Done;
        a.wake(a[0], 0);
        return *a.pick();
      });
      r.binding = a.intern_binding({all.front()});
      EXPECT_EQ(a.intern_binding(all), main.binding);  // equal sets share an index
      a.block(main);
      a.hand_over(main, *a.pick());
      seen_main = HostTopology::current_thread_binding();
      rebinds = a.rebinds();
    } catch (...) {
      failure = std::current_exception();
    }
  });
  t.join();
  if (failure) std::rethrow_exception(failure);
  EXPECT_EQ(seen_r, std::vector<int>{all.front()});
  EXPECT_EQ(seen_main, all);
  EXPECT_EQ(rebinds, 2u);  // to r's set, and back to main's
}

}  // namespace
}  // namespace nodeemu::detail
