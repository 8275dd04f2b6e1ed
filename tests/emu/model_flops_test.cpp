// The model FLOPs NodeEmu's TFLOP/s per GPU is counted from (emu/model_flops.hpp): Megatron-LM's
// num_floating_point_operations, checked against a count by hand for Qwen3-30B-A3B; and the
// run's per-GPU figures (tokens/s, TFLOP/s, MFU, communication hidden) as the summary gives them.
#include <gtest/gtest.h>

#include <sstream>

#include "devices/gpu_spec.hpp"
#include "emu/model_flops.hpp"
#include "emu/recipe_views.hpp"
#include "emu/report.hpp"
#include "emu/timeline_stats.hpp"
#include "emu/training.hpp"
#include "tests/emu/emu_test_support.hpp"

namespace nodeemu::emu {
namespace {

TEST(ModelFlops, Qwen3MatchesACountByHand) {
  const Recipe r = Recipe::load(testing::recipe_path("qwen3_30b_a3b"));
  const layers::ModelConfig c = model_config(r, GpuSpec{});
  // 48 MoE layers, hidden 2048, 32 query heads and 4 groups of 128, 8 of 128 experts of 768,
  // vocabulary 151936 (already a multiple of 128); the global batch: 1024 sequences of 4096.
  const double tokens = 1024.0 * 4096.0;
  // Per token, each GEMM three times (forward, dgrad, wgrad) at 2 FLOPs a multiply-add:
  const double experts = 6 * 2048.0 * (768.0 * 8 * 3) * 48;  // SwiGLU: h->2f and f->h
  const double projections = 6 * (2048.0 * (4096 + 2 * 512) + 4096.0 * 2048) * 48;  // QKV, out
  const double logits = 6 * 2048.0 * 151936;
  // Core attention, per sequence's squared length: QK^T and its product by V, half of them
  // (causal), 4096 query columns, 48 layers.
  const double core = 1024.0 * 4096 * 4096 * (6 * 4096.0 / 2 * 2) * 48;
  EXPECT_EQ(experts, 10871635968.0);
  EXPECT_EQ(projections, 5435817984.0);
  EXPECT_EQ(logits, 1866989568.0);
  const double by_hand = tokens * (experts + projections + logits) + core;
  EXPECT_DOUBLE_EQ(megatron_model_flops(c, 1024, 4096), by_hand);
  EXPECT_NEAR(by_hand, 9.6495e16, 0.0001e16);
  EXPECT_EQ(megatron_padded_vocab(c), 151936);
}

TEST(ModelFlops, TensorParallelPadsTheVocabularyAsMegatronDoes) {
  layers::ModelConfig c;
  c.vocab_size = 151936;
  c.tensor_model_parallel_size = 2;  // a multiple of 256
  EXPECT_EQ(megatron_padded_vocab(c), 152064);
}

TEST(ModelFlops, TheRunReportsTokensTflopsMfuAndHiddenCommunication) {
  const Recipe recipe = testing::tiny({"train.train_iters=2"});
  const RunReport r = train(recipe);
  const layers::ModelConfig c = model_config(recipe, GpuSpec{});
  const std::int64_t samples = recipe.int32("train.global_batch_size"),
                     seq = recipe.int32("train.seq_length");
  EXPECT_DOUBLE_EQ(r.tokens_per_s_per_gpu, double(samples * seq) / r.step_time_s / r.world);
  EXPECT_NEAR(r.model_tflops_per_gpu,
              megatron_model_flops(c, samples, seq) / r.step_time_s / r.world / 1e12,
              1e-9 * r.model_tflops_per_gpu);
  ASSERT_GT(r.peak_bf16_tflops, 0);
  EXPECT_DOUBLE_EQ(r.mfu, r.model_tflops_per_gpu / r.peak_bf16_tflops);
  ASSERT_GT(r.total_comm_s, 0);
  EXPECT_DOUBLE_EQ(r.hidden_comm_share, 1 - r.exposed_comm_s / r.total_comm_s);
  // The exposed time by collective names collectives this run ran, each within the step.
  ASSERT_FALSE(r.exposed_comm_by_name.empty());
  for (const auto& [name, s] : r.exposed_comm_by_name) {
    EXPECT_FALSE(name.empty());
    EXPECT_GT(s, 0) << name;
    EXPECT_LE(s, r.step_time_s) << name;
  }
  // By group: the layout's kinds; the tiny recipe's EP all-to-alls and data-parallel reductions.
  EXPECT_TRUE(r.exposed_comm_by_group.count("ep")) << "no EP group in the exposed time";
  for (const auto& [group, s] : r.exposed_comm_by_group) {
    EXPECT_FALSE(group.empty());
    EXPECT_TRUE(group.find_first_of("0123456789") == std::string::npos) << group;
    EXPECT_LE(s, r.step_time_s) << group;
  }
  // The tiny recipe's layers are small: its GPUs wait on their hosts for part of the step.
  EXPECT_GT(r.host_bound_s, 0);
  EXPECT_LT(r.host_bound_s, r.step_time_s);
  std::ostringstream summary;
  print_summary(r, summary);
  EXPECT_NE(summary.str().find("TFLOP/s (model FLOPs as Megatron-LM counts them), MFU"),
            std::string::npos)
      << summary.str();
  EXPECT_NE(summary.str().find("communication hidden behind compute:"), std::string::npos);
  EXPECT_NE(summary.str().find("exposed communication by group: "), std::string::npos);
  EXPECT_NE(summary.str().find("the GPU idle while its host issued work (host-bound): "),
            std::string::npos);
}

// At the data-parallel tests' shapes (sequence 32768) the GPU sets the pace: its host is ahead,
// and the GPU waits on it for a small part of the step only.
TEST(ModelFlops, AGpuBoundRunWaitsLittleOnItsHost) {
  const RunReport r = train(testing::tiny(testing::kDenseMetaDp4), {.iterations = 2});
  EXPECT_LT(r.host_bound_s, 0.05 * r.step_time_s)
      << r.host_bound_s << " s of a " << r.step_time_s << " s step";
}

TEST(ModelFlops, GroupNamesFoldIntoTheirKinds) {
  EXPECT_EQ(group_kind("ep0"), "ep");
  EXPECT_EQ(group_kind("dp-cp12"), "dp-cp");
  EXPECT_EQ(group_kind("pp_fwd_0_4"), "pp");
  EXPECT_EQ(group_kind("tp_cp"), "tp-cp");
  EXPECT_EQ(group_kind("stage1"), "stage");
  EXPECT_EQ(group_kind("world"), "world");
}

}  // namespace
}  // namespace nodeemu::emu
