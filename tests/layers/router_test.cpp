// The router's routing decisions as Megatron makes them: top-k order, the group limit, the
// expert bias, forced balance, and which tokens a capacity drops under each policy.
#include <gtest/gtest.h>

#include <cmath>

#include "devices/errors.hpp"
#include "layers/dtype.hpp"
#include "layers/router.hpp"

namespace nodeemu::layers {
namespace {

// Logits that make token t prefer expert pref[t] strongly, with probability rising with t.
std::vector<float> logits_preferring(const std::vector<int>& pref, int experts) {
  std::vector<float> l(pref.size() * std::size_t(experts), 0.0f);
  for (std::size_t t = 0; t < pref.size(); ++t)
    l[t * std::size_t(experts) + std::size_t(pref[t])] = 1.0f + 0.5f * float(t);
  return l;
}

TEST(Router, TopkPicksTheLargestLogitsInOrderAndSoftmaxesThem) {
  RouterConfig cfg{.num_experts = 4, .topk = 2};
  const std::vector<float> l{0.1f, 2.0f, -1.0f, 1.0f};
  auto r = route<float>(cfg, l.data(), 1, 1, nullptr);
  EXPECT_EQ(r.chosen, (std::vector<std::int64_t>{1, 3}));
  const float e = std::exp(1.0f);
  EXPECT_NEAR(r.probs[0], e / (e + 1), 1e-6);
  EXPECT_NEAR(r.probs[0] + r.probs[1], 1.0f, 1e-6);
}

TEST(Router, GroupLimitKeepsOnlyTheBestGroups) {
  RouterConfig cfg{.num_experts = 8,
                   .topk = 2,
                   .score = ScoreFunction::Sigmoid,
                   .num_groups = 4,
                   .group_topk = 1};
  // Expert 0 is the single best, but group 3 (experts 6, 7) has the best pair.
  const std::vector<float> l{3.0f, -3.0f, 0, 0, 0, 0, 2.0f, 2.0f};
  auto r = route<float>(cfg, l.data(), 1, 1, nullptr);
  EXPECT_EQ(r.chosen, (std::vector<std::int64_t>{6, 7}));
}

TEST(Router, ExpertBiasSteersSelectionButNotTheProbabilities) {
  RouterConfig cfg{.num_experts = 4, .topk = 1, .score = ScoreFunction::Sigmoid};
  const std::vector<float> l{1.0f, 0.9f, 0, 0}, bias{0, 0.5f, 0, 0};
  auto r = route<float>(cfg, l.data(), 1, 1, bias.data());
  EXPECT_EQ(r.chosen[0], 1);
  EXPECT_NEAR(r.probs[0], 1 / (1 + std::exp(-0.9f)), 1e-6);  // the unbiased score
  std::vector<float> b(4, 0.0f);
  update_expert_bias(b.data(), {4, 0, 2, 2}, 0.01);
  EXPECT_EQ(b, (std::vector<float>{-0.01f, 0.01f, 0, 0}));
}

TEST(Router, ForcedBalanceRoutesRoundRobin) {
  RouterConfig cfg{.num_experts = 4, .topk = 2, .force_load_balancing = true};
  std::vector<float> l(6 * 4, 0.0f);
  auto r = route<float>(cfg, l.data(), 6, 6, nullptr);
  EXPECT_EQ(r.tokens_per_expert, (std::vector<std::int64_t>{3, 3, 3, 3}));
  EXPECT_EQ(r.chosen[2], 2);
  EXPECT_EQ(r.chosen[3], 3);
}

TEST(Router, CapacityDropsTheLowestProbabilitiesUnderTheProbsPolicy) {
  // 6 tokens, top-1, 2 experts, capacity factor 1: capacity ceil(6 * 1 / 2) = 3 per expert.
  // Tokens 0..4 all prefer expert 0; probability rises with the token index (pre-softmax, so
  // that a top-1 probability is not always 1).
  RouterConfig cfg{.num_experts = 2, .topk = 1, .pre_softmax = true};
  cfg.capacity_factor = 1.0;
  auto l = logits_preferring({0, 0, 0, 0, 0, 1}, 2);
  auto r = route<float>(cfg, l.data(), 6, 6, nullptr);
  EXPECT_EQ(cfg.capacity(6), 3);
  // The three most probable (tokens 2, 3, 4) stay; tokens 0 and 1 drop, with probability 0.
  EXPECT_EQ(r.idx, (std::vector<std::int64_t>{-1, -1, 0, 0, 0, 1}));
  EXPECT_EQ(r.probs[0], 0.0f);
  EXPECT_EQ(r.tokens_per_expert, (std::vector<std::int64_t>{3, 1}));
  EXPECT_EQ(r.chosen[0], 0);  // the choice itself is kept for the losses' gradients
}

TEST(Router, CapacityKeepsTheEarliestTokensUnderThePositionPolicy) {
  RouterConfig cfg{.num_experts = 2, .topk = 1};
  cfg.capacity_factor = 1.0;
  cfg.drop_policy = DropPolicy::Position;
  auto l = logits_preferring({0, 0, 0, 0, 0, 1}, 2);
  auto r = route<float>(cfg, l.data(), 6, 6, nullptr);
  EXPECT_EQ(r.idx, (std::vector<std::int64_t>{0, 0, 0, -1, -1, 1}));
}

TEST(Router, PadToCapacityNeedsACapacityFactor) {
  RouterConfig cfg{.num_experts = 2, .topk = 1};
  cfg.pad_to_capacity = true;
  try {
    cfg.validate();
    FAIL();
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("moe_pad_expert_input_to_capacity"), std::string::npos);
  }
}

// A factor above the experts' count is refused: it used to overflow the capacity's integer
// (1e308 gave a negative capacity that a meta run took without a word).
TEST(Router, CapacityFactorIsAtMostTheExperts) {
  RouterConfig cfg{.num_experts = 8, .topk = 2};
  cfg.capacity_factor = 8.0;
  EXPECT_NO_THROW(cfg.validate());
  EXPECT_EQ(cfg.capacity(64), 128);  // every token's every pick
  cfg.capacity_factor = std::nan("");
  EXPECT_THROW(cfg.validate(), ConfigError);
  for (double f : {8.5, 1e308}) {
    cfg.capacity_factor = f;
    try {
      cfg.validate();
      FAIL() << f;
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find("moe_expert_capacity_factor"), std::string::npos);
      EXPECT_NE(std::string(e.what()).find("at most num_moe_experts (8)"), std::string::npos);
    }
  }
}

