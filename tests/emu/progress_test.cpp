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
    for (int s = 0; s < 4; ++s) now += 0.1, p.step_done(it);
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
  p.step_done(0);
  EXPECT_EQ(os.str(), "\r\033[Kiter 1/2: micro-batch step 1/4, 0.5 s, about 3.5 s left");
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
  for (int s = 0; s < 3; ++s) now += 3, p.step_done(0);
  EXPECT_EQ(os.str(),
            "nodeemu: this run will take about 2 min of wall time (1 of 40 micro-batch steps "
            "in 3.0 s)\n");
}

}  // namespace
}  // namespace nodeemu::emu
