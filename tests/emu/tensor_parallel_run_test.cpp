// Tensor parallelism through the recipe: within a TP2 layout every schedule, offload and
// recompute variant gives the sequential run's bits (the TP split itself is checked against
// TP = 1 in tests/layers/tensor_parallel_test.cpp), and the Qwen3 TP2 PP2 VPP4 EP4 recipe runs a
// full-size step in meta mode.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <sstream>

#include "emu/recipe_views.hpp"
#include "emu/training.hpp"
#include "emu/validate.hpp"
#include "tests/emu/emu_test_support.hpp"

namespace nodeemu::emu {
namespace {

using testing::tiny;

// TP2 x DP4 on one DGX; the experts fold the same 8 ranks into EP4 x expert-DP 2.
const std::vector<std::string> kTp2 = {
    "emulator.gpus_per_node=8", "model.tensor_model_parallel_size=2",
    "model.sequence_parallel=true", "model.expert_tensor_parallel_size=1", "train.train_iters=2"};

std::vector<std::string> with(std::vector<std::string> a, const std::vector<std::string>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

TEST(TensorParallelRun, EveryScheduleOffloadAndRecomputeKeepsTheBitsOfTheLayout) {
  const RunReport seq = train(tiny(kTp2));
  ASSERT_EQ(seq.schedule, "sequential");
  ASSERT_TRUE(seq.numerics_hash);
  // TP = 1 on the same data (DP 4 in both): the same loss within bf16 rounding.
  const RunReport unsplit = train(tiny({"train.train_iters=2"}));
  EXPECT_NEAR(*seq.iterations[0].loss, *unsplit.iterations[0].loss, 1e-3);
  EXPECT_NE(seq.numerics_hash, unsplit.numerics_hash);

  const std::string overlap = "comm_overlap.overlap_moe_expert_parallel_comm=true";
  const std::string delay = "comm_overlap.delay_wgrad_compute=true";
  // PP 2 doubles the world (two nodes): TP2 x PP2 x DP4.
  const std::vector<std::string> pp = {"nodes=2", "model.pipeline_model_parallel_size=2"};
  const std::vector<std::string> vpp =
      with(pp, {"model.virtual_pipeline_model_parallel_size=2", overlap, delay});
  const std::vector<std::vector<std::string>> variants = {
      {overlap},
      {overlap, delay},
      {"model.moe_shared_expert_overlap=true"},
      pp,
      with(pp, {"model.virtual_pipeline_model_parallel_size=2"}),
      vpp,
      {"model.recompute_granularity=selective",
       "model.recompute_modules=[core_attn,layernorm,moe_act,moe,shared_experts]"},
      {"model.fine_grained_activation_offloading=true",
       "model.offload_modules=[attn_norm,qkv_linear,core_attn,attn_proj,mlp_norm,expert_fc1,"
       "moe_act]"},
      with(vpp, {"model.recompute_granularity=selective",
                 "model.recompute_modules=[a2a_overlap_attn,a2a_overlap_post_attn,a2a_overlap_mlp]",
                 "model.fine_grained_activation_offloading=true",
                 "model.offload_modules=[attn_norm,mlp_norm,expert_fc1]",
                 "model.min_offloaded_tensor_size=0"}),
  };
  for (const auto& v : variants) {
    std::string name;
    for (const auto& s : v) name += s + " ";
    SCOPED_TRACE(name);
    const RunReport r = train(tiny(with(kTp2, v)));
    EXPECT_EQ(r.numerics_hash, seq.numerics_hash);
    for (std::size_t i = 0; i < seq.iterations.size(); ++i)
      EXPECT_EQ(r.iterations[i].loss, seq.iterations[i].loss);
  }
}

// Multi-latent attention through the recipe keys, in the TP2 layout: the combined 1F1B with
// delayed wgrad, a VPP pipeline, recompute and offload of its modules keep the sequential bits.
TEST(TensorParallelRun, MlaKeepsTheBitsOfTheLayout) {
  const std::vector<std::string> mla =
      with(kTp2,
           {"model.multi_latent_attention=true", "model.num_query_groups=4", "model.q_lora_rank=24",
            "model.kv_lora_rank=16", "model.qk_head_dim=8", "model.qk_pos_emb_head_dim=4",
            "model.v_head_dim=8", "model.qk_layernorm=true", "model.rotary_scaling_factor=4",
            "model.mscale_all_dim=1", "model.original_max_position_embeddings=32"});
  const RunReport seq = train(tiny(mla));
  ASSERT_TRUE(seq.numerics_hash);
  const RunReport gqa = train(tiny(kTp2));
  EXPECT_NE(seq.numerics_hash, gqa.numerics_hash);
  const std::vector<std::vector<std::string>> variants = {
      {"comm_overlap.overlap_moe_expert_parallel_comm=true",
       "comm_overlap.delay_wgrad_compute=true"},
      {"nodes=2", "model.pipeline_model_parallel_size=2",
       "model.virtual_pipeline_model_parallel_size=2"},
      {"model.recompute_granularity=selective", "model.recompute_modules=[core_attn,layernorm]",
       "model.fine_grained_activation_offloading=true",
       "model.offload_modules=[attn_norm,qkv_linear,core_attn,attn_proj]",
       "model.min_offloaded_tensor_size=0"},
      // The whole attention recomputed from the layer input: MLA's projections run again.
      {"comm_overlap.overlap_moe_expert_parallel_comm=true",
       "model.recompute_granularity=selective", "model.recompute_modules=[a2a_overlap_attn]"},
      // Megatron's mla_up_proj: the up projections again from the latents, alone and with the
      // whole attention's recompute.
      {"model.recompute_granularity=selective", "model.recompute_modules=[mla_up_proj]"},
      {"comm_overlap.overlap_moe_expert_parallel_comm=true",
       "model.recompute_granularity=selective",
       "model.recompute_modules=[mla_up_proj,a2a_overlap_attn]"},
  };
  for (const auto& v : variants) {
    SCOPED_TRACE(v.back());
    const RunReport r = train(tiny(with(mla, v)));
    EXPECT_EQ(r.numerics_hash, seq.numerics_hash);
  }
  // mla_up_proj frees the attention's input between forward and backward and pays for it in
  // recompute kernels.
  const RunReport up = train(tiny(with(
      mla, {"model.recompute_granularity=selective", "model.recompute_modules=[mla_up_proj]"})));
  EXPECT_LT(up.devices[0].peak_mem_bytes, seq.devices[0].peak_mem_bytes);
  EXPECT_GT(up.recompute_s, 0);
  EXPECT_EQ(seq.recompute_s, 0);
}

// DeepSeek-V3's shape in small through the recipe: MLA, a dense first layer and MTP, in the
// TP2 layout. One stage: the combined 1F1B with delayed wgrad, recompute and offload keep the
// sequential bits. Two stages (the MTP layer and an embedding copy on the last, their gradient
// summed with the first stage's over the embedding group): 1F1B, interleaved, and interleaved
// with EP overlap keep each other's bits (not PP 1's: the embedding's two gradients are added
// in another order). The MTP loss is reported beside the LM loss.
TEST(TensorParallelRun, MlaWithMtpKeepsTheBitsOfTheLayout) {
  const std::vector<std::string> ds =
      with(kTp2, {"model.multi_latent_attention=true", "model.num_query_groups=4",
                  "model.q_lora_rank=24", "model.kv_lora_rank=16", "model.qk_head_dim=8",
                  "model.qk_pos_emb_head_dim=4", "model.v_head_dim=8", "model.qk_layernorm=true",
                  "model.moe_layer_freq=[0,1,1,1]", "model.mtp_num_layers=1"});
  const RunReport seq = train(tiny(ds));
  ASSERT_TRUE(seq.numerics_hash);
  ASSERT_TRUE(seq.iterations[0].mtp_loss);
  EXPECT_GT(*seq.iterations[0].mtp_loss, 1.0);  // a cross-entropy over a vocabulary of 128
  EXPECT_NE(*seq.iterations[0].mtp_loss, *seq.iterations[0].loss);
  const std::string overlap = "comm_overlap.overlap_moe_expert_parallel_comm=true";
  for (const auto& v : std::vector<std::vector<std::string>>{
           {overlap, "comm_overlap.delay_wgrad_compute=true"},
           {"model.recompute_granularity=selective",
            "model.recompute_modules=[mla_up_proj,layernorm,moe_act]"},
           {"model.fine_grained_activation_offloading=true",
            "model.offload_modules=[attn_norm,qkv_linear,core_attn,expert_fc1]",
            "model.min_offloaded_tensor_size=0"}}) {
    SCOPED_TRACE(v.back());
    const RunReport r = train(tiny(with(ds, v)));
    EXPECT_EQ(r.numerics_hash, seq.numerics_hash);
    EXPECT_EQ(r.iterations[0].mtp_loss, seq.iterations[0].mtp_loss);
  }
  const std::vector<std::string> pp = with(ds, {"nodes=2", "model.pipeline_model_parallel_size=2"});
  const RunReport one_f_one_b = train(tiny(pp));
  EXPECT_EQ(one_f_one_b.iterations[0].loss, seq.iterations[0].loss);  // the first step's forward
  const std::vector<std::string> vpp = with(pp, {"model.virtual_pipeline_model_parallel_size=2"});
  for (const auto& v : std::vector<std::vector<std::string>>{
           vpp, with(vpp, {overlap, "comm_overlap.delay_wgrad_compute=true"})}) {
    SCOPED_TRACE(v.back());
    const RunReport r = train(tiny(v));
    EXPECT_EQ(r.numerics_hash, one_f_one_b.numerics_hash);
  }
}

// The DeepSeek-V3 recipe (Megatron-Bridge's H100 layout) validates at full size; its full step
// (1024 GPUs, 128 micro-batches per pipeline) is minutes to hours of wall time on a small host
// (bench/README: engine speed is issue 19), so the run here keeps its width, MLA, MTP, dense
// first layer, TP2 SP and the HybridEP flex dispatcher and shrinks the rest: 4 layers on two
// stages of 16 GPUs, EP16, one step of 16 sequences. The trace holds MLA's and MTP's work.
TEST(TensorParallelRun, TheDeepSeekV3RecipeValidatesAndRunsScaledDown) {
  const Recipe full = Recipe::load(testing::recipe_path("deepseek_v3"));
  const auto topo = load_topology(full);
  EXPECT_FALSE(has_errors(validate(full, topo->gpu, topo->gpus)));
  const std::string trace = testing::trace_path("deepseek_v3_scaled", {});
  const RunReport r = train(
      Recipe::load(testing::recipe_path("deepseek_v3"),
                   {"nodes=4", "model.pipeline_model_parallel_size=2",
                    "model.expert_model_parallel_size=16", "model.num_layers=4",
                    "model.moe_layer_freq=[0,1,1,1]", "model.num_layers_in_first_pipeline_stage=2",
                    "model.num_layers_in_last_pipeline_stage=2", "train.global_batch_size=16"}),
      {.trace_path = trace});
  EXPECT_EQ(r.world, 32);
  EXPECT_GT(r.step_time_s, 0);
  std::ifstream in(trace);
  std::stringstream text;
  text << in.rdbuf();
  for (const char* k :
       {"linear_q_down_proj", "linear_kv_up_proj", "sp_allgather_k_pos_emb", "mla_qkv_concat",
        "mtp_eh_proj", "mtp_final_layernorm", "mtp_output_layer", "embedding_grad_allreduce"})
    EXPECT_NE(text.str().find(k), std::string::npos) << k;
}

TEST(TensorParallelRun, DenseFirstLayersAndTheFlexDispatcherKeepTheBits) {
  const std::vector<std::string> base = with(kTp2, {"model.moe_layer_freq=[0,1,1,1]"});
  const RunReport seq = train(tiny(base));
  const RunReport comb =
      train(tiny(with(base, {"comm_overlap.overlap_moe_expert_parallel_comm=true",
                             "comm_overlap.delay_wgrad_compute=true"})));
  EXPECT_EQ(comb.numerics_hash, seq.numerics_hash);
  const std::vector<std::string> flex = with(
      base, {"model.moe_token_dispatcher_type=flex", "model.moe_flex_dispatcher_backend=deepep"});
  const RunReport f = train(tiny(flex));
  ASSERT_TRUE(f.numerics_hash);
  const RunReport fo =
      train(tiny(with(flex, {"comm_overlap.overlap_moe_expert_parallel_comm=true"})));
  EXPECT_EQ(fo.numerics_hash, f.numerics_hash);
}

// Expert TP through the recipe: ETP unset follows TP 2 (Megatron's default), and ETP 2 keeps
// the layout's bits under the combined 1F1B with delayed wgrad and under PP 2 with VPP 2.
TEST(TensorParallelRun, ExpertTpKeepsTheBitsOfItsLayout) {
  const std::vector<std::string> base = {"emulator.gpus_per_node=8",
                                         "model.tensor_model_parallel_size=2",
                                         "model.sequence_parallel=true", "train.train_iters=2"};
  const RunReport seq = train(tiny(base));
  ASSERT_TRUE(seq.numerics_hash);
  const RunReport explicit_etp = train(tiny(with(base, {"model.expert_tensor_parallel_size=2"})));
  EXPECT_EQ(explicit_etp.numerics_hash, seq.numerics_hash);
  const RunReport etp1 = train(tiny(with(base, {"model.expert_tensor_parallel_size=1"})));
  EXPECT_NE(etp1.numerics_hash, seq.numerics_hash);  // other shards, other sums
  EXPECT_NEAR(*etp1.iterations[0].loss, *seq.iterations[0].loss, 1e-3);
  const std::string overlap = "comm_overlap.overlap_moe_expert_parallel_comm=true";
  const std::string delay = "comm_overlap.delay_wgrad_compute=true";
  EXPECT_EQ(train(tiny(with(base, {overlap, delay}))).numerics_hash, seq.numerics_hash);
  EXPECT_EQ(
      train(tiny(with(base, {"nodes=2", "model.pipeline_model_parallel_size=2",
                             "model.virtual_pipeline_model_parallel_size=2", overlap, delay})))
          .numerics_hash,
      seq.numerics_hash);
}

}  // namespace
}  // namespace nodeemu::emu
