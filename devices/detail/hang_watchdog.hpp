// The hang watchdog: the one part of the engine that looks at wall-clock time. A multi-party
// operation that some party never issues, while the others keep the process busy (a host
// spinning on a query), cannot be found by the engine's deadlock detector: virtual time keeps
// moving. The watchdog sees it as a rendezvous left open for longer than the timeout, prints one
// report naming it and what every blocked host waits on, and ends the process with status 3, as
// NCCL's watchdog tears a job down. It never decides anything about the timeline.
//
// The report's text is asked for, not kept up to date: describing who joined a rendezvous and
// what a blocked host waits on walks the engine's state, which cost more than the collective
// itself when it was rebuilt at every join and every block (a 64-byte all-to-all of 8 ranks took
// 2.5 ms, three quarters of it describing waits nobody read). So an overdue rendezvous raises
// `wants_report()`; the engine, on its own thread at its next call (a hung run has a host that
// keeps calling in, or the detector would have caught it), describes its state and `supply()`s
// the texts; after a grace period without them the report goes out with the labels given at
// open().
//
// Time counts only while the watchdog's own thread runs on schedule (WatchedTime below): a run
// stopped behind ^Z or in a debugger, in a paused VM or on a machine starved of cores for longer
// than the timeout, is paused, not hung.
//
// Thread safety: the engine (the actor holding the baton) calls the methods below; the
// watchdog's own thread reads under the same mutex.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

namespace nodeemu::detail {

// Wall-clock time that counts only while a ticking thread keeps running on schedule: each tick
// adds the wall time since the one before, but at most `max_step`. A longer gap means the thread
// could not run (the process was stopped, its VM paused, the machine short of cores), and during
// it a hang cannot be told from a pause. Before, a run stopped for 2.5 s with a 1 s timeout was
// reported as hung the moment it resumed (exit 3), though every rank was on its way.
class WatchedTime {
 public:
  using Clock = std::chrono::steady_clock;
  WatchedTime(Clock::time_point start, std::chrono::duration<double> max_step)
      : last_(start), max_step_(max_step.count()) {}
  // The watched seconds at `now`, without ticking (at least the last tick's).
  double at(Clock::time_point now) const { return watched_ + step_to(now); }
  // A tick at `now`: what at(now) says becomes the base for the next.
  double tick(Clock::time_point now) {
    watched_ += step_to(now);
    if (now > last_) last_ = now;
    return watched_;
  }

 private:
  double step_to(Clock::time_point now) const {
    const double gap = std::chrono::duration<double>(now - last_).count();
    return gap <= 0 ? 0 : gap < max_step_ ? gap : max_step_;
  }
  Clock::time_point last_;
  double max_step_;
  double watched_ = 0;
};

class HangWatchdog {
 public:
  HangWatchdog() = default;
  HangWatchdog(const HangWatchdog&) = delete;
  HangWatchdog& operator=(const HangWatchdog&) = delete;
  ~HangWatchdog();

  // Starts watching; 0 leaves it off (every call below is then free). Call once, before the
  // first open(). `now` reads the wall clock (tests give one that jumps).
  using Now = WatchedTime::Clock::time_point (*)();
  void start(double timeout_s, Now now = &WatchedTime::Clock::now);
  bool on() const { return timeout_s_ > 0; }
  // Stops watching for good (the node is being torn down: what is still open is abandoned, not
  // hung). Also done by the destructor.
  void stop();

  // A rendezvous `id` was opened; `label` names it (the report's text when none is supplied).
  void open(std::uint32_t id, std::string label);
  // Every party has joined.
  void close(std::uint32_t id);

  // True once a rendezvous is overdue and the report waits for the engine's texts (one relaxed
  // load: cheap enough for every call into the engine).
  bool wants_report() const { return wants_report_.load(std::memory_order_relaxed); }
  // The engine's texts for the report: the open rendezvous by id (who issued them, who did not)
  // and what each blocked host waits on.
  void supply(std::map<std::uint32_t, std::string> rendezvous, std::vector<std::string> waits);

 private:
  void watch();

  struct Open {
    std::uint32_t id;
    std::string label;
    double since;  // watched seconds
  };
  double timeout_s_ = 0;
  Now now_ = nullptr;
  std::optional<WatchedTime> watched_;  // guarded by mu_ once the thread runs
  std::atomic<bool> wants_report_{false};
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<Open> open_;  // rendezvous not yet joined by all parties
  bool supplied_ = false;
  std::map<std::uint32_t, std::string> described_;
  std::vector<std::string> waits_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace nodeemu::detail
