// `nodeemu layer`: one micro-batch through one layer on rank 0, communication left out. Busy time
// by class adds up; a layer of small kernels is host-bound (the forward spans more than its busy
// time: the gaps an eager host leaves), a full-size one is GPU-bound; CUDA-graph scopes shorten
// a host-bound layer; the JSON carries the documented keys.
#include "emu/layer_timing.hpp"

#include <gtest/gtest.h>

#include <map>
#include <nlohmann/json.hpp>

#include "devices/gpu_profile.hpp"
#include "tests/emu/emu_test_support.hpp"

namespace nodeemu::emu {
namespace {

using testing::recipe_path;
using testing::tiny;

double class_sum(const LayerTiming& t) {
  double s = 0;
  for (const auto& [c, v] : t.by_class) s += v;
  return s;
}

TEST(Layer, BusyByClassAddsUpToBusyTime) {
  for (const auto& r : {tiny(), Recipe::load(recipe_path("qwen3_30b_a3b"))}) {
    const LayerReport rep = time_layers(r);
    ASSERT_FALSE(rep.layers.empty());
    for (const auto& t : rep.layers) {
      SCOPED_TRACE(r.name() + " " + t.kind);
      EXPECT_NEAR(class_sum(t), t.busy_s, 1e-12);
      EXPECT_GT(t.kernels, 20u);
      EXPECT_GT(t.by_class.at("gemm"), 0);
      EXPECT_GT(t.by_class.at("attention"), 0);
      EXPECT_LE(t.busy_s, t.forward_backward_s + 1e-15);
      EXPECT_LE(t.forward_busy_s, t.forward_s + 1e-15);
    }
  }
}

// With TP the layer runs on its TP group: rank 0 holds its share of the tokens, its collectives
// are timed (the comm class), and its GEMMs are smaller than the unsplit layer's.
TEST(Layer, ATensorParallelLayerRunsOnItsTpGroup) {
  const LayerReport split =
      time_layers(Recipe::load(recipe_path("qwen3_30b_a3b_tp2_pp2_vpp4_ep4")));
  const LayerReport whole = time_layers(
      Recipe::load(recipe_path("qwen3_30b_a3b_tp2_pp2_vpp4_ep4"),
                   {"model.tensor_model_parallel_size=1", "model.sequence_parallel=false"}));
  ASSERT_EQ(split.layers.size(), 1u);
  const LayerTiming& t = split.layers[0];
  EXPECT_EQ(t.tokens, 2048);
  EXPECT_EQ(whole.layers[0].tokens, 4096);
  EXPECT_GT(t.by_class.at("comm"), 0);
  EXPECT_EQ(whole.layers[0].by_class.count("comm"), 0u);
  EXPECT_LT(t.by_class.at("attention"), whole.layers[0].by_class.at("attention"));
  EXPECT_NE(split.notes[0].find("TP 2"), std::string::npos);
  // Rank 0's host alone: its TP peer issues as much again, which is not rank 0's issue time.
  EXPECT_LT(t.host_issue_s, 1.5 * whole.layers[0].host_issue_s);
}

// DeepSeek-V3's layers at full size (MLA at TP 2): a dense layer 0 and a MoE layer, each with
// its attention and TP collectives timed; MLA's attention (192-wide query/key heads) costs more
// than GQA with 128-wide heads and 16 KV groups would (the proxy recipe's shape).
TEST(Layer, TheDeepSeekV3RecipesLayersReportMla) {
  const LayerReport ds = time_layers(Recipe::load(recipe_path("deepseek_v3")));
  ASSERT_EQ(ds.layers.size(), 2u);
  std::map<std::string, const LayerTiming*> by_kind;
  for (const auto& t : ds.layers) by_kind[t.kind] = &t;
  ASSERT_TRUE(by_kind.count("moe") && by_kind.count("dense"));
  for (const auto& [kind, t] : by_kind) {
    SCOPED_TRACE(kind);
    EXPECT_EQ(t->tokens, 2048);
    EXPECT_GT(t->by_class.at("attention"), 0);
    EXPECT_GT(t->by_class.at("comm"), 0);
  }
  const LayerReport gqa = time_layers(Recipe::load(
      recipe_path("deepseek_v3"),
      {"model.multi_latent_attention=false", "model.rope_type=rope", "model.num_query_groups=16",
       "model.kv_channels=128", "model.q_lora_rank=~", "model.kv_lora_rank=~",
       "model.qk_head_dim=~", "model.qk_pos_emb_head_dim=~", "model.v_head_dim=~",
       "model.rotary_scaling_factor=~", "model.mscale=~", "model.mscale_all_dim=~",
       "model.original_max_position_embeddings=~", "model.qk_layernorm=false"}));
  EXPECT_GT(by_kind["moe"]->by_class.at("attention"), gqa.layers[0].by_class.at("attention"));
}

TEST(Layer, SmallShapesAreHostBoundAndFullSizeIsGpuBound) {
  // The tiny layer's kernels take less than the host's ~10 us per eager launch: between them the
  // GPU waits for the host, so the forward spans well beyond its busy time.
  const LayerTiming small = time_layers(tiny()).layers.front();
  EXPECT_EQ(small.kind, "moe");
  EXPECT_GT(small.forward_s, 2 * small.forward_busy_s);
  EXPECT_GT(small.host_issue_s, small.busy_s);
  // Qwen3-30B-A3B's layer at 4096 tokens keeps the GPU busy.
  const LayerTiming big = time_layers(Recipe::load(recipe_path("qwen3_30b_a3b"))).layers.front();
  EXPECT_GT(big.busy_s, 0.9 * big.forward_backward_s);
  EXPECT_EQ(big.rows_per_expert, 4096 * 8 * 16 / 128);  // tokens x topk x EP / experts
}

TEST(Layer, GraphScopesShortenAHostBoundLayer) {
  const LayerTiming eager = time_layers(tiny()).layers.front();
  const LayerTiming graphed =
      time_layers(tiny({"model.cuda_graph_impl=transformer_engine",
                        "model.cuda_graph_scope=[attn,moe_router,moe_preprocess]"}))
          .layers.front();
  EXPECT_EQ(graphed.kernels, eager.kernels);
  EXPECT_NEAR(graphed.busy_s, eager.busy_s, 1e-12);  // the same device work
  EXPECT_LT(graphed.host_issue_s, 0.5 * eager.host_issue_s);
  EXPECT_LT(graphed.forward_backward_s, 0.8 * eager.forward_backward_s);
}

TEST(Layer, DenseLayersAreTimedToo) {
  const LayerReport rep = time_layers(tiny({"model.moe_layer_freq=2"}));
  ASSERT_EQ(rep.layers.size(), 2u);
  EXPECT_EQ(rep.layers[0].kind, "moe");
  EXPECT_EQ(rep.layers[1].kind, "dense");
  EXPECT_EQ(rep.layers[1].layer, 1);
}

TEST(Layer, JsonHasTheDocumentedKeys) {
  const auto j = nlohmann::json::parse(layer_report_json(time_layers(tiny())));
  const auto& l = j.at("layers").at(0);
  for (const char* k :
       {"forward_s", "forward_backward_s", "busy_s", "host_issue_s", "kernels", "by_class"})
    EXPECT_TRUE(l.contains(k)) << k;
  double sum = 0;
  for (const auto& [c, v] : l.at("by_class").items()) sum += v.get<double>();
  EXPECT_NEAR(sum, l.at("busy_s").get<double>(), 1e-12);
}

}  // namespace
}  // namespace nodeemu::emu

