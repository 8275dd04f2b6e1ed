// Offload, selective recompute and bindpcie through the run loop: the same numerics hash with
// and without them, the reports' figures, the trace's copy tracks, and bindpcie's effect on the
// virtual timeline.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "emu/recipe_views.hpp"
#include "emu/training.hpp"
#include "tests/emu/emu_test_support.hpp"

namespace nodeemu::emu {
namespace {

using testing::tiny;

const std::vector<std::string> kOffload = {
    "model.fine_grained_activation_offloading=true",
    "model.offload_modules=[attn_norm,qkv_linear,core_attn,attn_proj,mlp_norm,expert_fc1,moe_act]",
    "model.min_offloaded_tensor_size=0", "train.train_iters=3"};

std::vector<std::string> with(std::vector<std::string> a, const std::vector<std::string>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

TEST(OffloadRun, ListOverridesReachTheEngine) {
  const Recipe r = tiny({"model.fine_grained_activation_offloading=true",
                         "model.offload_modules=[expert_fc1,moe_act]",
                         "model.offload_tensors=[dispatched_input]",
                         "model.activation_offload_fraction=0.5", "model.max_inflight_offloads=2"});
  const auto c = offload_config(r, 1);
  ASSERT_TRUE(c);
  EXPECT_EQ(c->modules, (std::vector<std::string>{"expert_fc1", "moe_act"}));
  EXPECT_EQ(c->tensors, (std::vector<std::string>{"dispatched_input"}));
  EXPECT_EQ(c->fraction, 0.5);
  EXPECT_EQ(c->max_inflight, 2);
  EXPECT_EQ(c->pp_rank, 1);
  EXPECT_FALSE(offload_config(tiny(), 0));
}

// fine_grained_activation_offload.py: a chunk handler per micro-batch's forward through each
// model chunk, so with VPP every chunk's groups are decided on their own; and
// _drain_offload_pending: max_inflight_offloads=0 makes the compute stream wait for each
// offload, unset never (the two differ only in the timeline).
TEST(OffloadRun, HandlersPerChunkAndTheInflightCap) {
  const std::vector<std::string> vpp = {
      "emulator.gpus_per_node=8", "model.pipeline_model_parallel_size=2",
      "model.virtual_pipeline_model_parallel_size=2", "train.global_batch_size=32"};
  const Recipe r = tiny(with(vpp, kOffload));
  const auto c = offload_config(r, 1);
  ASSERT_TRUE(c);
  // Four layers over PP2 x VPP2: rank 1 holds virtual stages 1 and 3, layers 1 and 3.
  EXPECT_EQ(c->chunk_first_layers, (std::vector<int>{1, 3}));
  const RunReport base = train(tiny(with(vpp, {"train.train_iters=3"})));
  const RunReport off = train(r);
  EXPECT_EQ(off.numerics_hash, base.numerics_hash);
  const RunReport never = train(tiny(kOffload));
  const RunReport each = train(tiny(with(kOffload, {"model.max_inflight_offloads=0"})));
  EXPECT_EQ(each.numerics_hash, never.numerics_hash);
  EXPECT_NE(each.timeline_hash, never.timeline_hash);
  EXPECT_GE(each.step_time_s, never.step_time_s);
}

TEST(OffloadRun, OffloadAndRecomputeKeepTheNumericsHash) {
  const RunReport base = train(tiny({"train.train_iters=3"}));
  const RunReport off = train(tiny(kOffload));
  const RunReport rec =
      train(tiny({"model.recompute_granularity=selective",
                  "model.recompute_modules=[core_attn,layernorm,moe_act,moe,shared_experts]",
                  "train.train_iters=3"}));
  ASSERT_TRUE(base.numerics_hash);
  EXPECT_EQ(off.numerics_hash, base.numerics_hash);
  EXPECT_EQ(rec.numerics_hash, base.numerics_hash);
  for (std::size_t i = 0; i < base.iterations.size(); ++i) {
    EXPECT_EQ(off.iterations[i].loss, base.iterations[i].loss);
    EXPECT_EQ(rec.iterations[i].loss, base.iterations[i].loss);
  }
  // The reports: bytes offloaded per device and step, copy time, recompute time.
  EXPECT_TRUE(off.offload);
  EXPECT_GT(off.total_offload_s, 0);
  EXPECT_LE(off.exposed_offload_s, off.total_offload_s);
  for (const auto& d : off.devices) EXPECT_GT(d.offload_bytes, 0u);
  EXPECT_EQ(base.total_offload_s, 0);
  EXPECT_TRUE(rec.recompute);
  EXPECT_GT(rec.recompute_s, 0);
  EXPECT_EQ(base.recompute_s, 0);
  // Recompute is real work: the step takes longer in virtual time.
  EXPECT_GT(rec.step_time_s, base.step_time_s);
}

TEST(OffloadRun, CombinedScheduleWithOffloadAndOverlapNodeRecomputeIsBitIdentical) {
  const std::vector<std::string> pp = {"emulator.gpus_per_node=8",
                                       "model.pipeline_model_parallel_size=2",
                                       "model.virtual_pipeline_model_parallel_size=2",
                                       "comm_overlap.overlap_moe_expert_parallel_comm=true",
                                       "comm_overlap.delay_wgrad_compute=true",
                                       "train.train_iters=2"};
  const RunReport base = train(tiny(pp));
  const RunReport all = train(tiny(
      with(pp, {"model.recompute_granularity=selective",
                "model.recompute_modules=[a2a_overlap_attn,a2a_overlap_post_attn,a2a_overlap_mlp]",
                "model.fine_grained_activation_offloading=true",
                "model.offload_modules=[attn_norm,mlp_norm,expert_fc1]",
                "model.offload_tensors=[dispatched_input,pre_mlp_layernorm_output]",
                "model.min_offloaded_tensor_size=0"})));
  EXPECT_EQ(all.numerics_hash, base.numerics_hash);
  EXPECT_GT(all.recompute_s, 0);
}

// QK layer norm under every variant at once: the combined 1F1B with delayed wgrad over PP 2 and
// VPP 2, the attention recomputed (QKV, norm and RoPE again from the input norm) and the
// qkv_linear module offloaded (its input and the QK norm's input): the sequential run's bits.
TEST(OffloadRun, QkLayernormKeepsTheNumericsHashUnderEverySchedule) {
  const RunReport seq =
      train(tiny({"model.qk_layernorm=true", "model.num_layers=4", "train.train_iters=2"}));
  const std::vector<std::string> pp = {"model.qk_layernorm=true",
                                       "emulator.gpus_per_node=8",
                                       "model.pipeline_model_parallel_size=2",
                                       "model.virtual_pipeline_model_parallel_size=2",
                                       "comm_overlap.overlap_moe_expert_parallel_comm=true",
                                       "comm_overlap.delay_wgrad_compute=true",
                                       "train.train_iters=2"};
  const RunReport all = train(tiny(with(
      pp, {"model.recompute_granularity=selective", "model.recompute_modules=[a2a_overlap_attn]",
           "model.fine_grained_activation_offloading=true", "model.offload_modules=[qkv_linear]",
           "model.min_offloaded_tensor_size=0"})));
  ASSERT_TRUE(seq.numerics_hash);
  EXPECT_EQ(all.numerics_hash, seq.numerics_hash);
  EXPECT_NE(seq.numerics_hash, train(tiny({"train.train_iters=2"})).numerics_hash);
}

TEST(OffloadRun, TraceShowsTheD2HAndH2DTracks) {
  const std::string path = testing::trace_path("nodeemu_offload", kOffload);
  TrainOptions o;
  o.trace_path = path;
  train(tiny(kOffload), o);
  std::ifstream f(path);
  std::stringstream text;
  text << f.rdbuf();
  EXPECT_NE(text.str().find("offload_d2h"), std::string::npos);
  EXPECT_NE(text.str().find("offload_h2d"), std::string::npos);
  EXPECT_NE(text.str().find("reload L0 attn_norm.input"), std::string::npos);
  // The norm groups commit where Megatron commits them: attn_norm after the attention's residual
  // add (so after attn_proj's group), mlp_norm after the MLP's residual add, inside the combine
  // node (so after the experts' groups). The host issues the D2H copies in that order.
  const auto doc = nlohmann::json::parse(text.str());
  std::vector<std::string> order;
  for (const auto& e : doc.at("traceEvents"))
    if (e.value("pid", -1) == 0 && e.value("cat", "") == "host" &&
        e.value("name", "").rfind("offload L0 ", 0) == 0 && order.size() < 11)
      order.push_back(e.value("name", "").substr(11));
  ASSERT_GE(order.size(), 11u);  // micro-batch 0's tensors of layer 0
  auto at = [&](const std::string& prefix) {
    for (std::size_t i = 0; i < order.size(); ++i)
      if (order[i].rfind(prefix, 0) == 0) return int(i);
    return -1;
  };
  EXPECT_GT(at("attn_norm."), at("attn_proj."));
  EXPECT_GT(at("mlp_norm."), at("moe_act."));
  std::filesystem::remove(path);
}

TEST(OffloadRun, BaselineMeasuresPeakMemoryWithoutOffload) {
  const Recipe r = tiny(kOffload);
  RunReport rep = train(r);
  measure_memory_baseline(r, {}, rep);
  const RunReport base = train(without_memory_savers(r));
  for (std::size_t d = 0; d < rep.devices.size(); ++d)
    EXPECT_EQ(rep.devices[d].peak_mem_without_savers_bytes, base.devices[d].peak_mem_bytes);
}

// A meta recipe whose copies take about as long as its compute: with bindpcie every rank's
// pinned pool is on its GPU's socket, without it ranks 1 and 3 copy to the far socket, and their
// copies are slower and less hidden.
TEST(OffloadRun, BindPcieLowersExposedOffloadInVirtualTime) {
  // A GPU-bound layer: at half these sizes the eager host (host_ops.csv) sets the step's pace,
  // and the far socket's slower copies hide in its gaps whether bound or not.
  const std::vector<std::string> meta = {
      "emulator.mode=meta",
      "model.moe_router_force_load_balancing=true",
      "model.hidden_size=2048",
      "model.num_attention_heads=8",
      "model.num_query_groups=4",
      "model.ffn_hidden_size=4096",
      "model.moe_ffn_hidden_size=2048",
      "model.moe_shared_expert_intermediate_size=2048",
      "train.seq_length=8192",
      "model.vocab_size=32000",
      "train.global_batch_size=8",
      "model.fine_grained_activation_offloading=true",
      "model.offload_modules=[expert_fc1,moe_act,attn_norm,mlp_norm]",
      "train.train_iters=3"};
  const RunReport unbound = train(tiny(with(meta, {"emulator.bindpcie=false"})));
  const RunReport bound = train(tiny(with(meta, {"emulator.bindpcie=true"})));
  EXPECT_TRUE(bound.bindpcie);
  EXPECT_LT(bound.exposed_offload_s, unbound.exposed_offload_s);
  EXPECT_LT(bound.total_offload_s, unbound.total_offload_s);
  EXPECT_LT(bound.step_time_s, unbound.step_time_s);
  for (int d = 0; d < 4; ++d) {
    const bool far = d % 2 == 1;  // the unbound default: ranks round-robin over the sockets
    EXPECT_EQ(unbound.devices[std::size_t(d)].host_numa, d % 2);
    EXPECT_EQ(bound.devices[std::size_t(d)].host_numa, 0);
    // (The near ranks change too: the all-to-all waits for the slowed far ranks.)
    if (far) {
      EXPECT_GT(unbound.devices[std::size_t(d)].offload_busy_s,
                bound.devices[std::size_t(d)].offload_busy_s);
      EXPECT_GT(unbound.devices[std::size_t(d)].exposed_offload_s,
                bound.devices[std::size_t(d)].exposed_offload_s);
    }
  }
}

}  // namespace
}  // namespace nodeemu::emu
