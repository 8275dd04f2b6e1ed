// `nodeemu compare`'s cases trained several at once (emu/detail/case_runs.hpp): the same reports
// as one after another, progress lines that stay whole, and failures reported in the cases'
// order.
#include "emu/detail/case_runs.hpp"

#include <gtest/gtest.h>

#include <chrono>
#include <sstream>
#include <stdexcept>
#include <thread>

#include "devices/errors.hpp"
#include "emu/recipe_views.hpp"
#include "emu/schedule.hpp"
#include "tests/emu/emu_test_support.hpp"

namespace nodeemu::emu::detail {
namespace {

std::vector<NamedRecipe> meta_cases() {
  const std::vector<std::string> meta = {"emulator.mode=meta",
                                         "model.moe_router_force_load_balancing=true"};
  auto with = [&](std::vector<std::string> more) {
    more.insert(more.begin(), meta.begin(), meta.end());
    return testing::tiny(more);
  };
  return {{"base", with({})},
          {"overlap", with({"comm_overlap.overlap_moe_expert_parallel_comm=true",
                            "comm_overlap.delay_wgrad_compute=true"})},
          {"deeper", with({"model.num_layers=6", "train.global_batch_size=32"})}};
}

TEST(CaseRuns, SeveralAtOnceGiveTheSameReportsAsOneAfterAnother) {
  const auto cases = meta_cases();
  TrainOptions o;
  o.iterations = 2;
  std::ostringstream alone_progress, together_progress;
  o.progress = &alone_progress;
  const std::vector<RunReport> alone = train_cases(cases, o, 1);
  o.progress = &together_progress;
  const std::vector<RunReport> together = train_cases(cases, o, 3);
  ASSERT_EQ(alone.size(), cases.size());
  ASSERT_EQ(together.size(), cases.size());
  for (std::size_t c = 0; c < cases.size(); ++c) {
    SCOPED_TRACE(cases[c].name);
    EXPECT_EQ(alone[c].timeline_hash, together[c].timeline_hash);
    EXPECT_EQ(alone[c].step_time_s, together[c].step_time_s);
    EXPECT_EQ(alone[c].exposed_comm_s, together[c].exposed_comm_s);
    ASSERT_EQ(alone[c].iterations.size(), together[c].iterations.size());
    for (std::size_t i = 0; i < alone[c].iterations.size(); ++i)
      EXPECT_EQ(alone[c].iterations[i].step_time_s, together[c].iterations[i].step_time_s);
    ASSERT_EQ(alone[c].devices.size(), together[c].devices.size());
    for (std::size_t d = 0; d < alone[c].devices.size(); ++d)
      EXPECT_EQ(alone[c].devices[d].peak_mem_bytes, together[c].devices[d].peak_mem_bytes);
  }
  // The cases differ, so the comparison above compared something.
  EXPECT_NE(alone[0].timeline_hash, alone[1].timeline_hash);
  EXPECT_NE(alone[0].timeline_hash, alone[2].timeline_hash);

  // One after another: a "case NAME:" line, then the case's own lines.
  EXPECT_EQ(alone_progress.str().rfind("case base:\n", 0), 0u) << alone_progress.str();
  // Several at once: every line whole, and named by its case.
  std::istringstream lines(together_progress.str());
  int per_case[3] = {0, 0, 0};
  for (std::string line; std::getline(lines, line);) {
    bool named = false;
    for (std::size_t c = 0; c < cases.size(); ++c)
      if (line.rfind("case " + cases[c].name + ": iter ", 0) == 0) {
        named = true;
        ++per_case[c];
      }
    EXPECT_TRUE(named) << "a progress line without its case, or cut: '" << line << "'";
  }
  for (int c = 0; c < 3; ++c) EXPECT_EQ(per_case[c], 2) << cases[std::size_t(c)].name;
}

// Functional cases run one at a time unless asked; asked, their numbers are still their own
// (the numerics hash covers every rank's losses and gradients).
TEST(CaseRuns, FunctionalCasesAtOnceKeepTheirNumerics) {
  const std::vector<NamedRecipe> cases = {
      {"base", testing::tiny()},
      {"overlap", testing::tiny({"comm_overlap.overlap_moe_expert_parallel_comm=true",
                                 "comm_overlap.delay_wgrad_compute=true"})}};
  TrainOptions o;
  o.iterations = 1;
  const std::vector<RunReport> alone = train_cases(cases, o, 1);
  const std::vector<RunReport> together = train_cases(cases, o, 2);
  for (std::size_t c = 0; c < cases.size(); ++c) {
    ASSERT_TRUE(alone[c].numerics_hash && together[c].numerics_hash) << cases[c].name;
    EXPECT_EQ(*alone[c].numerics_hash, *together[c].numerics_hash) << cases[c].name;
    EXPECT_EQ(alone[c].timeline_hash, together[c].timeline_hash) << cases[c].name;
  }
}

TEST(CaseRuns, TheFirstFailingCaseInOrderIsWhatFails) {
  auto cases = meta_cases();
  TrainOptions o;
  o.iterations = 1;
  // The last two cases fail, the second one more slowly than the third.
  o.schedule = [&](const Recipe& r) -> std::unique_ptr<Schedule> {
    if (r.int32("model.num_layers") == 6) throw UsageError("the deeper case fails");
    if (r.flag("comm_overlap.overlap_moe_expert_parallel_comm")) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      throw UsageError("the overlap case fails");
    }
    return make_schedule(schedule_choice(r));
  };
  for (int jobs : {1, 3}) {
    try {
      train_cases(cases, o, jobs);
      ADD_FAILURE() << "no failure with " << jobs << " jobs";
    } catch (const UsageError& e) {
      EXPECT_STREQ(e.what(), "the overlap case fails") << jobs << " jobs";
    }
  }
}

TEST(CaseRuns, MetaCasesRunOnePerCoreAndFunctionalOnesOneAtATime) {
  auto cases = meta_cases();
  const int cores = std::max(1, int(std::thread::hardware_concurrency()));
  EXPECT_EQ(default_case_jobs(cases), std::min(cores, 3));
  cases.push_back({"functional", testing::tiny()});
  EXPECT_EQ(default_case_jobs(cases), 1);
}

}  // namespace
}  // namespace nodeemu::emu::detail
