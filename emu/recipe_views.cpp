#include "emu/recipe_views.hpp"

#include <numeric>

#include "devices/errors.hpp"
#include "emu/cli.hpp"
#include "emu/recipe_keys.hpp"
#include "emu/routing_trace.hpp"

namespace nodeemu::emu {

std::shared_ptr<const NodeTopology> load_topology(const Recipe& r) {
  auto t = std::make_shared<NodeTopology>(
      r.is_set(key::topology)
          ? NodeTopology::from_file(r.resolve(r.text(key::topology)))
          : NodeTopology::from_yaml(embedded_default_topology(), "dgx_h100.yaml"));
  if (r.is_set(key::emulator_gpus_per_node)) {
    const int n = r.int32(key::emulator_gpus_per_node);
    if (n < 1 || n > t->gpus)
      throw ConfigError(
          r.name(), key::emulator_gpus_per_node,
          "must be between 1 and the topology's " + std::to_string(t->gpus) + " GPUs per node");
    // The first n GPUs keep their NUMA placement and NICs.
    t->gpus = n;
    t->host.gpu_numa.resize(static_cast<std::size_t>(n));
    t->nic.per_node = std::min(t->nic.per_node, n);
  }
  return t;
}

NodeOptions node_options(const Recipe& r) {
  NodeOptions o;
  o.topology = load_topology(r);
  o.nodes = r.int32(key::nodes);
  o.mode = r.text(key::emulator_mode) == "meta" ? Mode::Meta : Mode::Functional;
  o.cuda_device_max_connections = r.int32(key::emulator_cuda_device_max_connections);
  o.thread_budget = r.int32(key::emulator_thread_budget);
  o.workers_per_device = r.int32(key::emulator_workers_per_device);
  o.collective_timeout_s = r.real(key::emulator_collective_timeout_s);
  o.bindpcie = r.flag(key::emulator_bindpcie);
  return o;
}

std::optional<offload::OffloadConfig> offload_config(const Recipe& r, int pp_rank) {
  if (!r.flag(key::model_fine_grained_activation_offloading)) return std::nullopt;
  offload::OffloadConfig c;
  if (r.is_set(key::model_offload_modules)) c.modules = r.list(key::model_offload_modules);
  if (r.is_set(key::model_offload_tensors)) c.tensors = r.list(key::model_offload_tensors);
  c.min_tensor_elements = r.integer(key::model_min_offloaded_tensor_size);
  c.fraction = r.real(key::model_activation_offload_fraction);
  if (r.is_set(key::model_max_inflight_offloads))
    c.max_inflight = r.int32(key::model_max_inflight_offloads);
  c.delta_bytes_across_pp_ranks = r.integer(key::model_delta_offload_bytes_across_pp_ranks);
  c.pp_rank = pp_rank;
  // Chunk v of this rank is virtual stage v x PP + pp_rank.
  const std::vector<int> stages = layers_per_virtual_stage(r);
  const int pp = pipeline_size(r);
  for (int v = 0; v < virtual_chunks(r); ++v) {
    const int stage = v * pp + pp_rank;
    if (stage < int(stages.size()))
      c.chunk_first_layers.push_back(std::accumulate(stages.begin(), stages.begin() + stage, 0));
  }
  return c;
}

layers::RecomputeSet recompute_set(const Recipe& r) {
  if (r.text(key::model_recompute_granularity) != "selective") return {};
  try {
    // Megatron's default modules for selective recompute: core_attn.
    return layers::RecomputeSet::from_modules(r.is_set(key::model_recompute_modules)
                                                  ? r.list(key::model_recompute_modules)
                                                  : std::vector<std::string>{"core_attn"});
  } catch (const UsageError& e) {
    throw ConfigError(r.name(), key::model_recompute_modules, e.what());
  }
}

bool has_memory_savers(const Recipe& r) {
  return r.flag(key::model_fine_grained_activation_offloading) || recompute_set(r).any();
}

Recipe without_memory_savers(const Recipe& r) {
  Recipe base = r;
  base.set(std::string(key::model_fine_grained_activation_offloading) + "=false");
  base.set(std::string(key::model_recompute_granularity) + "=null");
  base.set(std::string(key::model_recompute_modules) + "=null");
  return base;
}

CudaGraphs cuda_graphs(const Recipe& r) {
  CudaGraphs g;
  const std::string& impl = r.text(key::model_cuda_graph_impl);
  if (impl == "none") return g;
  const auto has = [&](const char* s) {
    return r.is_set(key::model_cuda_graph_scope) && r.list_has(key::model_cuda_graph_scope, s);
  };
  g.full_iteration = has("full_iteration");
  if (g.full_iteration) return g;
  // An unset scope captures whole layers (Megatron's "full" scope: TransformerLayer's
  // _te_cuda_graph_capture over every submodule).
  const bool whole = !r.is_set(key::model_cuda_graph_scope);
  layers::GraphScopes& l = g.layer;
  l.attn = whole || has("attn");
  l.mlp = whole || has("mlp");
  l.moe = whole || has("moe");
  l.moe_router = has("moe_router");
  l.moe_preprocess = has("moe_preprocess");
  return g;
}

layers::ModelConfig model_config(const Recipe& r, const GpuSpec& gpu) {
  using namespace layers;
  ModelConfig c;
  auto opt_int = [&](const std::string& key, int fallback) {
    return r.is_set(key) ? r.int32(key) : fallback;
  };
  c.num_layers = r.int32(key::model_num_layers);
  c.hidden_size = r.int32(key::model_hidden_size);
  c.num_attention_heads = r.int32(key::model_num_attention_heads);
  c.num_query_groups = opt_int(key::model_num_query_groups, c.num_attention_heads);
  c.kv_channels = opt_int(key::model_kv_channels, 0);
  c.ffn_hidden_size = opt_int(key::model_ffn_hidden_size, 4 * c.hidden_size);
  c.vocab_size = r.int32(key::model_vocab_size);
  c.rotary.base = r.real(key::model_rotary_base);
  c.multi_latent_attention = r.flag(key::model_multi_latent_attention);
  c.q_lora_rank = opt_int(key::model_q_lora_rank, c.q_lora_rank);
  c.kv_lora_rank = opt_int(key::model_kv_lora_rank, c.kv_lora_rank);
  c.qk_head_dim = opt_int(key::model_qk_head_dim, c.qk_head_dim);
  c.qk_pos_emb_head_dim = opt_int(key::model_qk_pos_emb_head_dim, c.qk_pos_emb_head_dim);
  c.v_head_dim = opt_int(key::model_v_head_dim, c.v_head_dim);
  c.rotary.yarn = r.is_set(key::model_rope_type) ? r.text(key::model_rope_type) == "yarn"
                                                 : c.multi_latent_attention;
  auto opt_real = [&](const std::string& key, double& v) {
    if (r.is_set(key)) v = r.real(key);
  };
  opt_real(key::model_rotary_scaling_factor, c.rotary.scaling_factor);
  opt_real(key::model_mscale, c.rotary.mscale);
  opt_real(key::model_mscale_all_dim, c.rotary.mscale_all_dim);
  if (r.is_set(key::model_original_max_position_embeddings))
    c.rotary.original_max_position_embeddings =
        r.int32(key::model_original_max_position_embeddings);
  opt_real(key::model_beta_fast, c.rotary.beta_fast);
  opt_real(key::model_beta_slow, c.rotary.beta_slow);
  c.layernorm_epsilon = r.real(key::model_layernorm_epsilon);
  c.init_method_std = r.real(key::model_init_method_std);
  c.dtype = r.flag(key::model_bf16)   ? DType::BF16
            : r.flag(key::model_fp16) ? DType::F16
                                      : DType::F32;
  c.num_moe_experts = opt_int(key::model_num_moe_experts, 0);
  c.moe_ffn_hidden_size = opt_int(key::model_moe_ffn_hidden_size, c.ffn_hidden_size);
  c.moe_shared_expert_intermediate_size =
      opt_int(key::model_moe_shared_expert_intermediate_size, 0);
  c.moe_layer_freq = r.int_list(key::model_moe_layer_freq);
  c.mtp_num_layers = opt_int(key::model_mtp_num_layers, 0);
  c.mtp_loss_scaling_factor = r.real(key::model_mtp_loss_scaling_factor);
  c.qk_layernorm = r.flag(key::model_qk_layernorm);
  c.tensor_model_parallel_size = r.int32(key::model_tensor_model_parallel_size);
  c.sequence_parallel = r.flag(key::model_sequence_parallel);
  c.context_parallel_size = r.int32(key::model_context_parallel_size);
  c.cp_comm_type =
      r.text(key::model_cp_comm_type) == "all_gather" ? CpCommType::AllGather : CpCommType::P2P;
  // Unset, Megatron makes expert TP equal to TP.
  c.expert_tensor_parallel_size =
      opt_int(key::model_expert_tensor_parallel_size, c.tensor_model_parallel_size);
  const std::string& d = r.text(key::model_moe_token_dispatcher_type);
  c.moe_token_dispatcher_type = d == "alltoall" ? DispatcherType::AllToAll
                                : d == "flex"   ? DispatcherType::Flex
                                                : DispatcherType::AllGather;
  c.moe_flex_dispatcher_backend = r.text(key::model_moe_flex_dispatcher_backend) == "hybridep"
                                      ? FlexBackend::HybridEP
                                      : FlexBackend::DeepEP;
  // Megatron's TransformerConfig.__post_init__ copies a deprecated knob into the new one
  // (validate refuses the two deprecated ones disagreeing).
  c.moe_flex_dispatcher_num_sms =
      opt_int(key::model_moe_flex_dispatcher_num_sms,
              opt_int(key::model_moe_deepep_num_sms, opt_int(key::model_moe_hybridep_num_sms, 0)));
  c.moe_hybridep_num_sms_preprocessing = opt_int(key::model_moe_hybridep_num_sms_preprocessing, 0);
  if (r.is_set(key::model_moe_expert_rank_capacity_factor))
    c.moe_expert_rank_capacity_factor = r.real(key::model_moe_expert_rank_capacity_factor);
  RouterConfig& rc = c.router;
  rc.num_experts = c.num_moe_experts;
  rc.topk = r.int32(key::model_moe_router_topk);
  rc.score = r.text(key::model_moe_router_score_function) == "sigmoid" ? ScoreFunction::Sigmoid
                                                                       : ScoreFunction::Softmax;
  rc.pre_softmax = r.flag(key::model_moe_router_pre_softmax);
  rc.num_groups = opt_int(key::model_moe_router_num_groups, 0);
  rc.group_topk = opt_int(key::model_moe_router_group_topk, 0);
  if (r.is_set(key::model_moe_router_topk_scaling_factor))
    rc.topk_scaling_factor = r.real(key::model_moe_router_topk_scaling_factor);
  rc.enable_expert_bias = r.flag(key::model_moe_router_enable_expert_bias);
  rc.bias_update_rate = r.real(key::model_moe_router_bias_update_rate);
  const std::string& lb = r.text(key::model_moe_router_load_balancing_type);
  rc.load_balancing = lb == "none"           ? LoadBalancing::None
                      : lb == "seq_aux_loss" ? LoadBalancing::SeqAuxLoss
                                             : LoadBalancing::AuxLoss;
  rc.aux_loss_coeff = r.real(key::model_moe_aux_loss_coeff);
  rc.z_loss_coeff =
      r.is_set(key::model_moe_z_loss_coeff) ? r.real(key::model_moe_z_loss_coeff) : 0.0;
  if (r.is_set(key::model_moe_expert_capacity_factor))
    rc.capacity_factor = r.real(key::model_moe_expert_capacity_factor);
  rc.drop_policy = r.text(key::model_moe_token_drop_policy) == "position" ? DropPolicy::Position
                                                                          : DropPolicy::Probs;
  rc.pad_to_capacity = r.flag(key::model_moe_pad_expert_input_to_capacity);
  rc.force_load_balancing = r.flag(key::model_moe_router_force_load_balancing);

  KernelChoices& k = c.kernels;
  k.transformer_engine = r.text(key::model_transformer_impl) == "transformer_engine";
  const std::string& ab = r.text(key::model_attention_backend);
  // The local spec's core attention is DotProductAttention whatever the backend key says.
  if (!k.transformer_engine || ab == "unfused" || ab == "local")
    k.attention = CoreAttention::Unfused;
  else if (ab == "flash" || (ab == "auto" && gpu.cc_major < 9))
    k.attention = CoreAttention::Flash;
  else
    k.attention = CoreAttention::Cudnn;
  k.permute_fusion = r.flag(key::model_moe_permute_fusion);
  k.grouped_gemm = r.flag(key::model_moe_grouped_gemm);  // the local spec's refusal: validate()
  k.bias_activation_fusion = r.flag(key::model_bias_activation_fusion);
  k.rope_fusion = r.flag(key::model_apply_rope_fusion);
  k.gradient_accumulation_fusion = r.flag(key::model_gradient_accumulation_fusion);
  k.router_fp32 = r.is_set(key::model_moe_router_dtype);  // its one choice: fp32
  return c;
}

ParallelLayout parallel_layout(const Recipe& r, int world) {
  ParallelLayout l;
  l.world = world;
  l.tp = r.int32(key::model_tensor_model_parallel_size);
  l.cp = r.int32(key::model_context_parallel_size);
  l.ep = r.int32(key::model_expert_model_parallel_size);
  l.pp = r.int32(key::model_pipeline_model_parallel_size);
  l.etp = r.is_set(key::model_expert_tensor_parallel_size)
              ? r.int32(key::model_expert_tensor_parallel_size)
              : 0;
  return l;
}

int pipeline_size(const Recipe& r) {
  return r.int32(key::model_pipeline_model_parallel_size);
}

int virtual_chunks(const Recipe& r) {
  return r.is_set(key::model_virtual_pipeline_model_parallel_size)
             ? r.int32(key::model_virtual_pipeline_model_parallel_size)
             : 1;
}

Priority comm_stream_priority(const Recipe& r) {
  return r.flag(key::model_high_priority_a2a_comm_stream) ? Priority::High : Priority::Normal;
}

int microbatch_group_size(const Recipe& r) {
  return r.is_set(key::model_microbatch_group_size_per_vp_stage)
             ? r.int32(key::model_microbatch_group_size_per_vp_stage)
             : pipeline_size(r);  // ModelParallelConfig.__post_init__'s default
}

std::vector<int> layers_per_virtual_stage(const Recipe& r) {
  const int stages = pipeline_size(r) * virtual_chunks(r);
  const int layers = r.int32(key::model_num_layers);
  if (r.is_set(key::emulator_pipeline_layout)) {
    std::vector<int> l = r.int_list(key::emulator_pipeline_layout);
    if (int(l.size()) != stages || std::accumulate(l.begin(), l.end(), 0) != layers) return {};
    for (int n : l)
      if (n < 0) return {};
    return l;
  }
  const char* first_key = key::model_num_layers_in_first_pipeline_stage;
  const char* last_key = key::model_num_layers_in_last_pipeline_stage;
  if (r.is_set(first_key) || r.is_set(last_key)) {
    // transformer_block.py get_num_layers_to_build: the first (last) PP rank holds the given
    // count over all its virtual stages, the other ranks share the rest evenly, and each rank's
    // count divides over its virtual stages.
    const int pp = pipeline_size(r), vpp = virtual_chunks(r);
    std::vector<int> per_rank(static_cast<std::size_t>(pp), 0);
    int rest = layers, ranks_left = pp;
    if (r.is_set(first_key)) rest -= r.int32(first_key), --ranks_left;
    if (r.is_set(last_key)) rest -= r.int32(last_key), --ranks_left;
    if (pp < 2 || rest < 0 || (ranks_left > 0 && rest % ranks_left) || (ranks_left == 0 && rest))
      return {};
    for (int p = 0; p < pp; ++p) per_rank[std::size_t(p)] = ranks_left > 0 ? rest / ranks_left : 0;
    if (r.is_set(first_key)) per_rank.front() = r.int32(first_key);
    if (r.is_set(last_key)) per_rank.back() = r.int32(last_key);
    std::vector<int> out(static_cast<std::size_t>(stages));
    for (int p = 0; p < pp; ++p) {
      if (per_rank[std::size_t(p)] < 0 || per_rank[std::size_t(p)] % vpp) return {};
      for (int v = 0; v < vpp; ++v) out[std::size_t(v * pp + p)] = per_rank[std::size_t(p)] / vpp;
    }
    return out;
  }
  if (stages < 1 || layers % stages) return {};
  return std::vector<int>(static_cast<std::size_t>(stages), layers / stages);
}

int microbatches_per_rank(const Recipe& r, int world) {
  const ParallelLayout l = parallel_layout(r, world);
  const int dp = l.dp(), mbs = r.int32(key::train_micro_batch_size);
  const std::int64_t gbs = r.is_set(key::train_global_batch_size)
                               ? r.integer(key::train_global_batch_size)
                               : std::int64_t(mbs) * dp;
  if (dp < 1 || mbs < 1 || gbs % (std::int64_t(mbs) * dp)) return 0;
  return static_cast<int>(gbs / (std::int64_t(mbs) * dp));
}

layers::RecordedLoads routing_trace(const Recipe& r, const layers::ModelConfig& c) {
  layers::RecordedLoads loads =
      load_routing_trace(r.resolve(r.text(key::emulator_routing_trace)), c.num_moe_experts);
  for (int l = 0; l < c.num_layers + c.mtp_num_layers; ++l)
    if (c.is_moe_layer(l) && !loads.by_layer.count(l))
      throw ConfigError(r.name(), key::emulator_routing_trace,
                        loads.source + " has no records of MoE layer " + std::to_string(l) +
                            "; replay a trace of the same model and pipeline layout");
  return loads;
}

std::shared_ptr<const layers::MetaRouting> meta_routing(const Recipe& r,
                                                        const layers::ModelConfig& c,
                                                        int microbatches) {
  if (r.text(key::emulator_mode) != "meta" || c.num_moe_experts == 0) return nullptr;
  const auto seed = std::uint64_t(r.integer(key::emulator_seed));
  if (r.is_set(key::emulator_routing_trace))
    return layers::MetaRouting::replay(c.router, routing_trace(r, c), microbatches);
  if (r.is_set(key::emulator_routing_skew))
    return layers::MetaRouting::skewed(c.router, seed, r.real(key::emulator_routing_skew));
  if (c.router.force_load_balancing) return layers::MetaRouting::forced(c.router, seed);
  return nullptr;
}

bool overlap_grad_reduce(const Recipe& r) {
  // Megatron-Bridge's comm_overlap value, when set, overrides the ddp one.
  return r.is_set(key::comm_overlap_overlap_grad_reduce)
             ? r.flag(key::comm_overlap_overlap_grad_reduce)
             : r.flag(key::ddp_overlap_grad_reduce);
}

bool overlap_param_gather(const Recipe& r) {
  // As overlap_grad_reduce: Megatron-Bridge's comm_overlap value, when set, overrides.
  return r.is_set(key::comm_overlap_overlap_param_gather)
             ? r.flag(key::comm_overlap_overlap_param_gather)
             : r.flag(key::ddp_overlap_param_gather);
}

OptimizerConfig optimizer_config(const Recipe& r) {
  OptimizerConfig c;
  c.adam = r.text(key::optimizer_optimizer) == "adam";
  c.lr = r.real(key::optimizer_lr);
  c.weight_decay = r.real(key::optimizer_weight_decay);
  c.beta1 = r.real(key::optimizer_adam_beta1);
  c.beta2 = r.real(key::optimizer_adam_beta2);
  c.eps = r.real(key::optimizer_adam_eps);
  c.clip_grad = r.real(key::optimizer_clip_grad);
  return c;
}

layers::DdpConfig ddp_config(const Recipe& r, int dp) {
  layers::DdpConfig c{.use_distributed_optimizer = r.flag(key::ddp_use_distributed_optimizer),
                      .overlap_grad_reduce = overlap_grad_reduce(r),
                      .overlap_param_gather = overlap_param_gather(r)};
  // DistributedDataParallel.__init__: max(40M, 1M x DP) elements unless set.
  if (c.overlap_grad_reduce)
    c.bucket_size = r.is_set(key::ddp_bucket_size)
                        ? r.integer(key::ddp_bucket_size)
                        : std::max<std::int64_t>(40'000'000, 1'000'000 * std::int64_t(dp));
  return c;
}

PipelineComm pipeline_comm(const Recipe& r) {
  // Megatron-Bridge training/comm_overlap.py (CommOverlapConfig._get_model_comm_overlap_cfgs):
  // with PP > 1, VPP overlaps the transfers and does not batch them; without VPP, the reverse.
  const bool pp = pipeline_size(r) > 1, vpp = virtual_chunks(r) > 1;
  PipelineComm c{.overlap = pp && vpp, .batch = pp && !vpp};
  if (r.is_set(key::comm_overlap_overlap_p2p_comm))
    c.overlap = r.flag(key::comm_overlap_overlap_p2p_comm);
  if (r.is_set(key::comm_overlap_batch_p2p_comm))
    c.batch = r.flag(key::comm_overlap_batch_p2p_comm);
  return c;
}

ScheduleChoice schedule_choice(const Recipe& r) {
  ScheduleChoice c;
  c.pp = pipeline_size(r);
  c.vpp = virtual_chunks(r);
  c.group = microbatch_group_size(r);
  c.ep_overlap = r.flag(key::comm_overlap_overlap_moe_expert_parallel_comm);
  c.overlap.early_attn_memory_release = r.flag(key::model_ep_overlap_early_attn_memory_release);
  if (c.ep_overlap && c.pp > 1 && c.vpp == 1)
    throw ConfigError(r.name(), key::model_virtual_pipeline_model_parallel_size,
                      "the EP-overlap schedule with PP > 1 needs VPP");
  return c;
}

}  // namespace nodeemu::emu
