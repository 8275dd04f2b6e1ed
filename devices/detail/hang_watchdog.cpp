#include "devices/detail/hang_watchdog.hpp"

#include <algorithm>
#include <cstdio>
#include <cstdlib>

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

void HangWatchdog::start(double timeout_s) {
  NE_CHECK(!thread_.joinable(), "the hang watchdog is started once");
  timeout_s_ = timeout_s;
  if (timeout_s > 0) thread_ = std::thread([this] { watch(); });
}

void HangWatchdog::open(std::uint32_t id, std::string label) {
  if (!on()) return;
  std::lock_guard lk(mu_);
  open_.push_back({id, std::move(label), std::chrono::steady_clock::now()});
}

void HangWatchdog::update(std::uint32_t id, std::string label) {
  if (!on()) return;
  std::lock_guard lk(mu_);
  auto it = std::find_if(open_.begin(), open_.end(), [&](const Open& o) { return o.id == id; });
  if (it != open_.end()) it->label = std::move(label);
}

void HangWatchdog::close(std::uint32_t id) {
  if (!on()) return;
  std::lock_guard lk(mu_);
  std::erase_if(open_, [&](const Open& o) { return o.id == id; });
}

void HangWatchdog::set_wait(int actor, std::string what) {
  if (!on()) return;
  std::lock_guard lk(mu_);
  if (waits_.size() <= static_cast<std::size_t>(actor))
    waits_.resize(static_cast<std::size_t>(actor) + 1);
  waits_[static_cast<std::size_t>(actor)] = std::move(what);
}

void HangWatchdog::watch() {
  const auto limit = std::chrono::duration<double>(timeout_s_);
  const auto period = std::chrono::duration<double>(std::min(0.1, timeout_s_ / 4));
  std::unique_lock lk(mu_);
  while (!cv_.wait_for(lk, period, [&] { return stop_; })) {
    const auto now = std::chrono::steady_clock::now();
    for (const Open& o : open_) {
      if (now - o.since < limit) continue;
      std::string waits;
      for (const std::string& w : waits_)
        if (!w.empty()) waits += "; " + w;
      std::fprintf(stderr,
                   "nodeemu: hang: %s, for more than %.3g s of wall-clock time%s. A rank skipped "
                   "or reordered a collective: make every rank of the group issue the same "
                   "collectives in the same order.\n",
                   o.label.c_str(), timeout_s_, waits.c_str());
      std::fflush(stderr);
      // As NCCL's watchdog does: a collective that will never complete ends the job.
      std::_Exit(3);
    }
  }
}

}  // namespace nodeemu::detail
