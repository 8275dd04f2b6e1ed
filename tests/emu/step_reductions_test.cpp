// Megatron's train_step after the optimizer step (emu/step_reductions.hpp): every rank reads back
// two reductions over its model-parallel group, three `.item()`s a step that the host waits for,
// and the last pipeline stage all-reduces the loss and token count over DP x CP.
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <map>

#include <nlohmann/json.hpp>

#include "emu/training.hpp"
#include "tests/emu/emu_test_support.hpp"

namespace nodeemu::emu {
namespace {

TEST(StepReductions, EveryRankWaitsThreeTimesAStepAndTheLastStageReducesTheLoss) {
  // Four GPUs as two pipeline stages of DP 2: Megatron's rank order puts PP outermost, so ranks
  // 2 and 3 hold the last stage.
  const std::vector<std::string> overrides = {"model.pipeline_model_parallel_size=2",
                                              "model.expert_model_parallel_size=2"};
  const std::string trace = testing::trace_path("step_reductions", overrides);
  constexpr int kIterations = 2;
  const RunReport r =
      train(testing::tiny(overrides), {.iterations = kIterations, .trace_path = trace});
  ASSERT_EQ(r.iterations.size(), std::size_t(kIterations));
  std::ifstream in(trace);
  const auto events = nlohmann::json::parse(in)["traceEvents"];
  std::remove(trace.c_str());
  std::map<int, std::map<std::string, int>> seen;  // device -> name -> device-side operations
  for (const auto& e : events) {
    const std::string cat = e.value("cat", "");
    if (cat == "copy" || cat == "comm") ++seen[e.value("pid", -1)][e.value("name", "")];
  }
  for (int device = 0; device < 4; ++device) {
    SCOPED_TRACE("device " + std::to_string(device));
    auto& ops = seen[device];
    EXPECT_EQ(ops["update_successful_allreduce"], kIterations);
    EXPECT_EQ(ops["update_successful .item()"], kIterations);
    EXPECT_EQ(ops["grad_norm_allreduce"], kIterations);
    EXPECT_EQ(ops["grad_norm .item()"], 2 * kIterations);
    EXPECT_EQ(ops["loss_allreduce"], device >= 2 ? kIterations : 0);
  }
}

}  // namespace
}  // namespace nodeemu::emu
