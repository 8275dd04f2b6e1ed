// The post-warm-up policy (REFERENCE §3): the last group of each name stays, later pipeline ranks
// keep more from the front, and the fraction switches trailing groups off, by count.
#include <gtest/gtest.h>

#include "devices/errors.hpp"
#include "offload/offload_policy.hpp"

namespace nodeemu::offload {
namespace {

// Three layers of attn_norm (100 bytes) and expert_fc1 (1000 bytes), in forward order.
std::vector<GroupRecord> three_layers() {
  std::vector<GroupRecord> r;
  for (int l = 0; l < 3; ++l) {
    r.push_back({{l, "attn_norm"}, 100});
    r.push_back({{l, "expert_fc1"}, 1000});
  }
  return r;
}

std::vector<bool> decisions(const OffloadPlan& p, const std::vector<GroupRecord>& r) {
  std::vector<bool> out;
  for (const auto& g : r) out.push_back(p.offloads(g.key));
  return out;
}

TEST(OffloadPolicy, LastGroupOfEachNameStaysOnTheDevice) {
  const auto r = three_layers();
  const OffloadPlan p = plan_after_warmup(r, {});
  EXPECT_EQ(decisions(p, r), (std::vector<bool>{true, true, true, true, false, false}));
  EXPECT_EQ(p.bytes_offloaded_per_pass(r), 2200u);
}

TEST(OffloadPolicy, FractionSwitchesTrailingGroupsOffByCount) {
  const auto r = three_layers();
  OffloadConfig c;
  c.fraction = 0.5;  // 4 eligible groups: the first 2 stay offloaded
  EXPECT_EQ(decisions(plan_after_warmup(r, c), r),
            (std::vector<bool>{true, true, false, false, false, false}));
  c.fraction = 0;
  EXPECT_EQ(plan_after_warmup(r, c).bytes_offloaded_per_pass(r), 0u);
}

TEST(OffloadPolicy, LaterPipelineRanksKeepDeltaBytesPerRankFromTheFront) {
  const auto r = three_layers();
  OffloadConfig c;
  c.delta_bytes_across_pp_ranks = 600;
  c.pp_rank = 0;  // keeps nothing extra
  EXPECT_EQ(plan_after_warmup(r, c).bytes_offloaded_per_pass(r), 2200u);
  c.pp_rank = 2;  // keeps 1200 bytes: groups switch off from the front until it is covered
  EXPECT_EQ(decisions(plan_after_warmup(r, c), r),
            (std::vector<bool>{false, false, false, true, false, false}));
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
