// Megatron's train_step after the optimizer step (emu/step_reductions.hpp): every rank reads back
// two reductions over its model-parallel group, three `.item()`s a step that the host waits for,
// and the last pipeline stage all-reduces the loss and token count over DP x CP.
#include <gtest/gtest.h>

#include "tests/emu/emu_test_support.hpp"

namespace nodeemu::emu {
namespace {

TEST(StepReductions, EveryRankWaitsThreeTimesAStepAndTheLastStageReducesTheLoss) {
  // Four GPUs as two pipeline stages of DP 2: Megatron's rank order puts PP outermost, so ranks
  // 2 and 3 hold the last stage.
  const std::vector<std::string> overrides = {"model.pipeline_model_parallel_size=2",
                                              "model.expert_model_parallel_size=2"};
  constexpr int kIterations = 2;
  auto seen = testing::copies_and_collectives("step_reductions", overrides, kIterations);
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
