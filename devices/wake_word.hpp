// A 32-bit word that threads sleep on until it changes: a worker pool's epoch, a parallel job's
// progress, a functional task's done flag. A waiter spins for a short bounded time (so that
// back-to-back kernels start in well under 2 us), then sleeps in a futex wait.
//
// Why not std::atomic::wait: libstdc++'s yields the core up to 12 times, a sched_yield system
// call each, before it sleeps, and its notify makes a system call whenever its shared table says
// anybody at all may be waiting. An all-to-all of 2 ranks made ~9 sched_yield and ~6 futex calls
// (bench/README, issue 19), each a trap to the hypervisor in a VM. Here a waiter that stops
// spinning sleeps at once, and a change with nobody asleep on this word costs no system call: the
// word counts its own sleepers.
#pragma once

#include <atomic>
#include <cstdint>

namespace nodeemu {

class WakeWord {
 public:
  WakeWord() = default;
  WakeWord(const WakeWord&) = delete;
  WakeWord& operator=(const WakeWord&) = delete;

  std::uint32_t load() const { return word_.load(std::memory_order_acquire); }
  // Sets the word, then wakes every sleeper (`all`) or one.
  void store(std::uint32_t value, bool all = true);
  // Adds one to the word, then wakes every sleeper (`all`) or one.
  void bump(bool all = true);
  // Returns once the word differs from `seen` (at once if it already does). What was written
  // before the change that ended the wait is visible after it.
  void wait_while(std::uint32_t seen) const;

  // Test hook: the futex wakes this word has issued (a change with no sleeper issues none).
  std::uint64_t wakes_issued() const { return wakes_.load(std::memory_order_relaxed); }

 private:
  void wake(bool all);
  std::atomic<std::uint32_t> word_{0};
  mutable std::atomic<std::uint32_t> sleepers_{0};
  std::atomic<std::uint64_t> wakes_{0};
};

}  // namespace nodeemu
