// The progress estimate on a real run: a scaled-down DeepSeek-V3 step, its clock the process's
// CPU time (other processes' load does not stretch it), says its end within 30 % from its first
// estimate on.
#include <gtest/gtest.h>

#include <ctime>
#include <regex>
#include <sstream>
#include <string>

#include "emu/training.hpp"
#include "tests/emu/emu_test_support.hpp"

namespace nodeemu::emu {
namespace {

using testing::recipe_path;

double cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
}

// "4 min", "105 s", "1.5 h" in seconds.
double seconds_of(double value, const std::string& unit) {
  return unit == "h" ? value * 3600 : unit == "min" ? value * 60 : value;
}

TEST(ProgressRun, AScaledDownDeepSeekV3SaysItsEndWithin30Percent) {
  // DeepSeek-V3's recipe on 64 GPUs: TP2 with SP, PP4, EP16, 13 layers (three dense), 64
  // micro-batches per pipeline: the pipeline fills and drains and the prices and routing draws
  // are new at first, as in the full step (1,024 GPUs, PP16, 128 micro-batches). The clock runs
  // 150x the process's CPU time, so that this ~5 s run reads as a ~12-minute one and prints its
  // estimate and a line a "minute". With 32 micro-batches the fill was a larger share of a
  // shorter run: its first estimate read +35 % under CI's load.
  const Recipe r = Recipe::load(
      recipe_path("deepseek_v3"),
      {"nodes=8", "model.pipeline_model_parallel_size=4", "model.expert_model_parallel_size=16",
       "model.num_layers=13", "model.moe_layer_freq=[0,0,0,1,1,1,1,1,1,1,1,1,1]",
       "train.global_batch_size=512"});
  constexpr double kClockScale = 150;
  std::ostringstream os;
  TrainOptions o;
  o.iterations = 1;
  o.progress = &os;
  const double t0 = cpu_seconds();
  o.progress_clock = [t0] { return (cpu_seconds() - t0) * kClockScale; };
  train(r, o);
  const double total = (cpu_seconds() - t0) * kClockScale;
  const std::string log = os.str();
  SCOPED_TRACE(log + "the run took " + std::to_string(total) + " s on its clock");

  const std::regex first(R"(this run will take about ([0-9.]+) (s|min|h) of wall time)");
  std::smatch m;
  ASSERT_TRUE(std::regex_search(log, m, first));
  EXPECT_NEAR(seconds_of(std::stod(m[1]), m[2]) / total, 1.0, 0.3) << "the first estimate";
  // Every line after it: the time so far plus the time left.
  const std::regex line(
      R"(micro-batch steps, ([0-9.]+) (s|min|h), about ([0-9.]+) (s|min|h) left)");
  int lines = 0;
  for (auto it = std::sregex_iterator(log.begin(), log.end(), line); it != std::sregex_iterator();
       ++it, ++lines) {
    const std::smatch& l = *it;
    const double end = seconds_of(std::stod(l[1]), l[2]) + seconds_of(std::stod(l[3]), l[4]);
    EXPECT_NEAR(end / total, 1.0, 0.3) << l[0];
  }
  EXPECT_GE(lines, 5);
}

}  // namespace
}  // namespace nodeemu::emu
