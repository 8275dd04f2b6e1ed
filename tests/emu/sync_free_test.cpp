// HybridEP's sync-free mode from the recipe (moe_expert_rank_capacity_factor), with Megatron's
// PagedStashRunner around each step. A budget that holds keeps every pair: the numerics stay
// dropless HybridEP's up to the padded grouped GEMMs' rounding, and repeat bit for bit (the
// device-side exchange once read senders' buffers the host had already let go). A budget that
// drops pairs makes every step run again dropless: dropless numerics bit for bit, at the cost of
// both passes. In meta mode the check works from the routing the host knows.
#include <gtest/gtest.h>

#include "emu/training.hpp"
#include "tests/emu/emu_test_support.hpp"

namespace nodeemu::emu {
namespace {

constexpr int kIterations = 2;

// tiny_moe on EP4: 64 tokens x top-2 per rank, two local experts each padded to 256 rows, so a
// budget holds from 512 rows (factor 2.5: 320, rounded up) and drops at 256 (factor 1). Routing
// is forced, so that the padded GEMMs' rounding cannot flip a near-tied expert choice.
RunReport run(const char* factor, bool meta = false) {
  std::vector<std::string> o = {"model.moe_token_dispatcher_type=flex",
                                "model.moe_flex_dispatcher_backend=hybridep",
                                "model.moe_router_force_load_balancing=true"};
  if (meta) o.push_back("emulator.mode=meta");
  if (factor) o.push_back(std::string("model.moe_expert_rank_capacity_factor=") + factor);
  return train(testing::tiny(o), {.iterations = kIterations});
}

TEST(SyncFree, ABudgetThatHoldsKeepsEveryPairRepeatablyAndNeverReruns) {
  const RunReport dropless = run(nullptr);
  const RunReport holds = run("2.5");
  EXPECT_EQ(dropless.over_budget_reruns, -1);
  EXPECT_EQ(holds.over_budget_reruns, 0);
  for (int i = 0; i < kIterations; ++i)
    EXPECT_NEAR(*holds.iterations[i].loss, *dropless.iterations[i].loss,
                1e-5 * *dropless.iterations[i].loss);
  EXPECT_NE(holds.timeline_hash, dropless.timeline_hash);
  for (int repeat = 0; repeat < 2; ++repeat) {
    const RunReport again = run("2.5");
    EXPECT_EQ(again.numerics_hash, holds.numerics_hash);
    EXPECT_EQ(again.timeline_hash, holds.timeline_hash);
  }
}

TEST(SyncFree, AStepOverBudgetRunsAgainDroplessWithTheDroplessBits) {
  const RunReport dropless = run(nullptr);
  const RunReport drops = run("1");
  EXPECT_EQ(drops.over_budget_reruns, kIterations);
  EXPECT_EQ(drops.numerics_hash, dropless.numerics_hash);
  for (int i = 0; i < kIterations; ++i)
    EXPECT_EQ(*drops.iterations[i].loss, *dropless.iterations[i].loss);
  // The dropped pass, the check and the dropless pass.
  EXPECT_GT(drops.step_time_s, 1.5 * dropless.step_time_s);
}

TEST(SyncFree, TheCombinedOverlapIsBitExactWithSequential) {
  const RunReport seq = run("2.5");
  const RunReport overlap =
      train(testing::tiny({"model.moe_token_dispatcher_type=flex",
                           "model.moe_flex_dispatcher_backend=hybridep",
                           "model.moe_router_force_load_balancing=true",
                           "model.moe_expert_rank_capacity_factor=2.5",
                           "comm_overlap.overlap_moe_expert_parallel_comm=true",
                           "comm_overlap.delay_wgrad_compute=true"}),
            {.iterations = kIterations});
  EXPECT_EQ(overlap.schedule, "combined-1f1b-a2a-overlap");
  EXPECT_EQ(overlap.numerics_hash, seq.numerics_hash);
}

TEST(SyncFree, MetaModeChecksTheBudgetFromTheHostKnownRouting) {
  const RunReport dropless = run(nullptr, true);
  const RunReport holds = run("2.5", true);
  const RunReport drops = run("1", true);
  EXPECT_EQ(holds.over_budget_reruns, 0);
  EXPECT_EQ(drops.over_budget_reruns, kIterations);
  EXPECT_LT(holds.step_time_s, 1.5 * dropless.step_time_s);
  EXPECT_GT(drops.step_time_s, 1.5 * dropless.step_time_s);
}

}  // namespace
}  // namespace nodeemu::emu
