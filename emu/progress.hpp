// What a user sees while a run is under way, on stderr: one line per iteration; inside an
// iteration, when stderr is a terminal, a line rewritten in place (the share of micro-batch steps
// done, wall time, time left), and otherwise (a log, CI) such a line once a minute; and, for a
// run that will take more than a minute, one line saying so as soon as the first micro-batch
// steps give an estimate. Wall-clock time is only shown here: it never reaches the timeline.
//
// Progress counts every rank's micro-batch steps, each twice: when its plan is made (its forward
// starts) and when it is released (its backward is done). One rank's releases alone made a
// 90-second DeepSeek-V3 run (PP 16, 8 micro-batches) announce itself at 10 minutes: in a
// pipeline the first stage releases its first step only after the whole warm-up, and in meta
// mode most of the wall time goes into making plans (the routing draws), not into releasing.
//
// The time left is the pace of the later three quarters of the steps done so far, not of all of
// them: a run's first steps are slower (caches of prices and routing draws fill, the pipeline
// fills). It waits for 10 % of the steps (and two seconds): the first estimate of a 25-minute
// DeepSeek-V3 step, at two seconds, said 38 minutes (bench/README, "Progress estimates").
#pragma once

#include <functional>
#include <iosfwd>
#include <mutex>
#include <string>
#include <vector>

namespace nodeemu::emu {

class Progress {
 public:
  // `os`: where to write (nullptr: nothing); `terminal`: rewrite a line in place inside each
  // iteration; `parts_per_iteration`: two per micro-batch step (micro-batches x model chunks)
  // of every rank. `clock`: seconds of wall time (tests give their own; empty: the steady
  // clock).
  Progress(std::ostream* os, bool terminal, int iterations, long parts_per_iteration,
           std::function<double()> clock = {});

  // A rank made or released a micro-batch step's plan in iteration `iteration` (0-based). Any
  // rank's host may call it.
  void part_done(int iteration);
  // The iteration's own line ("iter 2/4: virtual ... ms"), after the in-place line is cleared.
  void iteration_done(const std::string& line);

 private:
  double elapsed_s() const { return clock_() - start_; }
  // Seconds left at `t` with `done_` parts done, from the pace since a quarter of them were done.
  double left_s(double t) const;

  std::mutex mu_;  // hosts of a functional run are threads
  std::ostream* os_;
  bool terminal_;
  int iterations_;
  long parts_per_iteration_;
  long total_ = 0;  // parts over all iterations
  long done_ = 0;
  // The elapsed time when every `sample_every_`-th part was done (from 0 parts at 0 s): at most
  // ~1,000 samples whatever the run's size.
  long sample_every_ = 1;
  std::vector<double> samples_{0.0};
  std::function<double()> clock_;
  double start_ = 0, last_draw_ = -1e300;
  bool line_shown_ = false, estimate_said_ = false;
};

}  // namespace nodeemu::emu