TEST(DType, Bf16AndFp16RoundToNearestEven) {
  // 1 + 2^-8 is exactly halfway between two bf16 values: ties go to the even one (1.0).
  EXPECT_EQ(bf16_to_f32(f32_to_bf16(1.0f + 1.0f / 256)), 1.0f);
  // 1 + 3 * 2^-8 is halfway too, and rounds up to the even 1 + 2^-6.
  EXPECT_EQ(bf16_to_f32(f32_to_bf16(1.0f + 3.0f / 256)), 1.0f + 1.0f / 64);
  EXPECT_EQ(bf16_to_f32(f32_to_bf16(1.0f + 1.1f / 256)), 1.0f + 1.0f / 128);
  EXPECT_EQ(f16_to_f32(f32_to_f16(1.0f + 1.0f / 2048)), 1.0f);  // halfway: to even
  EXPECT_EQ(f16_to_f32(f32_to_f16(1.0f + 3.0f / 2048)), 1.0f + 1.0f / 512);
  EXPECT_EQ(f16_to_f32(f32_to_f16(65504.0f)), 65504.0f);
  EXPECT_TRUE(std::isinf(f16_to_f32(f32_to_f16(65520.0f))));
  EXPECT_EQ(f16_to_f32(f32_to_f16(5.96046448e-8f)), 5.96046448e-8f);  // smallest subnormal
  EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(std::nanf("")))));
  for (float v : {0.1f, -3.7f, 1e-3f, 1234.5f}) {
    EXPECT_NEAR(round_to(DType::BF16, v), v, std::abs(v) / 256);
    EXPECT_NEAR(round_to(DType::F16, v), v, std::abs(v) / 2048);
  }
}

}  // namespace
}  // namespace nodeemu::layers