namespace nodeemu::emu {
namespace {

// Qwen3-30B-A3B's layer at TP 2 with sequence parallelism: half the tokens per operation, so the
// host, issuing each at the framework's cost (host_ops.csv), cannot keep the GPU fed: the GPU
// idles between kernels. Transformer Engine's graph of the attention block replays its launches
// at the graph's cost, and recovers part of that idle time.
TEST(Layer, ATp2SequenceParallelLayerIsHostBoundAndAttentionGraphsRecoverPart) {
  const std::string tp2 = testing::recipe_path("qwen3_30b_a3b_tp2_pp2_vpp4_ep4");
  const LayerTiming eager = time_layers(Recipe::load(tp2)).layers.front();
  const LayerTiming graphed =
      time_layers(Recipe::load(tp2, {"model.cuda_graph_impl=transformer_engine",
                                     "model.cuda_graph_scope=[attn]"}))
          .layers.front();
  // Idle: the span is well above the time the GPU was busy, most of all in the forward.
  EXPECT_LT(eager.busy_s, 0.85 * eager.forward_backward_s);
  EXPECT_LT(eager.forward_busy_s, 0.7 * eager.forward_s);
  // The graph replays the same kernels (busy time unchanged) and closes part of the gaps.
  EXPECT_NEAR(graphed.busy_s, eager.busy_s, 0.01 * eager.busy_s);
  EXPECT_LT(graphed.forward_backward_s, 0.9 * eager.forward_backward_s);
  EXPECT_GT(graphed.forward_backward_s, graphed.busy_s);
  EXPECT_LT(graphed.host_issue_s, eager.host_issue_s);
}

// Recompute re-runs the forward ops of what it recomputes through Megatron's checkpoint
// functions, and the host pays their framework cost again: in a host-bound layer (the tiny
// recipe's) recomputing the norms costs the layer at least that host time, not just the two
// norms' microseconds of kernel time.
TEST(Layer, RecomputingTheNormsInAHostBoundLayerCostsTheirHostTime) {
  const LayerTiming plain = time_layers(testing::tiny()).layers.front();
  const LayerTiming re = time_layers(testing::tiny({"model.recompute_granularity=selective",
                                                    "model.recompute_modules=[layernorm]"}))
                             .layers.front();
  int recomputed = 0;
  for (const auto& op : re.timeline) recomputed += op.name.rfind("recompute.", 0) == 0;
  EXPECT_EQ(recomputed, 2);  // the input norm and the pre-MLP norm
  const double per_op = GpuProfile::builtin("h100_sxm5")->host_costs().forward_kernel_s;
  ASSERT_GT(per_op, 20e-6);  // the framework's cost, not a bare launch's
  EXPECT_GE(re.host_issue_s - plain.host_issue_s, 0.99 * recomputed * per_op);
  EXPECT_GE(re.forward_backward_s - plain.forward_backward_s, 0.99 * recomputed * per_op);
}

}  // namespace
}  // namespace nodeemu::emu
