#include "emu/progress.hpp"

#include <chrono>
#include <iomanip>
#include <ostream>
#include <sstream>

namespace nodeemu::emu {

namespace {

// A run projected past this much wall time says so once, with the estimate.
constexpr double kLongRunS = 60;
// The estimate waits for this much wall time (the first micro-batches include start-up costs).
constexpr double kEstimateAfterS = 2;
// In-place redraws at most this often.
constexpr double kRedrawS = 0.2;

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

}  // namespace

Progress::Progress(std::ostream* os, bool terminal, int iterations, int steps_per_iteration,
                   std::function<double()> clock)
    : os_(os),
      terminal_(terminal),
      iterations_(iterations),
      steps_per_iteration_(steps_per_iteration > 0 ? steps_per_iteration : 1),
      clock_(clock ? std::move(clock) : [] {
        return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
            .count();
      }) {
  start_ = clock_();
}

void Progress::step_done(int iteration) {
  if (!os_) return;
  ++done_;
  const double t = elapsed_s();
  const long total = long(iterations_) * steps_per_iteration_;
  const double left = done_ < total ? t / double(done_) * double(total - done_) : 0;
  if (!estimate_said_ && t >= kEstimateAfterS) {
    estimate_said_ = true;
    if (t + left > kLongRunS) {
      if (line_shown_) *os_ << "\r\033[K";
      line_shown_ = false;
      *os_ << "nodeemu: this run will take about " << duration(t + left) << " of wall time ("
           << done_ << " of " << total << " micro-batch steps in " << duration(t) << ")\n"
           << std::flush;
    }
  }
  if (!terminal_ || t - last_draw_ < kRedrawS) return;
  last_draw_ = t;
  const long in_iteration = done_ - long(iteration) * steps_per_iteration_;
  *os_ << "\r\033[Kiter " << iteration + 1 << "/" << iterations_ << ": micro-batch step "
       << in_iteration << "/" << steps_per_iteration_ << ", " << duration(t) << ", about "
       << duration(left) << " left" << std::flush;
  line_shown_ = true;
}

void Progress::iteration_done(const std::string& line) {
  if (!os_) return;
  if (line_shown_) *os_ << "\r\033[K";
  line_shown_ = false;
  *os_ << line << "\n" << std::flush;
}

}  // namespace nodeemu::emu
