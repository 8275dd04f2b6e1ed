// What a user sees on stderr while a run is under way (emu/progress.hpp), on a fake clock.
#include "emu/progress.hpp"

#include <gtest/gtest.h>

#include <sstream>

namespace nodeemu::emu {
namespace {

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
  EXPECT_EQ(os.str(), "\r\033[Kiter 1/2: 25 % of its micro-batch steps, 0.5 s, about 3.5 s left");
  os.str("");
  p.iteration_done("iter 1/2: virtual 1.000 ms");
  EXPECT_EQ(os.str(), "\r\033[Kiter 1/2: virtual 1.000 ms\n");
}

// A run projected past a minute says so once, as soon as two seconds give an estimate, whether
// or not stderr is a terminal.
TEST(Progress, ALongRunSaysHowLongUpFront) {
  std::ostringstream os;
  double now = 0;
  Progress p(&os, false, 10, 4, [&] { return now; });
  for (int s = 0; s < 3; ++s) now += 3, p.part_done(0);
  EXPECT_EQ(os.str(),
            "nodeemu: this run will take about 2 min of wall time (2.5 % of every rank's "
            "micro-batch steps in 3.0 s)\n");
}

// Not a terminal, a long run: a progress line a minute, as new lines (a log has no "in place").
TEST(Progress, ALogOfALongRunGetsALineAMinute) {
  std::ostringstream os;
  double now = 0;
  Progress p(&os, false, 1, 100, [&] { return now; });
  for (int s = 0; s < 100; ++s) now += 3, p.part_done(0);
  EXPECT_EQ(os.str(),
            "nodeemu: this run will take about 5 min of wall time (1.0 % of every rank's "
            "micro-batch steps in 3.0 s)\n"
            "iter 1/1: 21 % of its micro-batch steps, 63 s, about 4 min left\n"
            "iter 1/1: 41 % of its micro-batch steps, 2 min, about 3 min left\n"
            "iter 1/1: 61 % of its micro-batch steps, 3 min, about 117 s left\n"
            "iter 1/1: 81 % of its micro-batch steps, 4 min, about 57 s left\n");
}

}  // namespace
}  // namespace nodeemu::emu
