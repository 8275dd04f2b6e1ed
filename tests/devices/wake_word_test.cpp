// The word idle threads sleep on: a waiter returns once the word changes and sees what the
// changer wrote before it, a change with nobody asleep issues no wake, and many rounds of
// hand-offs between threads never lose a wake-up (a lost one would hang this test).
#include "devices/wake_word.hpp"

#include <gtest/gtest.h>

#include <chrono>
#include <thread>
#include <vector>

namespace nodeemu {
namespace {

TEST(WakeWord, ReturnsAtOnceWhenTheWordAlreadyDiffers) {
  WakeWord w;
  w.bump();
  w.wait_while(0);
  EXPECT_EQ(w.load(), 1u);
}

TEST(WakeWord, AChangeWithNobodyAsleepIssuesNoWake) {
  WakeWord w;
  for (int i = 0; i < 100; ++i) w.bump();
  w.store(7, /*all=*/false);
  EXPECT_EQ(w.load(), 7u);
  EXPECT_EQ(w.wakes_issued(), 0u);
}

TEST(WakeWord, ASleeperIsWokenAndSeesWhatWasWrittenBeforeTheChange) {
  WakeWord w;
  int payload = 0;  // plain memory: ordered by the word alone
  std::thread waiter([&] {
    w.wait_while(0);
    EXPECT_EQ(payload, 42);
  });
  // Long enough for the waiter to stop spinning (50 us) and go to sleep.
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  payload = 42;
  w.store(1);
  waiter.join();
  EXPECT_EQ(w.wakes_issued(), 1u);
}

TEST(WakeWord, PingPongNeverLosesAWake) {
  // Two threads take turns through two words, 20,000 rounds: each waits for the other's bump.
  // Rounds alternate between sleeping and spinning waits as the scheduler decides.
  WakeWord ping, pong;
  constexpr std::uint32_t kRounds = 20000;
  std::thread other([&] {
    for (std::uint32_t i = 0; i < kRounds; ++i) {
      ping.wait_while(i);
      pong.bump(/*all=*/false);
    }
  });
  for (std::uint32_t i = 0; i < kRounds; ++i) {
    ping.bump(/*all=*/false);
    pong.wait_while(i);
  }
  other.join();
  EXPECT_EQ(ping.load(), kRounds);
  EXPECT_EQ(pong.load(), kRounds);
}

TEST(WakeWord, EverySleeperWakesOnABumpOfAll) {
  WakeWord w;
  std::vector<std::thread> waiters;
  for (int i = 0; i < 4; ++i) waiters.emplace_back([&] { w.wait_while(0); });
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  w.bump();
  for (auto& t : waiters) t.join();
  EXPECT_EQ(w.load(), 1u);
}

}  // namespace
}  // namespace nodeemu
