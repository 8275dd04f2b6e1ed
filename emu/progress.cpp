#include "emu/progress.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <iomanip>
#include <ostream>
#include <sstream>

namespace nodeemu::emu {

namespace {

// A run projected past this much wall time says so once, with the estimate.
constexpr double kLongRunS = 60;
// The estimate waits for this much wall time and this share of the parts (the first
// micro-batches include start-up costs).
constexpr double kEstimateAfterS = 2;
constexpr double kEstimateAfterShare = 0.10;
// Samples of the elapsed time kept for the pace (at most about this many).
constexpr long kSamples = 1024;
// In-place redraws at most this often.
constexpr double kRedrawS = 0.2;
// Not a terminal: a progress line at most this often.
constexpr double kLogLineS = 60;

std::string duration(double s) {
  std::ostringstream o;
  o << std::fixed << std::setprecision(s < 10 ? 1 : 0);
  if (s < 120)
    o << s << " s";
  else if (s < 7200)
    o << s / 60 << " min";
  else
    o << s / 3600 << " h";
  return o.str();
}

// "37 %", or "0.4 %" below ten, so that a long run's first estimate does not read "0 %".
std::string percent(long part, long whole) {
  const double p = 100.0 * double(part) / double(whole);
  std::ostringstream o;
  o << std::fixed << std::setprecision(p < 10 ? 1 : 0) << (p < 10 ? p : std::floor(p)) << " %";
  return o.str();
}

}  // namespace

Progress::Progress(std::ostream* os, bool terminal, int iterations, long parts_per_iteration,
                   std::function<double()> clock)
    : os_(os),
      terminal_(terminal),
      iterations_(iterations),
      parts_per_iteration_(parts_per_iteration > 0 ? parts_per_iteration : 1),
      clock_(clock ? std::move(clock) : [] {
        return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
            .count();
      }) {
  start_ = clock_();
  total_ = long(iterations_) * parts_per_iteration_;
  sample_every_ = std::max(1L, total_ / kSamples);
  // A log's first progress line comes a minute in, not at the first step.
  if (!terminal_) last_draw_ = 0;
}

double Progress::left_s(double t) const {
  if (done_ >= total_) return 0;
  // The latest sample at or before a quarter of the parts done: the pace since is that of the
  // later three quarters.
  const long from = std::min(long(samples_.size()) - 1, done_ / 4 / sample_every_);
  const double since = t - samples_[std::size_t(from)];
  const long parts = done_ - from * sample_every_;
  return since / double(parts) * double(total_ - done_);
}

void Progress::part_done(int iteration) {
  if (!os_) return;
  std::lock_guard lock(mu_);
  ++done_;
  const double t = elapsed_s();
  if (done_ % sample_every_ == 0) samples_.push_back(t);
  const double left = left_s(t);
  const bool can_estimate =
      t >= kEstimateAfterS && double(done_) >= kEstimateAfterShare * double(total_);
  if (!estimate_said_ && can_estimate) {
    estimate_said_ = true;
    if (t + left > kLongRunS) {
      if (line_shown_) *os_ << "\r\033[K";
      line_shown_ = false;
      *os_ << "nodeemu: this run will take about " << duration(t + left) << " of wall time ("
           << percent(done_, total_) << " of every rank's micro-batch steps in " << duration(t)
           << ")\n"
           << std::flush;
      last_draw_ = t;
    }
  }
  if (t - last_draw_ < (terminal_ ? kRedrawS : kLogLineS)) return;
  last_draw_ = t;
  // Ranks may be an iteration apart: the share is of every rank's steps done so far.
  const long in_iteration =
      std::clamp(done_ - long(iteration) * parts_per_iteration_, 0L, parts_per_iteration_);
  const std::string line =
      "iter " + std::to_string(iteration + 1) + "/" + std::to_string(iterations_) + ": " +
      percent(in_iteration, parts_per_iteration_) + " of its micro-batch steps, " + duration(t) +
      (can_estimate ? ", about " + duration(left) + " left" : "");
  if (terminal_) {
    *os_ << "\r\033[K" << line << std::flush;
    line_shown_ = true;
  } else {
    *os_ << line << "\n" << std::flush;
  }
}

void Progress::iteration_done(const std::string& line) {
  if (!os_) return;
  std::lock_guard lock(mu_);
  if (line_shown_) *os_ << "\r\033[K";
  line_shown_ = false;
  *os_ << line << "\n" << std::flush;
}

}  // namespace nodeemu::emu
