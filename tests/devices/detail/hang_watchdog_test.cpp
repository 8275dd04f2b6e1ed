#include "devices/detail/hang_watchdog.hpp"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <thread>

namespace nodeemu::detail {
namespace {

using namespace std::chrono_literals;

// A rendezvous left open past the timeout ends the process with status 3 and one report naming
// it and what the blocked hosts wait on, as NCCL's watchdog tears a job down. The texts come from
// the engine when the watchdog asks (a thread plays the engine's part here).
TEST(HangWatchdogDeathTest, AnOpenRendezvousPastTheTimeoutEndsTheProcessWithAReport) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        HangWatchdog w;
        w.start(0.05);
        w.open(3, "all_reduce #3 on group dp");
        while (!w.wants_report()) std::this_thread::sleep_for(1ms);
        w.supply({{3, "all_reduce #3 on group dp: issued by rank 0; 1 of 2 never issued it"}},
                 {"rank 0 waits on 'all_reduce'"});
        std::this_thread::sleep_for(5s);
      },
      testing::ExitedWithCode(3),
      "hang: all_reduce #3 on group dp: issued by rank 0; 1 of 2 never issued it, for more than "
      "0.05 s.*; rank 0 waits on 'all_reduce'");
}

// A host stuck outside NodeEmu never calls in to describe the state: the report still goes out,
// after a grace period, with the label the rendezvous was opened with.
TEST(HangWatchdogDeathTest, WithoutTheEnginesTextsTheReportNamesTheRendezvous) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        HangWatchdog w;
        w.start(0.05);
        w.open(7, "broadcast #7 on group tp");
        std::this_thread::sleep_for(5s);
      },
      testing::ExitedWithCode(3), "hang: broadcast #7 on group tp, for more than 0.05 s");
}

TEST(HangWatchdog, AClosedRendezvousIsNotAHang) {
  HangWatchdog w;
  w.start(0.02);
  EXPECT_TRUE(w.on());
  w.open(1, "broadcast #1");
  w.close(1);
  std::this_thread::sleep_for(150ms);
  EXPECT_FALSE(w.wants_report());
}

// Overdue is not hung until the report goes out: a rendezvous that completes while the watchdog
// waits for the texts (a slow run) withdraws the request.
TEST(HangWatchdog, ARendezvousThatCompletesLateIsNotAHang) {
  HangWatchdog w;
  w.start(0.05);
  w.open(2, "all_gather #2");
  const auto give_up = std::chrono::steady_clock::now() + 5s;
  while (!w.wants_report() && std::chrono::steady_clock::now() < give_up)
    std::this_thread::sleep_for(1ms);
  ASSERT_TRUE(w.wants_report());
  w.close(2);
  std::this_thread::sleep_for(1500ms);  // past the grace period
  EXPECT_FALSE(w.wants_report());
}

// Watched time follows the wall clock tick by tick, but a gap longer than the most a tick may
// count (the ticking thread did not run) counts only that much.
TEST(WatchedTime, FollowsTicksOnScheduleAndCapsAGap) {
  const auto t0 = WatchedTime::Clock::now();
  const auto at = [&](double s) {
    return t0 + std::chrono::duration_cast<WatchedTime::Clock::duration>(
                    std::chrono::duration<double>(s));
  };
  WatchedTime w(t0, std::chrono::duration<double>(0.35));
  EXPECT_NEAR(w.tick(at(0.1)), 0.1, 1e-9);
  EXPECT_NEAR(w.at(at(0.2)), 0.2, 1e-9);      // between ticks, without ticking
  EXPECT_NEAR(w.tick(at(10.2)), 0.45, 1e-9);  // stopped for ten seconds: one capped step
  EXPECT_NEAR(w.tick(at(10.3)), 0.55, 1e-9);
  EXPECT_NEAR(w.at(at(10.0)), 0.55, 1e-9);  // an earlier reading never goes back
}

// A clock that jumps: the process "stopped" for as long as g_paused says.
std::atomic<std::int64_t> g_paused_ns{0};
WatchedTime::Clock::time_point paused_clock() {
  return WatchedTime::Clock::now() + std::chrono::nanoseconds(g_paused_ns.load());
}

// A run stopped (^Z, a debugger, a paused VM, a starved machine) for far longer than the timeout
// is paused, not hung: resuming does not end it. A rendezvous that then stays open for the
// timeout of running time still does. The timeout leaves a loaded test host 3 s of slack.
TEST(HangWatchdog, APauseLongerThanTheTimeoutIsNotAHang) {
  HangWatchdog w;
  w.start(4, &paused_clock);
  w.open(4, "all_to_all #4");
  std::this_thread::sleep_for(50ms);
  g_paused_ns += std::chrono::nanoseconds(30s).count();
  std::this_thread::sleep_for(300ms);
  EXPECT_FALSE(w.wants_report());
  const auto give_up = std::chrono::steady_clock::now() + 20s;
  while (!w.wants_report() && std::chrono::steady_clock::now() < give_up)
    std::this_thread::sleep_for(1ms);
  EXPECT_TRUE(w.wants_report());
  w.close(4);  // before the grace period ends the process
}

TEST(HangWatchdog, OffByDefaultAndWhenStartedWithZero) {
  HangWatchdog w;
  EXPECT_FALSE(w.on());
  w.start(0);
  EXPECT_FALSE(w.on());
  w.open(1, "never joined");  // free when off: nothing watches
  std::this_thread::sleep_for(20ms);
}

}  // namespace
}  // namespace nodeemu::detail
