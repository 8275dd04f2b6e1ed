// The hang watchdog: the one part of the engine that looks at wall-clock time. A multi-party
// operation that some party never issues, while the others keep the process busy (a host
// spinning on a query), cannot be found by the engine's deadlock detector: virtual time keeps
// moving. The watchdog sees it as a rendezvous left open for longer than the timeout, prints one
// report naming it and what every blocked host waits on, and ends the process with status 3, as
// NCCL's watchdog tears a job down. It never decides anything about the timeline.
//
// Thread safety: the engine (the actor holding the baton) writes through the methods below; the
// watchdog's own thread reads under the same mutex.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace nodeemu::detail {

class HangWatchdog {
 public:
  HangWatchdog() = default;
  HangWatchdog(const HangWatchdog&) = delete;
  HangWatchdog& operator=(const HangWatchdog&) = delete;
  ~HangWatchdog();

  // Starts watching; 0 leaves it off (every call below is then free). Call once, before the
  // first open().
  void start(double timeout_s);
  bool on() const { return timeout_s_ > 0; }
  // Stops watching for good (the node is being torn down: what is still open is abandoned, not
  // hung). Also done by the destructor.
  void stop();

  // A rendezvous `id` was opened, or some of its parties have joined: `label` says who is missing.
  void open(std::uint32_t id, std::string label);
  void update(std::uint32_t id, std::string label);
  // Every party has joined.
  void close(std::uint32_t id);
  // What host `actor` is blocked on (for the report); an empty text clears it.
  void set_wait(int actor, std::string what);

 private:
  void watch();

  struct Open {
    std::uint32_t id;
    std::string label;
    std::chrono::steady_clock::time_point since;
  };
  double timeout_s_ = 0;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<Open> open_;          // rendezvous not yet joined by all parties
  std::vector<std::string> waits_;  // per actor, while blocked
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace nodeemu::detail
