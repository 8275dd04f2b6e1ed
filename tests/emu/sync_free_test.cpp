// HybridEP's sync-free mode from the recipe (moe_expert_rank_capacity_factor), with Megatron's
// PagedStashRunner around each step, in meta mode (the check works from the routing the host
// knows): a budget that holds never reruns; a budget that drops pairs makes every step run
// again dropless, so it costs both passes. Functional mode is refused for now (validate_test
// holds the rule); the drop rule itself is tested on the device in tests/layers/token_permute_test.cpp.
#include <gtest/gtest.h>

#include "emu/training.hpp"
#include "tests/emu/emu_test_support.hpp"

namespace nodeemu::emu {
namespace {

constexpr int kIterations = 2;

// tiny_moe on EP4: 64 tokens x top-2 per rank, two local experts each padded to 256 rows, so a
// budget holds from 512 rows (factor 2.5: 320, rounded up) and drops at 256 (factor 1).
RunReport run(const char* factor) {
  std::vector<std::string> o = {"model.moe_token_dispatcher_type=flex",
                                "model.moe_flex_dispatcher_backend=hybridep", "emulator.mode=meta",
                                "model.moe_router_force_load_balancing=true"};
  if (factor) o.push_back(std::string("model.moe_expert_rank_capacity_factor=") + factor);
  return train(testing::tiny(o), {.iterations = kIterations});
}

TEST(SyncFree, ABudgetThatHoldsNeverRerunsAndABudgetThatDropsRerunsEveryStep) {
  const RunReport dropless = run(nullptr);
  const RunReport holds = run("2.5");
  const RunReport drops = run("1");
  EXPECT_EQ(dropless.over_budget_reruns, -1);
  EXPECT_EQ(holds.over_budget_reruns, 0);
  EXPECT_EQ(drops.over_budget_reruns, kIterations);
  EXPECT_NE(holds.timeline_hash, dropless.timeline_hash);
  // The dropped pass, the check and the dropless pass.
  EXPECT_GT(drops.step_time_s, 1.5 * dropless.step_time_s);
  EXPECT_LT(holds.step_time_s, 1.5 * dropless.step_time_s);
}

}  // namespace
}  // namespace nodeemu::emu
