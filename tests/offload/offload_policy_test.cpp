// The post-warm-up policy (Megatron-Core's post_warmup_callback, REFERENCE §3), per chunk handler:
// the last group of each name stays in the first handler to run backward, later pipeline ranks
// keep more from the front, and the fraction switches trailing groups off, by count.
#include <gtest/gtest.h>

#include "devices/errors.hpp"
#include "offload/offload_policy.hpp"

namespace nodeemu::offload {
namespace {

// Micro-batches `mbs` through one chunk of three layers of attn_norm (100 bytes) and expert_fc1
// (1000 bytes), forward in micro-batch order; backward in `backward` order of the handlers.
WarmupRecord three_layers(int mbs, std::vector<std::size_t> backward) {
  WarmupRecord w;
  for (int m = 0; m < mbs; ++m) {
    HandlerRecord h{m, 0, {}};
    for (int l = 0; l < 3; ++l) {
      h.groups.push_back({{m, l, "attn_norm"}, 100});
      h.groups.push_back({{m, l, "expert_fc1"}, 1000});
    }
    w.handlers.push_back(h);
  }
  w.backward_order = std::move(backward);
  return w;
}

std::vector<bool> decisions(const OffloadPlan& p, const HandlerRecord& h) {
  std::vector<bool> out;
  for (const auto& g : h.groups) out.push_back(p.offloads(g.key));
  return out;
}

// post_warmup_callback: the last group of each name stays only in the first handler to run
// backward; the other micro-batches keep theirs offloaded.
TEST(OffloadPolicy, LastGroupOfEachNameStaysOnlyInTheFirstHandlerToRunBackward) {
  const WarmupRecord w = three_layers(2, {1, 0});
  const OffloadPlan p = plan_after_warmup(w, {});
  EXPECT_EQ(decisions(p, w.handlers[1]), (std::vector<bool>{true, true, true, true, false, false}));
  EXPECT_EQ(decisions(p, w.handlers[0]), std::vector<bool>(6, true));
  EXPECT_EQ(p.bytes_offloaded(w), 2200u + 3300u);
}

// The fraction is per handler, and the count switched off is int(eligible x (1 - fraction)),
// from the back.
TEST(OffloadPolicy, FractionSwitchesTrailingGroupsOffPerHandlerRoundingTheOffCountDown) {
  const WarmupRecord w = three_layers(2, {1, 0});
  OffloadConfig c;
  c.fraction = 0.5;  // handler 1: 4 eligible, 2 off; handler 0: 6 eligible, 3 off
  const OffloadPlan p = plan_after_warmup(w, c);
  EXPECT_EQ(decisions(p, w.handlers[1]),
            (std::vector<bool>{true, true, false, false, false, false}));
  EXPECT_EQ(decisions(p, w.handlers[0]),
            (std::vector<bool>{true, true, true, false, false, false}));
  c.fraction = 0.7;  // handler 1: int(4 x 0.3) = 1 off; handler 0: int(6 x 0.3) = 1 off
  EXPECT_EQ(decisions(plan_after_warmup(w, c), w.handlers[1]),
            (std::vector<bool>{true, true, true, false, false, false}));
  c.fraction = 0;
  EXPECT_EQ(plan_after_warmup(w, c).bytes_offloaded(w), 0u);
}

// The pipeline rank's extra bytes are one budget, spent in backward order across handlers.
TEST(OffloadPolicy, LaterPipelineRanksKeepDeltaBytesOnceInBackwardOrder) {
  const WarmupRecord w = three_layers(2, {1, 0});
  OffloadConfig c;
  c.delta_bytes_across_pp_ranks = 600;
  c.pp_rank = 0;  // keeps nothing extra
  EXPECT_EQ(plan_after_warmup(w, c).bytes_offloaded(w), 5500u);
  c.pp_rank = 2;  // 1200 bytes, from handler 1 (first in backward): its first three groups
  const OffloadPlan p = plan_after_warmup(w, c);
  EXPECT_EQ(decisions(p, w.handlers[1]),
            (std::vector<bool>{false, false, false, true, false, false}));
  EXPECT_EQ(decisions(p, w.handlers[0]), std::vector<bool>(6, true));
}

TEST(OffloadPolicy, ConfigIsCheckedWithTheKeyNamed) {
  OffloadConfig c;
  c.modules = {"expert_fc2"};
  try {
    c.validate();
    FAIL();
  } catch (const ConfigError& e) {
    EXPECT_EQ(e.key(), "offload_modules");
    EXPECT_NE(std::string(e.what()).find("unknown name 'expert_fc2'"), std::string::npos);
  }
  c.modules = {"moe_act"};
  c.fraction = 1.5;
  EXPECT_THROW(c.validate(), ConfigError);
}

}  // namespace
}  // namespace nodeemu::offload
