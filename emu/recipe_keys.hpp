// The name of every recipe key, defined once: the schema (emu/recipe_schema.cpp) is built from
// these, and code that names a key (validate's rules, the plan builder, error messages) uses the
// constant, so that a misspelt key is a compile error rather than a lookup that aborts at run
// time. The key's type, default and help are in the schema.
#pragma once

namespace nodeemu::emu::key {

// top level
inline constexpr const char* topology = "topology";
inline constexpr const char* nodes = "nodes";
inline constexpr const char* description = "description";

// model.*
inline constexpr const char* model_num_layers = "model.num_layers";
inline constexpr const char* model_hidden_size = "model.hidden_size";
inline constexpr const char* model_num_attention_heads = "model.num_attention_heads";
inline constexpr const char* model_num_query_groups = "model.num_query_groups";
inline constexpr const char* model_kv_channels = "model.kv_channels";
inline constexpr const char* model_ffn_hidden_size = "model.ffn_hidden_size";
inline constexpr const char* model_vocab_size = "model.vocab_size";
inline constexpr const char* model_rotary_base = "model.rotary_base";
inline constexpr const char* model_layernorm_epsilon = "model.layernorm_epsilon";
inline constexpr const char* model_init_method_std = "model.init_method_std";
inline constexpr const char* model_bf16 = "model.bf16";
inline constexpr const char* model_fp16 = "model.fp16";
inline constexpr const char* model_add_bias_linear = "model.add_bias_linear";
inline constexpr const char* model_qk_layernorm = "model.qk_layernorm";
inline constexpr const char* model_add_qkv_bias = "model.add_qkv_bias";
inline constexpr const char* model_multi_latent_attention = "model.multi_latent_attention";
inline constexpr const char* model_q_lora_rank = "model.q_lora_rank";
inline constexpr const char* model_kv_lora_rank = "model.kv_lora_rank";
inline constexpr const char* model_qk_head_dim = "model.qk_head_dim";
inline constexpr const char* model_qk_pos_emb_head_dim = "model.qk_pos_emb_head_dim";
inline constexpr const char* model_v_head_dim = "model.v_head_dim";
inline constexpr const char* model_rope_type = "model.rope_type";
inline constexpr const char* model_rotary_scaling_factor = "model.rotary_scaling_factor";
inline constexpr const char* model_mscale = "model.mscale";
inline constexpr const char* model_mscale_all_dim = "model.mscale_all_dim";
inline constexpr const char* model_original_max_position_embeddings =
    "model.original_max_position_embeddings";
inline constexpr const char* model_beta_fast = "model.beta_fast";
inline constexpr const char* model_beta_slow = "model.beta_slow";
inline constexpr const char* model_gradient_accumulation_fusion =
    "model.gradient_accumulation_fusion";
inline constexpr const char* model_transformer_impl = "model.transformer_impl";
inline constexpr const char* model_attention_backend = "model.attention_backend";
inline constexpr const char* model_moe_permute_fusion = "model.moe_permute_fusion";
inline constexpr const char* model_bias_activation_fusion = "model.bias_activation_fusion";
inline constexpr const char* model_apply_rope_fusion = "model.apply_rope_fusion";
inline constexpr const char* model_num_moe_experts = "model.num_moe_experts";
inline constexpr const char* model_moe_ffn_hidden_size = "model.moe_ffn_hidden_size";
inline constexpr const char* model_moe_shared_expert_intermediate_size =
    "model.moe_shared_expert_intermediate_size";
inline constexpr const char* model_moe_layer_freq = "model.moe_layer_freq";
inline constexpr const char* model_moe_router_topk = "model.moe_router_topk";
inline constexpr const char* model_moe_router_score_function = "model.moe_router_score_function";
inline constexpr const char* model_moe_router_pre_softmax = "model.moe_router_pre_softmax";
inline constexpr const char* model_moe_router_dtype = "model.moe_router_dtype";
inline constexpr const char* model_moe_router_num_groups = "model.moe_router_num_groups";
inline constexpr const char* model_moe_router_group_topk = "model.moe_router_group_topk";
inline constexpr const char* model_moe_router_topk_scaling_factor =
    "model.moe_router_topk_scaling_factor";
inline constexpr const char* model_moe_router_enable_expert_bias =
    "model.moe_router_enable_expert_bias";
inline constexpr const char* model_moe_router_bias_update_rate =
    "model.moe_router_bias_update_rate";
inline constexpr const char* model_moe_router_load_balancing_type =
    "model.moe_router_load_balancing_type";
inline constexpr const char* model_moe_aux_loss_coeff = "model.moe_aux_loss_coeff";
inline constexpr const char* model_moe_z_loss_coeff = "model.moe_z_loss_coeff";
inline constexpr const char* model_moe_expert_capacity_factor = "model.moe_expert_capacity_factor";
inline constexpr const char* model_moe_token_drop_policy = "model.moe_token_drop_policy";
inline constexpr const char* model_moe_pad_expert_input_to_capacity =
    "model.moe_pad_expert_input_to_capacity";
inline constexpr const char* model_moe_router_force_load_balancing =
    "model.moe_router_force_load_balancing";
inline constexpr const char* model_moe_token_dispatcher_type = "model.moe_token_dispatcher_type";
inline constexpr const char* model_moe_flex_dispatcher_backend =
    "model.moe_flex_dispatcher_backend";
inline constexpr const char* model_moe_flex_dispatcher_num_sms =
    "model.moe_flex_dispatcher_num_sms";
inline constexpr const char* model_moe_expert_rank_capacity_factor =
    "model.moe_expert_rank_capacity_factor";
inline constexpr const char* model_moe_permute_fusion_into_hybridep =
    "model.moe_permute_fusion_into_hybridep";
inline constexpr const char* model_moe_hybridep_num_sms_preprocessing =
    "model.moe_hybridep_num_sms_preprocessing";
inline constexpr const char* model_moe_deepep_num_sms = "model.moe_deepep_num_sms";
inline constexpr const char* model_moe_hybridep_num_sms = "model.moe_hybridep_num_sms";
inline constexpr const char* model_moe_shared_expert_overlap = "model.moe_shared_expert_overlap";
inline constexpr const char* model_moe_grouped_gemm = "model.moe_grouped_gemm";
inline constexpr const char* model_mtp_num_layers = "model.mtp_num_layers";
inline constexpr const char* model_mtp_loss_scaling_factor = "model.mtp_loss_scaling_factor";
inline constexpr const char* model_high_priority_a2a_comm_stream =
    "model.high_priority_a2a_comm_stream";
inline constexpr const char* model_ep_overlap_early_attn_memory_release =
    "model.ep_overlap_early_attn_memory_release";
inline constexpr const char* model_tensor_model_parallel_size = "model.tensor_model_parallel_size";
inline constexpr const char* model_sequence_parallel = "model.sequence_parallel";
inline constexpr const char* model_pipeline_model_parallel_size =
    "model.pipeline_model_parallel_size";
inline constexpr const char* model_virtual_pipeline_model_parallel_size =
    "model.virtual_pipeline_model_parallel_size";
inline constexpr const char* model_num_layers_in_first_pipeline_stage =
    "model.num_layers_in_first_pipeline_stage";
inline constexpr const char* model_num_layers_in_last_pipeline_stage =
    "model.num_layers_in_last_pipeline_stage";
inline constexpr const char* model_microbatch_group_size_per_vp_stage =
    "model.microbatch_group_size_per_vp_stage";
inline constexpr const char* model_context_parallel_size = "model.context_parallel_size";
inline constexpr const char* model_cp_comm_type = "model.cp_comm_type";
inline constexpr const char* model_expert_model_parallel_size = "model.expert_model_parallel_size";
inline constexpr const char* model_expert_tensor_parallel_size =
    "model.expert_tensor_parallel_size";
inline constexpr const char* model_recompute_granularity = "model.recompute_granularity";
inline constexpr const char* model_recompute_method = "model.recompute_method";
inline constexpr const char* model_recompute_num_layers = "model.recompute_num_layers";
inline constexpr const char* model_recompute_modules = "model.recompute_modules";
inline constexpr const char* model_cuda_graph_impl = "model.cuda_graph_impl";
inline constexpr const char* model_cuda_graph_scope = "model.cuda_graph_scope";
inline constexpr const char* model_cpu_offloading = "model.cpu_offloading";
inline constexpr const char* model_fine_grained_activation_offloading =
    "model.fine_grained_activation_offloading";
inline constexpr const char* model_offload_modules = "model.offload_modules";
inline constexpr const char* model_offload_tensors = "model.offload_tensors";
inline constexpr const char* model_activation_offload_fraction =
    "model.activation_offload_fraction";
inline constexpr const char* model_min_offloaded_tensor_size = "model.min_offloaded_tensor_size";
inline constexpr const char* model_max_inflight_offloads = "model.max_inflight_offloads";
inline constexpr const char* model_delta_offload_bytes_across_pp_ranks =
    "model.delta_offload_bytes_across_pp_ranks";

// comm_overlap.*
inline constexpr const char* comm_overlap_overlap_moe_expert_parallel_comm =
    "comm_overlap.overlap_moe_expert_parallel_comm";
inline constexpr const char* comm_overlap_delay_wgrad_compute = "comm_overlap.delay_wgrad_compute";
inline constexpr const char* comm_overlap_tp_comm_overlap = "comm_overlap.tp_comm_overlap";
inline constexpr const char* comm_overlap_overlap_grad_reduce = "comm_overlap.overlap_grad_reduce";
inline constexpr const char* comm_overlap_overlap_param_gather =
    "comm_overlap.overlap_param_gather";
inline constexpr const char* comm_overlap_overlap_p2p_comm = "comm_overlap.overlap_p2p_comm";
inline constexpr const char* comm_overlap_batch_p2p_comm = "comm_overlap.batch_p2p_comm";

// train.*
inline constexpr const char* train_global_batch_size = "train.global_batch_size";
inline constexpr const char* train_micro_batch_size = "train.micro_batch_size";
inline constexpr const char* train_seq_length = "train.seq_length";
inline constexpr const char* train_train_iters = "train.train_iters";

// ddp.*
inline constexpr const char* ddp_overlap_grad_reduce = "ddp.overlap_grad_reduce";
inline constexpr const char* ddp_bucket_size = "ddp.bucket_size";
inline constexpr const char* ddp_overlap_param_gather = "ddp.overlap_param_gather";
inline constexpr const char* ddp_use_distributed_optimizer = "ddp.use_distributed_optimizer";
inline constexpr const char* ddp_grad_reduce_in_fp32 = "ddp.grad_reduce_in_fp32";

// optimizer.*
inline constexpr const char* optimizer_optimizer = "optimizer.optimizer";
inline constexpr const char* optimizer_lr = "optimizer.lr";
inline constexpr const char* optimizer_weight_decay = "optimizer.weight_decay";
inline constexpr const char* optimizer_adam_beta1 = "optimizer.adam_beta1";
inline constexpr const char* optimizer_adam_beta2 = "optimizer.adam_beta2";
inline constexpr const char* optimizer_adam_eps = "optimizer.adam_eps";
inline constexpr const char* optimizer_clip_grad = "optimizer.clip_grad";

// emulator.*
inline constexpr const char* emulator_mode = "emulator.mode";
inline constexpr const char* emulator_seed = "emulator.seed";
inline constexpr const char* emulator_bindpcie = "emulator.bindpcie";
inline constexpr const char* emulator_cuda_device_max_connections =
    "emulator.cuda_device_max_connections";
inline constexpr const char* emulator_torch_version = "emulator.torch_version";
inline constexpr const char* emulator_te_version = "emulator.te_version";
inline constexpr const char* emulator_warmup_iterations = "emulator.warmup_iterations";
inline constexpr const char* emulator_routing_trace = "emulator.routing_trace";
inline constexpr const char* emulator_routing_skew = "emulator.routing_skew";
inline constexpr const char* emulator_pipeline_layout = "emulator.pipeline_layout";
inline constexpr const char* emulator_gpus_per_node = "emulator.gpus_per_node";
inline constexpr const char* emulator_workers_per_device = "emulator.workers_per_device";
inline constexpr const char* emulator_thread_budget = "emulator.thread_budget";
inline constexpr const char* emulator_collective_timeout_s = "emulator.collective_timeout_s";
inline constexpr const char* emulator_ranks = "emulator.ranks";
inline constexpr const char* emulator_argument_defaults = "emulator.argument_defaults";

}  // namespace nodeemu::emu::key
