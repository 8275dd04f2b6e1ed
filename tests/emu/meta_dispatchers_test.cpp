// Every token dispatcher runs in meta mode (issue 17 item 7): the tiny recipe's one-step run
// completes for alltoall, allgather and both flex backends, and the allgather dispatcher's
// collectives are priced like the others (its step differs from alltoall's).
#include <gtest/gtest.h>

#include "emu/training.hpp"
#include "tests/emu/emu_test_support.hpp"

namespace nodeemu::emu {
namespace {

RunReport meta_run(std::vector<std::string> extra) {
  std::vector<std::string> o = {"emulator.mode=meta", "model.moe_router_force_load_balancing=true"};
  o.insert(o.end(), extra.begin(), extra.end());
  return train(testing::tiny(o), {.iterations = 1});
}

TEST(MetaDispatchers, EveryDispatcherRunsAFullStepInMetaMode) {
  const RunReport a2a = meta_run({"model.moe_token_dispatcher_type=alltoall"});
  const RunReport ag = meta_run({"model.moe_token_dispatcher_type=allgather"});
  const RunReport deepep = meta_run({"model.moe_token_dispatcher_type=flex"});
  const RunReport hybridep = meta_run(
      {"model.moe_token_dispatcher_type=flex", "model.moe_flex_dispatcher_backend=hybridep"});
  for (const RunReport* r : {&a2a, &ag, &deepep, &hybridep}) {
    EXPECT_EQ(r->mode, "meta");
    EXPECT_GT(r->step_time_s, 0);
    EXPECT_GT(r->total_comm_s, 0);
  }
  EXPECT_NE(ag.timeline_hash, a2a.timeline_hash);
}

}  // namespace
}  // namespace nodeemu::emu
