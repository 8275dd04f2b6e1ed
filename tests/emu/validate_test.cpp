// Every rule of REFERENCE.md section 4 and the layout checks: a recipe that keeps the rule passes,
// one that breaks it gets exactly the error line that names the key.
#include <gtest/gtest.h>

#include <sstream>

#include "emu/recipe_views.hpp"
#include "emu/validate.hpp"
#include "tests/emu/validate_support.hpp"

namespace nodeemu::emu {
namespace {

using testing::check;
using testing::cp2;
using testing::delayed;
using testing::overlap;
using testing::Rule;
using testing::Rules;
using testing::tiny;

// Values Megatron ignores are not refused (issue 54): an empty offload list without offloading
// is silent; a2a at CP 1 and the pre-softmax of a sigmoid router only warn.
TEST(Validate, ValuesMegatronIgnoresAreNotErrors) {
  EXPECT_EQ(check({"model.offload_modules=[]"}), "");
  for (const auto& o : std::vector<std::vector<std::string>>{
           {"model.cp_comm_type=a2a"},
           {"model.moe_router_score_function=sigmoid", "model.moe_router_pre_softmax=true"}}) {
    const std::string out = check(o);
    EXPECT_EQ(out.find("error:"), std::string::npos) << out;
    EXPECT_NE(out.find("warning:"), std::string::npos) << out;
  }
}

TEST_P(Rules, PassesWhenKeptAndNamesTheKeyWhenBroken) {
  const Rule& rule = GetParam();
  EXPECT_EQ(check(rule.good), "") << rule.name;
  const std::string out = check(rule.bad);
  EXPECT_NE(out.find(rule.expected), std::string::npos) << rule.name << ":\n" << out;
}

const Rule kRules[] = {
    // --- EP overlap ---
    {"overlap_needs_ep", overlap({}), overlap({"model.expert_model_parallel_size=1"}),
     "error: model.expert_model_parallel_size: must be > 1 (required by "
     "comm_overlap.overlap_moe_expert_parallel_comm)\n"},
    {"overlap_needs_experts", overlap({}),
     overlap({"model.num_moe_experts=1", "model.moe_router_topk=1",
              "model.expert_model_parallel_size=1"}),
     "error: model.num_moe_experts: must be > 1"},
    {"overlap_needs_alltoall_or_flex", overlap({}),
     overlap({"model.moe_token_dispatcher_type=allgather"}),
     "error: model.moe_token_dispatcher_type: is 'allgather'; set alltoall or flex"},
    {"overlap_needs_bf16", overlap({"model.bf16=false", "model.fp16=true"}),
     overlap({"model.bf16=false"}), "error: model.bf16: set bf16 (or fp16)"},
    {"overlap_needs_torch_2_6", overlap({"emulator.torch_version=2.6.0"}),
     overlap({"emulator.torch_version=2.5.1"}),
     "error: emulator.torch_version: is 2.5.1; EP overlap needs torch >= 2.6\n"},
    {"overlap_with_pp_needs_vpp",
     overlap({"emulator.gpus_per_node=8", "model.pipeline_model_parallel_size=2",
              "model.virtual_pipeline_model_parallel_size=2"}),
     overlap({"emulator.gpus_per_node=8", "model.pipeline_model_parallel_size=2"}),
     "error: model.virtual_pipeline_model_parallel_size: must be set when "
     "pipeline_model_parallel_size > 1"},
    {"overlap_no_full_recompute", overlap({}), overlap({"model.recompute_granularity=full"}),
     "error: model.recompute_granularity: must not be full"},
    {"overlap_no_recompute_method", overlap({}), overlap({"model.recompute_method=uniform"}),
     "error: model.recompute_method: must be unset"},
    {"overlap_no_recompute_num_layers", overlap({}), overlap({"model.recompute_num_layers=1"}),
     "error: model.recompute_num_layers: must be unset"},
    {"overlap_no_moe_recompute", overlap({}),
     overlap({"model.recompute_granularity=selective", "model.recompute_modules=[moe]"}),
     "error: model.recompute_modules: must not contain moe"},
    {"overlap_no_shared_expert_overlap", overlap({}),
     overlap({"model.moe_shared_expert_overlap=true"}),
     "error: model.moe_shared_expert_overlap: must be false"},
    {"overlap_mtp_at_most_1", overlap({"model.mtp_num_layers=1"}),
     overlap({"model.mtp_num_layers=2"}), "error: model.mtp_num_layers: must be unset, 0 or 1"},
    // --- delay_wgrad_compute ---
    {"delay_needs_overlap",
     delayed({}),
     {"comm_overlap.delay_wgrad_compute=true"},
     "error: comm_overlap.overlap_moe_expert_parallel_comm: must be true for "
     "comm_overlap.delay_wgrad_compute\n"},
    {"delay_graph_attn_needs_ga_fusion",
     delayed({"model.cuda_graph_impl=transformer_engine", "model.cuda_graph_scope=[attn]",
              "model.gradient_accumulation_fusion=true"}),
     delayed({"model.cuda_graph_impl=transformer_engine", "model.cuda_graph_scope=[attn]"}),
     "error: model.gradient_accumulation_fusion: must be true when a CUDA graph holds a delayed "
     "wgrad (comm_overlap.py)\n"},
    // The router's scope holds a wgrad only beside a shared expert (the tiny recipe has one).
    {"delay_graph_router_with_shared_expert_needs_ga_fusion",
     delayed({"model.cuda_graph_impl=transformer_engine", "model.cuda_graph_scope=[moe_router]",
              "model.moe_shared_expert_intermediate_size=null"}),
     delayed({"model.cuda_graph_impl=transformer_engine", "model.cuda_graph_scope=[moe_router]"}),
     "error: model.gradient_accumulation_fusion: must be true"},
    {"delay_graph_attn_no_bias",
     delayed({"model.cuda_graph_impl=transformer_engine", "model.cuda_graph_scope=[attn]",
              "model.gradient_accumulation_fusion=true"}),
     delayed({"model.cuda_graph_impl=transformer_engine", "model.cuda_graph_scope=[attn]",
              "model.gradient_accumulation_fusion=true", "model.add_qkv_bias=true"}),
     "error: model.add_qkv_bias: must be false with the attn CUDA-graph scope and "
     "delay_wgrad_compute\n"},
    {"delay_te_2_7_with_ga_fusion",
     delayed({"model.gradient_accumulation_fusion=true", "emulator.te_version=2.7.0"}),
     delayed({"model.gradient_accumulation_fusion=true", "emulator.te_version=2.6"}),
     "error: emulator.te_version: is 2.6; delay_wgrad_compute with overlap_grad_reduce or "
     "gradient_accumulation_fusion needs TransformerEngine >= 2.7\n"},
    {"delay_te_2_10_with_te_graphs",
     delayed({"model.cuda_graph_impl=transformer_engine", "model.cuda_graph_scope=[moe_router]",
              "model.moe_shared_expert_intermediate_size=null", "emulator.te_version=2.10"}),
     delayed({"model.cuda_graph_impl=transformer_engine", "model.cuda_graph_scope=[moe_router]",
              "model.moe_shared_expert_intermediate_size=null", "emulator.te_version=2.9"}),
     "error: emulator.te_version: is 2.9; delay_wgrad_compute with "
     "cuda_graph_impl=transformer_engine needs TransformerEngine >= 2.10\n"},
    // 2.12 only where a graph holds the wgrad: not for a router graph without a shared expert.
    {"delay_te_2_12_only_with_the_wgrad_in_a_graph",
     delayed({"model.cuda_graph_impl=transformer_engine", "model.cuda_graph_scope=[moe_router]",
              "model.moe_shared_expert_intermediate_size=null", "emulator.te_version=2.11"}),
     delayed({"model.cuda_graph_impl=transformer_engine", "model.cuda_graph_scope=[attn]",
              "model.gradient_accumulation_fusion=true", "emulator.te_version=2.11"}),
     "error: emulator.te_version: is 2.11; needs TransformerEngine >= 2.12 when a CUDA graph "
     "holds a delayed wgrad (comm_overlap.py)\n"},
    {"overlap_graph_scope_not_mlp",
     overlap({"model.cuda_graph_impl=transformer_engine", "model.cuda_graph_scope=[attn]"}),
     overlap({"model.cuda_graph_impl=transformer_engine", "model.cuda_graph_scope=[mlp]"}),
     "error: model.cuda_graph_scope: mlp cannot be captured with "
     "comm_overlap.overlap_moe_expert_parallel_comm; use attn, moe_router and moe_preprocess\n"},
    {"early_attn_release_needs_overlap",
     overlap({"model.ep_overlap_early_attn_memory_release=true"}),
     {"model.ep_overlap_early_attn_memory_release=true"},
     "error: model.ep_overlap_early_attn_memory_release: needs "
     "comm_overlap.overlap_moe_expert_parallel_comm=true"},
    // Bridge's comm_overlap value overrides the ddp one: off there, no buckets to size.
    {"bucket_size_needs_overlap_grad_reduce",
     {"ddp.overlap_grad_reduce=true", "ddp.bucket_size=20000"},
     {"ddp.overlap_grad_reduce=true", "ddp.bucket_size=20000",
      "comm_overlap.overlap_grad_reduce=false"},
     "error: ddp.bucket_size: only means something with overlap_grad_reduce (Megatron makes one "
     "bucket without it); remove it or set ddp.overlap_grad_reduce: true\n"},
    {"max_inflight_offloads_zero_waits_for_each",
     {"model.fine_grained_activation_offloading=true", "model.offload_modules=[expert_fc1]",
      "model.max_inflight_offloads=0"},
     {"model.fine_grained_activation_offloading=true", "model.offload_modules=[expert_fc1]",
      "model.max_inflight_offloads=-1"},
     "error: model.max_inflight_offloads: must be 0 or more (0: wait for each offload; unset: "
     "never wait)\n"},
    // --- pipeline transfers (p2p_communication, schedules.py) ---
    {"p2p_keys_need_pp",
     {"comm_overlap.overlap_p2p_comm=false"},
     {"comm_overlap.batch_p2p_comm=true"},
     "error: comm_overlap.batch_p2p_comm: has no effect without pipeline parallelism"},
    {"p2p_overlap_and_batch_exclusive",
     {"emulator.gpus_per_node=8", "model.pipeline_model_parallel_size=2",
      "model.virtual_pipeline_model_parallel_size=2", "comm_overlap.overlap_p2p_comm=true"},
     {"emulator.gpus_per_node=8", "model.pipeline_model_parallel_size=2",
      "model.virtual_pipeline_model_parallel_size=2", "comm_overlap.batch_p2p_comm=true"},
     "error: comm_overlap.batch_p2p_comm: cannot be true with overlap_p2p_comm"},
    {"p2p_overlap_needs_vpp",
     {"emulator.gpus_per_node=8", "model.pipeline_model_parallel_size=2",
      "comm_overlap.batch_p2p_comm=false"},
     {"emulator.gpus_per_node=8", "model.pipeline_model_parallel_size=2",
      "comm_overlap.overlap_p2p_comm=true", "comm_overlap.batch_p2p_comm=false"},
     "error: comm_overlap.overlap_p2p_comm: needs the interleaved schedule"},
    {"p2p_overlap_with_ep_overlap_and_pp",
     overlap({"emulator.gpus_per_node=8", "model.pipeline_model_parallel_size=2",
              "model.virtual_pipeline_model_parallel_size=2"}),
     overlap({"emulator.gpus_per_node=8", "model.pipeline_model_parallel_size=2",
              "model.virtual_pipeline_model_parallel_size=2",
              "comm_overlap.overlap_p2p_comm=false"}),
     "error: comm_overlap.overlap_p2p_comm: must be true with EP overlap and PP > 1"},
    // --- the interleaved schedule's micro-batch groups ---
    {"microbatch_group_in_pp_to_m",
     {"emulator.gpus_per_node=8", "model.pipeline_model_parallel_size=2",
      "model.virtual_pipeline_model_parallel_size=2", "train.global_batch_size=20",
      "model.microbatch_group_size_per_vp_stage=3"},
     {"emulator.gpus_per_node=8", "model.pipeline_model_parallel_size=2",
      "model.virtual_pipeline_model_parallel_size=2", "model.microbatch_group_size_per_vp_stage=1"},
     "error: model.microbatch_group_size_per_vp_stage: the interleaved schedule needs PP <= "
     "microbatch_group_size_per_vp_stage <= M (micro-batches per rank M = 4, PP = 2, group 1)\n"},
    {"microbatch_last_group_at_least_pp",
     {"emulator.gpus_per_node=8", "model.pipeline_model_parallel_size=2",
      "model.virtual_pipeline_model_parallel_size=2", "model.microbatch_group_size_per_vp_stage=4"},
     {"emulator.gpus_per_node=8", "model.pipeline_model_parallel_size=2",
      "model.virtual_pipeline_model_parallel_size=2", "model.microbatch_group_size_per_vp_stage=3"},
     "error: model.microbatch_group_size_per_vp_stage: the interleaved schedule's last "
     "micro-batch group has 1, fewer than PP"},
    {"microbatch_group_needs_vpp",
     {},
     {"model.microbatch_group_size_per_vp_stage=2"},
     "error: model.microbatch_group_size_per_vp_stage: has no effect without "
     "virtual_pipeline_model_parallel_size; unset it\n"},
    // --- flex dispatcher ---
    {"flex_backend_without_flex_warns",
     {},
     {"model.moe_flex_dispatcher_backend=hybridep"},
     "warning: model.moe_flex_dispatcher_backend: does nothing unless moe_token_dispatcher_type "
     "is flex\n"},
    {"flex_hybridep_on_b200_and_shared_overlap_forced_off",
     {"model.moe_token_dispatcher_type=flex", "topology=topologies/dgx_b200.yaml",
      "model.moe_flex_dispatcher_backend=hybridep"},
     {"model.moe_token_dispatcher_type=flex", "model.moe_shared_expert_overlap=true"},
     "warning: model.moe_shared_expert_overlap: Megatron-Bridge's apply_flex_dispatcher_backend "
     "turns it off with flex (Megatron-Core itself allows it from r0.18)"},
    // --- offload ---
    {"offload_modules_not_empty",
     {"model.fine_grained_activation_offloading=true", "model.offload_modules=[moe_act]"},
     {"model.fine_grained_activation_offloading=true"},
     "error: model.offload_modules: is empty; fine_grained_activation_offloading needs the "
     "modules to offload"},
    {"offload_not_with_cpu_offloading",
     {},
     {"model.fine_grained_activation_offloading=true", "model.cpu_offloading=true"},
     "error: model.cpu_offloading: whole-layer cpu_offloading cannot be combined"},
    {"attn_proj_needs_core_attn",
     {"model.fine_grained_activation_offloading=true",
      "model.offload_modules=[core_attn,attn_proj]"},
     {"model.offload_modules=[attn_proj]"},
     "error: model.offload_modules: attn_proj needs core_attn offloaded too"},
    {"moe_recompute_blocks_expert_offload",
     {"model.recompute_granularity=selective", "model.recompute_modules=[moe]",
      "model.fine_grained_activation_offloading=true", "model.offload_modules=[attn_norm]"},
     {"model.recompute_modules=[moe]", "model.offload_modules=[moe_act]"},
     "error: model.offload_modules: moe_act cannot be offloaded while recompute_modules holds moe"},
    {"offload_fraction_in_unit_range",
     {"model.fine_grained_activation_offloading=true", "model.offload_modules=[expert_fc1]",
      "model.activation_offload_fraction=0.5"},
     {"model.fine_grained_activation_offloading=true", "model.offload_modules=[expert_fc1]",
      "model.activation_offload_fraction=1.5"},
     "error: model.activation_offload_fraction: must be in [0, 1]\n"},
    {"offload_sizes_not_negative",
     {"model.fine_grained_activation_offloading=true", "model.offload_modules=[expert_fc1]",
      "model.min_offloaded_tensor_size=0"},
     {"model.fine_grained_activation_offloading=true", "model.offload_modules=[expert_fc1]",
      "model.min_offloaded_tensor_size=-1"},
     "error: model.min_offloaded_tensor_size: must be 0 or more elements\n"},
    // No silent key: the offload engine's and recompute's settings without them.
    {"offload_settings_need_offload",
     {"model.fine_grained_activation_offloading=true", "model.offload_modules=[expert_fc1]",
      "model.max_inflight_offloads=2"},
     {"model.max_inflight_offloads=2"},
     "error: model.max_inflight_offloads: has no effect without "
     "model.fine_grained_activation_offloading: true; set that or unset this\n"},
    {"delta_offload_needs_pp",
     {"model.fine_grained_activation_offloading=true", "model.offload_modules=[expert_fc1]",
      "emulator.gpus_per_node=8", "model.pipeline_model_parallel_size=2",
      "model.delta_offload_bytes_across_pp_ranks=1024"},
     {"model.fine_grained_activation_offloading=true", "model.offload_modules=[expert_fc1]",
      "model.delta_offload_bytes_across_pp_ranks=1024"},
     "error: model.delta_offload_bytes_across_pp_ranks: has no effect with "
     "pipeline_model_parallel_size 1"},
    {"recompute_modules_need_selective",
     {"model.recompute_granularity=selective", "model.recompute_modules=[moe_act]"},
     {"model.recompute_modules=[moe_act]"},
     "error: model.recompute_modules: has no effect without recompute_granularity: selective"},
    {"recompute_method_is_for_full_recompute",
     {"model.recompute_granularity=selective"},
     {"model.recompute_granularity=selective", "model.recompute_method=uniform"},
     "error: model.recompute_method: applies to recompute_granularity: full only"},
    {"overlap_param_gather_needs_the_distributed_optimizer",
     {"ddp.use_distributed_optimizer=true", "ddp.overlap_grad_reduce=true",
      "ddp.overlap_param_gather=true"},
     {"ddp.overlap_grad_reduce=true", "ddp.overlap_param_gather=true"},
     "error: ddp.overlap_param_gather: needs the distributed optimizer; set "
     "ddp.use_distributed_optimizer: true"},
    {"overlap_param_gather_needs_overlap_grad_reduce",
     {"ddp.use_distributed_optimizer=true", "comm_overlap.overlap_grad_reduce=true",
      "comm_overlap.overlap_param_gather=true"},
     {"ddp.use_distributed_optimizer=true", "ddp.overlap_grad_reduce=true",
      "comm_overlap.overlap_grad_reduce=false", "comm_overlap.overlap_param_gather=true"},
     "error: comm_overlap.overlap_param_gather: needs overlap_grad_reduce"},
    {"bf16_grad_reduce_is_refused",
     {"ddp.grad_reduce_in_fp32=true"},
     {"ddp.grad_reduce_in_fp32=false"},
     "error: ddp.grad_reduce_in_fp32: false: a bf16 gradient reduction"},
    // --- recompute ---
    {"moe_act_recompute_needs_grouped_gemm",
     {"model.recompute_granularity=selective", "model.recompute_modules=[moe_act,layernorm]"},
     {"model.recompute_modules=[moe_act]", "model.moe_grouped_gemm=false"},
     "error: model.recompute_modules: moe_act recompute needs moe_grouped_gemm=true\n"},
    {"shared_experts_recompute_excludes_overlap",
     {"model.moe_shared_expert_overlap=true"},
     {"model.recompute_modules=[shared_experts]", "model.moe_shared_expert_overlap=true"},
     "error: model.moe_shared_expert_overlap: cannot be true with shared_experts in "
     "recompute_modules"},
    {"a2a_overlap_recompute_needs_overlap",
     {},
     {"model.recompute_modules=[a2a_overlap_attn]"},
     "error: model.recompute_modules: a2a_overlap_attn needs "
     "comm_overlap.overlap_moe_expert_parallel_comm=true\n"},
    {"a2a_overlap_recompute_needs_interleaving",
     {},
     overlap({"model.recompute_modules=[a2a_overlap_mlp]"}),
     "error: model.recompute_modules: a2a_overlap_mlp needs the interleaved 1F1B"},
    // --- layout ---
    {"world_divides",
     {"model.expert_model_parallel_size=2"},
     {"model.expert_model_parallel_size=3", "model.num_moe_experts=6"},
     "error: model.expert_model_parallel_size:"},
    {"layers_divide_pp_x_vpp",
     {"emulator.gpus_per_node=8", "model.pipeline_model_parallel_size=2"},
     {"emulator.gpus_per_node=8", "model.pipeline_model_parallel_size=2",
      "model.virtual_pipeline_model_parallel_size=4"},
     "error: model.num_layers: 4 layers do not divide into PP x VPP = 8 stages"},
    {"pipeline_layout_sums",
     {"emulator.gpus_per_node=8", "model.pipeline_model_parallel_size=2",
      "emulator.pipeline_layout=[3,1]"},
     {"emulator.gpus_per_node=8", "model.pipeline_model_parallel_size=2",
      "emulator.pipeline_layout=[3,2]"},
     "error: emulator.pipeline_layout: must list 2 non-negative layer counts"},
    {"experts_divide_ep",
     {"model.num_moe_experts=4", "model.moe_router_topk=2"},
     {"model.num_moe_experts=6"},
     "error: model.num_moe_experts: 6 experts do not divide over EP = 4"},
    {"global_batch_divides",
     {"train.global_batch_size=8"},
     {"train.global_batch_size=10"},
     "error: train.global_batch_size: 10 is not a multiple of micro_batch_size x DP = 1 x 4\n"},
    // A denormal timeout once reported every collective wait as a hang (the input fuzz target).
    {"watchdog_timeout_is_off_or_a_second",
     {"emulator.collective_timeout_s=0"},
     {"emulator.collective_timeout_s=1e-320"},
     "error: emulator.collective_timeout_s: must be 0 (no watchdog) or at least 1 s"},
    {"hardware_queues_in_cuda_range",
     {"emulator.cuda_device_max_connections=1"},
     {"emulator.cuda_device_max_connections=33"},
     "error: emulator.cuda_device_max_connections: must be between 1 and 32"},
    {"meta_needs_known_routing",
     {"emulator.mode=meta", "model.moe_router_force_load_balancing=true"},
     {"emulator.mode=meta"},
     "error: model.moe_router_force_load_balancing: meta mode has no logits to route on; set it "
     "to true (Megatron's random-logit balancing), or replay a router trace"},
    {"meta_skew_instead_of_forced",
     {"emulator.mode=meta", "model.moe_router_force_load_balancing=false",
      "emulator.routing_skew=1"},
     {"emulator.mode=meta", "model.moe_router_force_load_balancing=true",
      "emulator.routing_skew=1"},
     "error: emulator.routing_skew: replaces forced balancing"},
    {"routing_sources_are_meta_mode_only",
     {},
     {"emulator.routing_skew=1"},
     "error: emulator.routing_skew: is meta mode's routing; functional mode routes its own "
     "tokens"},
    {"routing_trace_and_skew_exclusive",
     {"emulator.mode=meta", "emulator.routing_skew=0.5"},
     {"emulator.mode=meta", "emulator.routing_skew=0.5", "emulator.routing_trace=/nonexistent"},
     "error: emulator.routing_skew: and routing_trace are exclusive"},
    {"routing_trace_must_exist",
     {"emulator.mode=meta", "model.moe_router_force_load_balancing=true"},
     {"emulator.mode=meta", "emulator.routing_trace=/nonexistent/trace.jsonl"},
     "error: emulator.routing_trace: /nonexistent/trace.jsonl: no such file or folder\n"},
    {"mla_up_proj_needs_mla",
     {"model.recompute_granularity=selective", "model.recompute_modules=[core_attn]"},
     {"model.recompute_granularity=selective", "model.recompute_modules=[mla_up_proj]"},
     "error: model.recompute_modules: mla_up_proj needs multi_latent_attention; remove it\n"},
    {"full_recompute_is_refused",
     {"model.recompute_granularity=selective"},
     {"model.recompute_granularity=full"},
     "error: model.recompute_granularity: full recompute (use selective with recompute_modules) is "
     "not modelled"},
    {"not_modelled_is_refused",
     {"model.context_parallel_size=2", "emulator.cuda_device_max_connections=1",
      "model.cp_comm_type=all_gather"},
     {"model.context_parallel_size=2", "emulator.cuda_device_max_connections=1",
      "model.cp_comm_type=a2a"},
     "error: model.cp_comm_type: cp_comm_type a2a (use p2p or all_gather) is not modelled by "
     "NodeEmu yet\n"},
    // --- context parallelism (Megatron's get_batch_on_this_cp_rank, TE's CP attention) ---
    {"cp_splits_each_sequence_into_2cp_chunks", cp2({"train.seq_length=72"}),
     cp2({"train.seq_length=70"}),
     "error: train.seq_length: must split into 2 x context_parallel_size = 4 chunks"},
    {"cp_needs_transformer_engine", cp2({}), cp2({"model.transformer_impl=local"}),
     "error: model.transformer_impl: must be transformer_engine with context_parallel_size 2"},
    {"cp_needs_fused_attention", cp2({"model.attention_backend=flash"}),
     cp2({"model.attention_backend=unfused"}),
     "error: model.attention_backend: cannot be unfused with context_parallel_size 2"},
    {"cp_with_mtp_is_refused", cp2({"model.mtp_num_layers=0"}), cp2({"model.mtp_num_layers=1"}),
     "error: model.mtp_num_layers: with context_parallel_size 2 is not modelled"},
    {"cp_seq_aux_loss_needs_one_sequence_per_micro_batch",
     cp2({"model.moe_router_load_balancing_type=seq_aux_loss"}),
     cp2({"model.moe_router_load_balancing_type=seq_aux_loss", "train.micro_batch_size=2"}),
     "error: model.moe_router_load_balancing_type: seq_aux_loss with context_parallel_size 2 is "
     "modelled with micro_batch_size 1 only"},
    {"cp_comm_type_needs_cp",
     {},
     {"model.cp_comm_type=p2p"},
     "warning: model.cp_comm_type: has no effect without context_parallel_size > 1, as in "
     "Megatron\n"},
    // Megatron ignores these (issue 54): a warning, not a refusal.
    {"cp_comm_type_a2a_at_cp_1_is_only_a_warning",
     {},
     {"model.cp_comm_type=a2a"},
     "warning: model.cp_comm_type: has no effect without context_parallel_size > 1"},
    {"pre_softmax_without_softmax_is_only_a_warning",
     {"model.moe_router_score_function=sigmoid"},
     {"model.moe_router_score_function=sigmoid", "model.moe_router_pre_softmax=true"},
     "warning: model.moe_router_pre_softmax: has no effect with moe_router_score_function "
     "sigmoid, as in Megatron"},
    {"cp_and_sp_split_each_ranks_positions",
     cp2({"model.tensor_model_parallel_size=4", "model.sequence_parallel=true",
          "model.num_query_groups=4", "model.expert_tensor_parallel_size=1",
          "emulator.gpus_per_node=8", "train.seq_length=72"}),
     cp2({"model.tensor_model_parallel_size=4", "model.sequence_parallel=true",
          "model.num_query_groups=4", "model.expert_tensor_parallel_size=1",
          "emulator.gpus_per_node=8", "train.seq_length=68"}),
     "error: train.seq_length: must split over context_parallel_size x tensor_model_parallel_size "
     "= 2 x 4"},
    // --- tensor and sequence parallelism (Megatron's validate_args and TransformerConfig) ---
    {"tp_needs_sequence_parallel",
     {"model.tensor_model_parallel_size=2", "model.sequence_parallel=true",
      "model.expert_tensor_parallel_size=1", "emulator.cuda_device_max_connections=1"},
     {"model.tensor_model_parallel_size=2", "model.expert_tensor_parallel_size=1",
      "emulator.cuda_device_max_connections=1"},
     "error: model.sequence_parallel: must be true with tensor_model_parallel_size > 1"},
    {"sequence_parallel_needs_tp",
     {},
     {"model.sequence_parallel=true"},
     "error: model.sequence_parallel: needs tensor_model_parallel_size > 1"},
    {"ep_overlap_with_pp_on_one_queue_is_refused",
     overlap({"emulator.gpus_per_node=8", "model.pipeline_model_parallel_size=2",
              "model.virtual_pipeline_model_parallel_size=2"}),
     overlap({"emulator.gpus_per_node=8", "model.pipeline_model_parallel_size=2",
              "model.virtual_pipeline_model_parallel_size=2",
              "emulator.cuda_device_max_connections=1"}),
     "error: emulator.cuda_device_max_connections: 1 with EP overlap and PP > 1 is not modelled"},
    {"tp_comm_overlap_below_tp2_is_turned_off",
     {},
     {"comm_overlap.tp_comm_overlap=true"},
     "warning: comm_overlap.tp_comm_overlap: off, as Megatron-Bridge turns it off: it needs "
     "tensor_model_parallel_size >= 2"},
    {"tp_before_blackwell_needs_one_hardware_queue",
     {"model.tensor_model_parallel_size=2", "model.sequence_parallel=true",
      "model.expert_tensor_parallel_size=1", "emulator.cuda_device_max_connections=1"},
     {"model.tensor_model_parallel_size=2", "model.sequence_parallel=true",
      "model.expert_tensor_parallel_size=1"},
     "error: emulator.cuda_device_max_connections: must be 1 with TP or CP > 1 on"},
    {"tp_comm_overlap_is_refused_where_bridge_keeps_it",
     {"model.tensor_model_parallel_size=2", "model.sequence_parallel=true",
      "model.expert_tensor_parallel_size=1", "emulator.cuda_device_max_connections=1"},
     {"comm_overlap.tp_comm_overlap=true", "model.tensor_model_parallel_size=2",
      "model.sequence_parallel=true", "model.expert_tensor_parallel_size=1"},
     "error: comm_overlap.tp_comm_overlap: TP communication overlap (Transformer Engine's "
     "userbuffers; set it false) is not modelled"},
    {"expert_tp_needs_the_alltoall_dispatcher",
     {"model.expert_tensor_parallel_size=2", "model.expert_model_parallel_size=2"},
     {"model.expert_tensor_parallel_size=2", "model.expert_model_parallel_size=2",
      "model.moe_token_dispatcher_type=allgather"},
     "error: model.expert_tensor_parallel_size: > 1 is modelled with the alltoall dispatcher only"},
    {"unset_expert_tp_follows_tp",
     {"model.tensor_model_parallel_size=2", "model.sequence_parallel=true",
      "model.expert_model_parallel_size=2", "emulator.cuda_device_max_connections=1"},
     {"model.tensor_model_parallel_size=2", "model.sequence_parallel=true",
      "model.expert_model_parallel_size=2", "model.moe_token_dispatcher_type=allgather",
      "emulator.cuda_device_max_connections=1"},
     "error: model.expert_tensor_parallel_size: > 1 is modelled with the alltoall dispatcher only"},
    {"expert_tp_splits_the_expert_columns",
     {"model.expert_tensor_parallel_size=2", "model.expert_model_parallel_size=2"},
     {"model.expert_tensor_parallel_size=2", "model.expert_model_parallel_size=2",
      "model.moe_ffn_hidden_size=47"},
     "error: model.moe_ffn_hidden_size: 47 does not split over expert_tensor_parallel_size 2"},
    {"tp_splits_whole_query_groups",
     {"model.tensor_model_parallel_size=2", "model.sequence_parallel=true",
      "model.expert_tensor_parallel_size=1", "emulator.cuda_device_max_connections=1"},
     {"model.tensor_model_parallel_size=4", "model.sequence_parallel=true",
      "model.expert_tensor_parallel_size=1", "emulator.cuda_device_max_connections=1"},
     "error: model.num_query_groups: 2 does not split over tensor_model_parallel_size 4"},
    {"sequence_parallel_splits_the_tokens",
     {"model.tensor_model_parallel_size=2", "model.sequence_parallel=true",
      "model.expert_tensor_parallel_size=1", "train.seq_length=62",
      "emulator.cuda_device_max_connections=1"},
     {"model.tensor_model_parallel_size=2", "model.sequence_parallel=true",
      "model.expert_tensor_parallel_size=1", "train.seq_length=63",
      "emulator.cuda_device_max_connections=1"},
     "error: train.seq_length: must split over tensor_model_parallel_size = 2"},
};

INSTANTIATE_TEST_SUITE_P(Validate, Rules, ::testing::ValuesIn(kRules),
                         [](const auto& param_info) { return std::string(param_info.param.name); });

TEST(Validate, DeepEpOnAnUnsupportedGpuIsAValidateErrorAndAnApplyFallback) {
  // A100 is sm80 (allowed); make an sm100 part that is not a B200/B300 by name.
  Recipe r =
      tiny({"model.moe_token_dispatcher_type=flex", "model.moe_flex_dispatcher_backend=deepep"});
  GpuSpec gpu = load_topology(r)->gpu;
  gpu.name = "GB-future";
  gpu.cc_major = 10;
  std::ostringstream os;
  print_findings(validate(r, gpu, 4), os);
  EXPECT_NE(os.str().find("error: model.moe_flex_dispatcher_backend: DeepEP needs compute "
                          "capability 8.x or 9.x (or an NVIDIA B200/B300), and GB-future is 10.0"),
            std::string::npos)
      << os.str();
  // Bridge matches the name's prefix: a B200 passes, a GB200 (also sm100) does not.
  for (auto [name, ok] : {std::pair{"B200-SXM-180GB", true}, std::pair{"GB200-NVL72", false},
                          std::pair{"B300-SXM", true}}) {
    GpuSpec g = gpu;
    g.name = name;
    EXPECT_EQ(has_errors(validate(r, g, 4)), !ok) << name;
  }
  const auto warnings = apply_flex_dispatcher_backend(r, gpu);
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_EQ(warnings[0].level, Finding::Level::Warning);
  EXPECT_NE(warnings[0].message.find("falling back to the alltoall dispatcher"), std::string::npos);
  EXPECT_EQ(r.text("model.moe_token_dispatcher_type"), "alltoall");
  EXPECT_FALSE(has_errors(validate(r, gpu, 4)));
  // HybridEP runs on sm100; sm120 it does not.
  Recipe h =
      tiny({"model.moe_token_dispatcher_type=flex", "model.moe_flex_dispatcher_backend=hybridep"});
  EXPECT_FALSE(has_errors(validate(h, gpu, 4)));
  gpu.cc_major = 12;
  EXPECT_TRUE(has_errors(validate(h, gpu, 4)));
}

TEST(Validate, VersionsCompareNumerically) {
  EXPECT_TRUE(version_at_least("2.10.0", "2.6"));
  EXPECT_TRUE(version_at_least("2.6.0a0+git1234", "2.6"));
  EXPECT_FALSE(version_at_least("2.5.1", "2.6"));
  EXPECT_TRUE(version_at_least("", "2.6"));  // unstated = new enough
  EXPECT_FALSE(version_at_least("2.11", "2.12"));
}

}  // namespace
}  // namespace nodeemu::emu
