// Megatron's keys choose the kernels: every key changes the timeline; the unfused paths keep the
// numerics (their values come from the fused math) except gradient_accumulation_fusion, which
// rounds each wgrad before main_grad adds it; schedules stay bit-exact within each setting; and
// every kernel of every shipped recipe is priced from a table of its GPU's profile.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "devices/gpu_profile.hpp"
#include "emu/layer_timing.hpp"
#include "emu/recipe_views.hpp"
#include "emu/training.hpp"
#include "tests/emu/emu_test_support.hpp"

namespace nodeemu::emu {
namespace {

using testing::recipe_path;
using testing::tiny;

RunReport run_choices(const std::vector<std::string>& overrides, int iterations = 1) {
  return train(tiny(overrides), {.iterations = iterations});
}

TEST(KernelChoices, EachKeyChangesTheTimelineNotTheNumerics) {
  const RunReport base = run_choices({});
  ASSERT_TRUE(base.numerics_hash);
  for (const char* key : {"model.moe_permute_fusion=true", "model.bias_activation_fusion=true",
                          "model.apply_rope_fusion=true", "model.moe_grouped_gemm=false",
                          "model.attention_backend=unfused", "model.moe_router_dtype=fp32"}) {
    SCOPED_TRACE(key);
    const RunReport r = run_choices({key});
    EXPECT_NE(r.timeline_hash, base.timeline_hash);
    EXPECT_EQ(r.numerics_hash, base.numerics_hash);
  }
  const RunReport local =
      run_choices({"model.transformer_impl=local", "model.moe_grouped_gemm=false"});
  EXPECT_NE(local.timeline_hash, base.timeline_hash);
  EXPECT_EQ(local.numerics_hash, base.numerics_hash);
}

// The experts' kept weight copy is compared with the weight once per weights generation, one
// per iteration: across optimizer steps the grouped path must still give the plain path's bits
// (a copy kept from the previous iteration would not).
TEST(KernelChoices, TheKeptExpertWeightCopyFollowsTheOptimizerAcrossIterations) {
  const RunReport grouped = run_choices({}, 3);
  const RunReport plain = run_choices({"model.moe_grouped_gemm=false"}, 3);
  ASSERT_TRUE(grouped.numerics_hash);
  EXPECT_EQ(grouped.numerics_hash, plain.numerics_hash);
}

// At the tiny recipe's size both fused backends run at the kernel floor; at Qwen3's they differ as
// the attention table says (FlashAttention about half cuDNN's rate on an H100).
TEST(KernelChoices, AttentionBackendsArePricedFromTheirOwnRows) {
  const Recipe qwen = Recipe::load(recipe_path("qwen3_30b_a3b"));
  Recipe flash = qwen;
  flash.set("model.attention_backend=flash");
  const double cudnn_s = time_layers(qwen).layers.front().by_class.at("attention");
  const double flash_s = time_layers(flash).layers.front().by_class.at("attention");
  EXPECT_GT(flash_s, 1.5 * cudnn_s);
}

// Megatron casts a linear's operands to the compute dtype: the GEMMs are bf16 even where NodeEmu
// keeps fp32 values for its numerics (the output layer's logits and their gradient), and only
// moe_router_dtype=fp32 puts the router's three GEMMs on the fp32 table (about 27 TFLOP/s on an
// H100 at the router's shape, against bf16's hundreds).
TEST(KernelChoices, GemmsRunInTheComputeDtypeAndTheRouterInItsOwn) {
  const Recipe qwen = Recipe::load(recipe_path("qwen3_30b_a3b"), {"model.moe_router_dtype=fp32"});
  const Recipe bf16_router =
      Recipe::load(recipe_path("qwen3_30b_a3b"), {"model.moe_router_dtype=null"});
  const double fp32_gemm = time_layers(qwen).layers.front().by_class.at("gemm");
  const double bf16_gemm = time_layers(bf16_router).layers.front().by_class.at("gemm");
  // 4096 tokens x 2048 x 128 experts, forward, dgrad and wgrad: ~0.24 ms in fp32, ~0.03 in bf16.
  EXPECT_GT(fp32_gemm - bf16_gemm, 0.15e-3);
  EXPECT_LT(fp32_gemm - bf16_gemm, 0.30e-3);
}

TEST(KernelChoices, TheOutputLayersFp32GradientTakesABf16Gemm) {
  const std::string trace = testing::trace_path("output_layer_dgrad", {});
  train(Recipe::load(recipe_path("qwen3_30b_a3b"),
                     {"model.num_layers=1", "train.global_batch_size=16"}),
        {.iterations = 1, .trace_path = trace});
  std::ifstream in(trace);
  const auto doc = nlohmann::json::parse(in);
  double dur_s = 0;
  for (const auto& e : doc.at("traceEvents"))
    if (e.value("name", "") == "output_layer_dgrad" && e.value("pid", -1) == 0 &&
        e.value("cat", "") == "kernel")
      dur_s = e.at("dur").get<double>() * 1e-6;
  ASSERT_GT(dur_s, 0);
  // dlogits[4096, 151936] . W[151936, 2048]: NN 4096 x 2048 over k = 151936.
  const auto h100 = GpuProfile::builtin("h100_sxm5");
  Work w;
  w.shape = KernelShape::gemm(GemmLayout::NN, 4096, 2048, 151936);
  const double bf16_s = h100->price(w).seconds;
  w.precision = Precision::FP32;
  const double fp32_s = h100->price(w).seconds;
  EXPECT_NEAR(dur_s, bf16_s, 0.25 * bf16_s);
  EXPECT_LT(dur_s, 0.5 * fp32_s);
}

TEST(KernelChoices, FusionsLaunchFewerKernels) {
  const RunReport unfused = run_choices({});
  const RunReport fused =
      run_choices({"model.moe_permute_fusion=true", "model.bias_activation_fusion=true",
                   "model.apply_rope_fusion=true", "model.gradient_accumulation_fusion=true"});
  EXPECT_LT(fused.device_ops, unfused.device_ops);
}

TEST(KernelChoices, UnfusedAttentionKeepsItsProbabilitiesForBackward) {
  const RunReport fused = run_choices({}),
                  unfused = run_choices({"model.attention_backend=unfused"});
  // 4 heads x 64 x 64 bf16 per micro-batch and layer, held from forward to backward.
  EXPECT_GT(unfused.devices[0].peak_mem_bytes, fused.devices[0].peak_mem_bytes);
}

TEST(KernelChoices, GradientAccumulationFusionChangesTheBitsAndSchedulesStillAgree) {
  const RunReport fused = run_choices({"model.gradient_accumulation_fusion=true"}, 2);
  const RunReport unfused = run_choices({"model.gradient_accumulation_fusion=false"}, 2);
  EXPECT_NE(fused.numerics_hash, unfused.numerics_hash);  // bf16 grads, then fp32 accumulation
  const RunReport overlapped = run_choices({"model.gradient_accumulation_fusion=false",
                                            "comm_overlap.overlap_moe_expert_parallel_comm=true",
                                            "comm_overlap.delay_wgrad_compute=true"},
                                           2);
  EXPECT_EQ(overlapped.numerics_hash, unfused.numerics_hash);
}

TEST(KernelChoices, CudaGraphsChangeTheRunNotTheNumerics) {
  const RunReport eager = run_choices({});
  const RunReport scoped = run_choices({"model.cuda_graph_impl=transformer_engine",
                                        "model.cuda_graph_scope=[attn,moe_router,moe_preprocess]"});
  EXPECT_LT(scoped.step_time_s, eager.step_time_s);  // the tiny recipe is host-bound
  EXPECT_EQ(scoped.numerics_hash, eager.numerics_hash);
  const std::vector<std::string> padded = {"model.moe_pad_expert_input_to_capacity=true",
                                           "model.moe_expert_capacity_factor=2"};
  auto full = padded;
  full.push_back("model.cuda_graph_impl=local");
  full.push_back("model.cuda_graph_scope=[full_iteration]");
  const RunReport whole = run_choices(full), padded_eager = run_choices(padded);
  EXPECT_LT(whole.step_time_s, padded_eager.step_time_s);
  EXPECT_EQ(whole.numerics_hash, padded_eager.numerics_hash);
}

// Every kernel a run of each shipped recipe emits is priced from a table (in meta mode at full
// size, one micro-batch per rank: the same kernels as the whole step, in seconds).
TEST(KernelChoices, EveryShippedRecipeIsPricedFromTables) {
  for (const char* name : {"tiny_moe", "qwen3_30b_a3b", "deepseek_v3_proxy", "mixtral_8x7b"}) {
    SCOPED_TRACE(name);
    Recipe r = Recipe::load(recipe_path(name),
                            {"emulator.mode=meta", "model.moe_router_force_load_balancing=true"});
    const auto topo = load_topology(r);
    const int world = r.int32("nodes") * topo->gpus;
    const int dp = parallel_layout(r, world).dp();
    r.set("train.global_batch_size=" +
          std::to_string(dp * r.int32("train.micro_batch_size") * pipeline_size(r)));
    const RunReport rep = train(r, {.iterations = 1});
    EXPECT_TRUE(rep.unpriced_kernels.empty()) << rep.unpriced_kernels.front();
    EXPECT_NE(rep.gpu_profile.find(r.name() == "tiny_moe" || r.name() == "qwen3_30b_a3b"
                                       ? "h100_sxm5: measured"
                                       : "h200_sxm: measured"),
              std::string::npos)
        << rep.gpu_profile;
  }
  const RunReport functional = run_choices({});
  EXPECT_TRUE(functional.unpriced_kernels.empty());
}

}  // namespace
}  // namespace nodeemu::emu
