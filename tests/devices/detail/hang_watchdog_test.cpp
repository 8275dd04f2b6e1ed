#include "devices/detail/hang_watchdog.hpp"

#include <gtest/gtest.h>

#include <chrono>
#include <thread>

namespace nodeemu::detail {
namespace {

using namespace std::chrono_literals;

// A rendezvous left open past the timeout ends the process with status 3 and one report naming
// it and what the blocked hosts wait on, as NCCL's watchdog tears a job down.
TEST(HangWatchdogDeathTest, AnOpenRendezvousPastTheTimeoutEndsTheProcessWithAReport) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        HangWatchdog w;
        w.start(0.05);
        w.open(3, "all_reduce #3 on group dp: issued by none yet");
        w.update(3, "all_reduce #3 on group dp: issued by rank 0; 1 of 2 never issued it");
        w.set_wait(1, "rank 0 waits on 'all_reduce'");
        std::this_thread::sleep_for(5s);
      },
      testing::ExitedWithCode(3),
      "hang: all_reduce #3 on group dp: issued by rank 0; 1 of 2 never issued it, for more than "
      "0.05 s.*; rank 0 waits on 'all_reduce'");
}

TEST(HangWatchdog, AClosedRendezvousIsNotAHang) {
  HangWatchdog w;
  w.start(0.02);
  EXPECT_TRUE(w.on());
  w.open(1, "broadcast #1");
  w.close(1);
  w.set_wait(0, "main waits");
  w.set_wait(0, {});
  std::this_thread::sleep_for(150ms);
  SUCCEED() << "still running after seven timeouts";
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
