#include "devices/detail/hang_watchdog.hpp"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <optional>

#include "devices/check.hpp"

namespace nodeemu::detail {

HangWatchdog::~HangWatchdog() {
  stop();
}

void HangWatchdog::stop() {
  {
    std::lock_guard lk(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

namespace {

// The watch's tick, and the most a tick may count: a late tick's first quarter second is load,
// beyond that the thread was not running. Ticks come every 0.1 s at most (a quarter of a
// shorter timeout).
std::chrono::duration<double> tick_period(double timeout_s) {
  return std::chrono::duration<double>(std::min(0.1, timeout_s / 4));
}

std::chrono::duration<double> max_step(double timeout_s) {
  return tick_period(timeout_s) + std::chrono::duration<double>(0.25);
}

}  // namespace

void HangWatchdog::start(double timeout_s, Now now) {
  NE_CHECK(!thread_.joinable(), "the hang watchdog is started once");
  timeout_s_ = timeout_s;
  now_ = now;
  if (timeout_s <= 0) return;
  watched_.emplace(now_(), max_step(timeout_s));
  thread_ = std::thread([this] { watch(); });
}

void HangWatchdog::open(std::uint32_t id, std::string label) {
  if (!on()) return;
  std::lock_guard lk(mu_);
  open_.push_back({id, std::move(label), watched_->at(now_())});
}

void HangWatchdog::close(std::uint32_t id) {
  if (!on()) return;
  std::lock_guard lk(mu_);
  std::erase_if(open_, [&](const Open& o) { return o.id == id; });
}

void HangWatchdog::supply(std::map<std::uint32_t, std::string> rendezvous,
                          std::vector<std::string> waits) {
  {
    std::lock_guard lk(mu_);
    described_ = std::move(rendezvous);
    waits_ = std::move(waits);
    supplied_ = true;
    wants_report_.store(false, std::memory_order_relaxed);
  }
  cv_.notify_all();
}

void HangWatchdog::watch() {
  const double limit = timeout_s_;
  const auto period = tick_period(timeout_s_);
  // How long a report waits for the engine's texts: a host that keeps calling in answers within
  // one of its calls; one stuck outside NodeEmu never will. Five timeouts, 0.1-5 s: with one
  // timeout (at most 1 s) a loaded test host missed it about once in a few dozen runs of
  // OrderCheckerDeathTest.AWatchdogEndsAHangWhileAnotherHostKeepsRunning, and a report that
  // ends a hung job can wait a few seconds more for its details.
  const double grace = std::clamp(5 * timeout_s_, 0.1, 5.0);
  std::unique_lock lk(mu_);
  std::optional<Open> overdue;
  double asked = 0;
  for (;;) {
    cv_.wait_for(lk, period, [&] { return stop_ || supplied_; });
    if (stop_) return;
    const double now = watched_->tick(now_());
    if (overdue && std::none_of(open_.begin(), open_.end(),
                                [&](const Open& o) { return o.id == overdue->id; })) {
      overdue.reset();  // it completed after all: slow, not hung
      supplied_ = false;
      wants_report_.store(false, std::memory_order_relaxed);
    }
    if (!overdue) {
      for (const Open& o : open_)
        if (now - o.since >= limit) {
          overdue = o;
          break;
        }
      if (!overdue) continue;
      asked = now;
      wants_report_.store(true, std::memory_order_relaxed);
    }
    if (!supplied_ && now - asked < grace) continue;
    std::string label = overdue->label, waits;
    if (auto it = described_.find(overdue->id); it != described_.end()) label = it->second;
    for (const std::string& w : waits_)
      if (!w.empty()) waits += "; " + w;
    std::fprintf(stderr,
                 "nodeemu: hang: %s, for more than %.3g s of wall-clock time%s. A rank skipped "
                 "or reordered a collective: make every rank of the group issue the same "
                 "collectives in the same order.\n",
                 label.c_str(), timeout_s_, waits.c_str());
    std::fflush(stderr);
    // As NCCL's watchdog does: a collective that will never complete ends the job.
    std::_Exit(3);
  }
}

}  // namespace nodeemu::detail
