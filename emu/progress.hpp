// What a user sees while a run is under way, on stderr: one line per iteration; inside an
// iteration, when stderr is a terminal, a line rewritten in place (micro-batches done, wall time,
// time left); and, for a run that will take more than a minute, one line saying so as soon as the
// first micro-batches give an estimate. Wall-clock time is only shown here: it never reaches
// the timeline.
#pragma once

#include <functional>
#include <iosfwd>
#include <string>

namespace nodeemu::emu {

class Progress {
 public:
  // `os`: where to write (nullptr: nothing); `terminal`: rewrite a line in place inside each
  // iteration; `steps_per_iteration`: micro-batch steps (micro-batches x model chunks) of rank 0.
  // `clock`: seconds of wall time (tests give their own; empty: the steady clock).
  Progress(std::ostream* os, bool terminal, int iterations, int steps_per_iteration,
           std::function<double()> clock = {});

  // Rank 0 finished (released) one micro-batch step of iteration `iteration` (0-based).
  void step_done(int iteration);
  // The iteration's own line ("iter 2/4: virtual ... ms"), after the in-place line is cleared.
  void iteration_done(const std::string& line);

 private:
  double elapsed_s() const { return clock_() - start_; }

  std::ostream* os_;
  bool terminal_;
  int iterations_, steps_per_iteration_;
  long done_ = 0;  // steps over all iterations
  std::function<double()> clock_;
  double start_ = 0, last_draw_ = -1e300;
  bool line_shown_ = false, estimate_said_ = false;
};

}  // namespace nodeemu::emu
