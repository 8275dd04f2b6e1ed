// Aux-loss-free balancing (moe_router_enable_expert_bias): the step's tokens per expert, summed
// over the stage's ranks, move each expert's bias by rate x sign(mean - count) once per step, as
// Megatron's finalize_model_grads _update_router_expert_bias does; the counts start again at zero
// with the gradients.
#include <gtest/gtest.h>

#include <mutex>

#include "tests/layers/model_support.hpp"

namespace nodeemu::layers {
namespace {

TEST(ExpertBias, OneUpdatePerStepFromTheStagesSummedCounts) {
  ModelConfig cfg = testing::tiny_moe();
  cfg.num_layers = 1;
  cfg.router.enable_expert_bias = true;
  cfg.router.bias_update_rate = 0.25;
  constexpr int kRanks = 2, kMicroBatches = 2;
  const std::size_t E = std::size_t(cfg.num_moe_experts);
  Node node(testing::model_options(kRanks));
  Communicator comm(node);
  // Per rank: what its router counted (summed over its micro-batches), what the layer's step
  // counts held before the update, the bias after it, and the counts after zero_grad.
  std::vector<std::vector<float>> routed(kRanks), held(kRanks), bias(kRanks), zeroed(kRanks);
  std::mutex mu;
  node.run([&](Host& host) {
    const int r = host.rank();
    Device& dev = host.device();
    ModelChunk chunk(cfg, {0, 1, true, true}, dev, testing::kSeed,
                     comm.group({r}, "ep" + std::to_string(r)), r);
    ExecContext ctx{dev.default_stream(), dev.create_stream(Priority::High, "comm")};
    chunk.zero_grad(ctx.compute);
    std::vector<float> mine(E, 0);
    for (int m = 0; m < kMicroBatches; ++m) {
      auto plan = chunk.plan(
          ctx, m, synthetic_microbatch(cfg, 1, testing::kSeq, testing::kSeed, r, m), 1.0 / 64);
      plan->forward_all();
      plan->backward_all();
      dev.synchronize();
      const auto& c = plan->layers[0]->router_stats().tokens_per_expert;
      for (std::size_t e = 0; e < E; ++e) mine[e] += float(c[e]);
    }
    const TransformerLayer& layer = *chunk.layers()[0];
    const std::vector<float> before = layer.local_tokens_per_expert().to_f32();
    chunk.update_expert_bias(comm.group({0, 1}, "stage"), ctx.compute);
    dev.synchronize();
    const std::vector<float> b = layer.expert_bias().to_f32();
    chunk.zero_grad(ctx.compute);
    dev.synchronize();
    std::lock_guard<std::mutex> lock(mu);
    routed[std::size_t(r)] = mine;
    held[std::size_t(r)] = before;
    bias[std::size_t(r)] = b;
    zeroed[std::size_t(r)] = layer.local_tokens_per_expert().to_f32();
  });
  std::vector<float> total(E, 0);
  for (int r = 0; r < kRanks; ++r) {
    EXPECT_EQ(held[std::size_t(r)], routed[std::size_t(r)]) << "rank " << r;
    EXPECT_EQ(zeroed[std::size_t(r)], std::vector<float>(E, 0.0f)) << "rank " << r;
    for (std::size_t e = 0; e < E; ++e) total[e] += routed[std::size_t(r)][e];
  }
  double mean = 0;
  for (float t : total) mean += t;
  mean /= double(E);
  // Every token goes to top-k experts of 2 ranks x 2 micro-batches x kSeq tokens.
  EXPECT_EQ(mean * double(E), 2.0 * kMicroBatches * testing::kSeq * cfg.router.topk);
  bool moved_both_ways[2] = {false, false};
  for (std::size_t e = 0; e < E; ++e) {
    const float want = mean > total[e] ? 0.25f : mean < total[e] ? -0.25f : 0.0f;
    for (int r = 0; r < kRanks; ++r) EXPECT_EQ(bias[std::size_t(r)][e], want) << "expert " << e;
    if (want > 0) moved_both_ways[0] = true;
    if (want < 0) moved_both_ways[1] = true;
  }
  EXPECT_TRUE(moved_both_ways[0] && moved_both_ways[1]);  // the data is not balanced by chance
}

}  // namespace
}  // namespace nodeemu::layers
