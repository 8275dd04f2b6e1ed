// What a user sees on stderr while a run is under way (emu/progress.hpp), on a fake clock.
#include "emu/progress.hpp"

#include <gtest/gtest.h>

#include <functional>
#include <sstream>
#include <string>

namespace nodeemu::emu {
namespace {

// What a run of `iterations` iterations of `parts` steps each logs (stderr not a terminal) when
// its first `steps` steps are done, step s taking seconds(s) on its clock.
std::string log_of(int iterations, int parts, int steps,
                   const std::function<double(int)>& seconds) {
  std::ostringstream os;
  double now = 0;
  Progress p(&os, false, iterations, parts, [&] { return now; });
  for (int s = 0; s < steps; ++s) now += seconds(s), p.part_done(0);
  return os.str();
}

// Not a terminal (a log file, CI): one line per iteration and nothing rewritten in place.
TEST(Progress, ALogGetsOneLinePerIteration) {
  std::ostringstream os;
  double now = 0;
  Progress p(&os, false, 2, 4, [&] { return now; });
  for (int it = 0; it < 2; ++it) {
    for (int s = 0; s < 4; ++s) now += 0.1, p.part_done(it);
    p.iteration_done("iter " + std::to_string(it + 1) + "/2");
  }
  EXPECT_EQ(os.str(), "iter 1/2\niter 2/2\n");
}

// On a terminal: the micro-batch steps of the iteration and the time left, rewritten in place,
// cleared before the iteration's own line.
TEST(Progress, ATerminalSeesTheStepsInsideAnIteration) {
  std::ostringstream os;
  double now = 0;
  Progress p(&os, true, 2, 4, [&] { return now; });
  now = 0.5;
  p.part_done(0);
  // Too early for the time left (two seconds and 10 % of the steps give the first estimate).
  EXPECT_EQ(os.str(), "\r\033[Kiter 1/2: 25 % of its micro-batch steps, 0.5 s");
  os.str("");
  now = 2.5;  // the pace since a quarter of the steps (none yet): 1.25 s a step
  p.part_done(0);
  EXPECT_EQ(os.str(), "\r\033[Kiter 1/2: 50 % of its micro-batch steps, 2.5 s, about 7.5 s left");
  os.str("");
  p.iteration_done("iter 1/2: virtual 1.000 ms");
  EXPECT_EQ(os.str(), "\r\033[Kiter 1/2: virtual 1.000 ms\n");
}

// A run projected past a minute says so once, as soon as 10 % of the steps and two seconds give
// an estimate, whether or not stderr is a terminal.
TEST(Progress, ALongRunSaysHowLongUpFront) {
  const auto three_seconds = [](int) { return 3.0; };
  EXPECT_EQ(log_of(10, 4, 3, three_seconds), "") << "7.5 % of the steps: too early to say";
  EXPECT_EQ(log_of(10, 4, 4, three_seconds),
            "nodeemu: this run will take about 2 min of wall time (10 % of every rank's "
            "micro-batch steps in 12 s)\n");
}

// A run's first steps are slower than the rest (caches fill, the pipeline fills): the estimate
// takes the pace of the later three quarters of the steps done, not of all of them. Here the
// first 2 % of 1,000 steps take 1 s each, the rest 0.05 s: 69 s in all. The mean pace at 10 %
// (100 steps, 24 s) would say 240 s; the later three quarters' says 69 s.
TEST(Progress, TheEstimateIsThePaceOfTheLaterThreeQuarters) {
  EXPECT_EQ(log_of(1, 1000, 100, [](int s) { return s < 20 ? 1.0 : 0.05; }),
            "nodeemu: this run will take about 69 s of wall time (10 % of every rank's "
            "micro-batch steps in 24 s)\n");
}

// Not a terminal, a long run: a progress line a minute, as new lines (a log has no "in place").
TEST(Progress, ALogOfALongRunGetsALineAMinute) {
  EXPECT_EQ(log_of(1, 100, 100, [](int) { return 3.0; }),
            "nodeemu: this run will take about 5 min of wall time (10 % of every rank's "
            "micro-batch steps in 30 s)\n"
            "iter 1/1: 30 % of its micro-batch steps, 90 s, about 4 min left\n"
            "iter 1/1: 50 % of its micro-batch steps, 2 min, about 2 min left\n"
            "iter 1/1: 70 % of its micro-batch steps, 4 min, about 90 s left\n"
            "iter 1/1: 90 % of its micro-batch steps, 4 min, about 30 s left\n");
}

}  // namespace
}  // namespace nodeemu::emu
