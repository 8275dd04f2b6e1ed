// Every recipe key, its type, its default and what it does. Names and defaults are Megatron-Core's
// (TransformerConfig, DistributedDataParallelConfig, OptimizerConfig) as Megatron-Bridge exposes
// them, except in `emulator`, which is NodeEmu's own.
#include <algorithm>

#include "devices/edit_distance.hpp"
#include "emu/recipe.hpp"

namespace nodeemu::emu {

namespace {

using T = ValueType;

std::vector<KeySpec> build() {
  const std::vector<std::string> recompute_modules = {"core_attn",
                                                      "mlp",
                                                      "moe",
                                                      "shared_experts",
                                                      "moe_act",
                                                      "layernorm",
                                                      "mla_up_proj",
                                                      "a2a_overlap_attn",
                                                      "a2a_overlap_post_attn",
                                                      "a2a_overlap_mlp"};
  std::vector<KeySpec> s = {
      // --- where ---
      {"topology",
       T::String,
       "",
       {},
       "topology file, relative to the recipe's folder or its parent; unset = the built-in DGX "
       "H100"},
      {"nodes", T::Int, "1", {}, "emulated nodes of the topology"},
      {"description", T::String, "", {}, "free text"},
      // --- model (TransformerConfig) ---
      {"model.num_layers", T::Int, "", {}, "transformer layers"},
      {"model.hidden_size", T::Int, "", {}, "model width"},
      {"model.num_attention_heads", T::Int, "", {}, "query heads"},
      {"model.num_query_groups", T::Int, "", {}, "KV heads (GQA); unset = num_attention_heads"},
      {"model.kv_channels", T::Int, "", {}, "head dimension; unset = hidden_size / heads"},
      {"model.ffn_hidden_size", T::Int, "", {}, "dense MLP width; unset = 4 x hidden_size"},
      {"model.vocab_size", T::Int, "", {}, "vocabulary size"},
      {"model.rotary_base", T::Float, "10000", {}, "RoPE base"},
      {"model.layernorm_epsilon", T::Float, "1e-5", {}, "RMSNorm epsilon"},
      {"model.init_method_std", T::Float, "0.02", {}, "weight init standard deviation"},
      {"model.bf16", T::Bool, "false", {}, "bf16 activations and weights"},
      {"model.fp16", T::Bool, "false", {}, "fp16 activations and weights"},
      {"model.add_bias_linear", T::Bool, "false", {}, "biases in linear layers (not modelled)"},
      {"model.add_qkv_bias", T::Bool, "false", {}, "bias in the QKV projection (not modelled)"},
      {"model.gradient_accumulation_fusion",
       T::Bool,
       "false",
       {},
       "wgrad GEMMs accumulate into main_grad (else a 16-bit grad, then an add)"},
      // --- which kernels run (layers/kernel_choices.hpp) ---
      {"model.transformer_impl",
       T::String,
       "transformer_engine",
       {"transformer_engine", "local"},
       "TE layer spec, or Megatron's local spec (torch RMSNorm, unfused attention, "
       "SequentialMLP)"},
      {"model.attention_backend",
       T::String,
       "auto",
       {"auto", "fused", "flash", "unfused", "local"},
       "core attention: auto = cuDNN on compute capability >= 9, else flash"},
      {"model.moe_permute_fusion", T::Bool, "false", {}, "TE's fused token permute/unpermute"},
      {"model.bias_activation_fusion", T::Bool, "false", {}, "fused SwiGLU (with probabilities)"},
      {"model.apply_rope_fusion", T::Bool, "false", {}, "TE's fused RoPE"},
      {"model.num_moe_experts", T::Int, "", {}, "routed experts; unset = a dense model"},
      {"model.moe_ffn_hidden_size", T::Int, "", {}, "expert MLP width; unset = ffn_hidden_size"},
      {"model.moe_shared_expert_intermediate_size",
       T::Int,
       "",
       {},
       "shared experts' width; unset = none"},
      {"model.moe_layer_freq", T::Int, "1", {}, "every Nth layer is MoE"},
      {"model.moe_router_topk", T::Int, "2", {}, "experts per token"},
      {"model.moe_router_score_function",
       T::String,
       "softmax",
       {"softmax", "sigmoid"},
       "router scores"},
      {"model.moe_router_pre_softmax", T::Bool, "false", {}, "softmax before top-k"},
      {"model.moe_router_dtype",
       T::String,
       "",
       {"fp32"},
       "the router's GEMMs in fp32; unset = the model's dtype"},
      {"model.moe_router_num_groups", T::Int, "", {}, "expert groups for group-limited routing"},
      {"model.moe_router_group_topk", T::Int, "", {}, "groups each token may use"},
      {"model.moe_router_topk_scaling_factor", T::Float, "", {}, "scales the top-k probabilities"},
      {"model.moe_router_enable_expert_bias", T::Bool, "false", {}, "aux-loss-free expert bias"},
      {"model.moe_router_bias_update_rate", T::Float, "1e-3", {}, "expert bias update rate"},
      {"model.moe_router_load_balancing_type",
       T::String,
       "aux_loss",
       {"aux_loss", "seq_aux_loss", "none"},
       "load-balancing loss"},
      {"model.moe_aux_loss_coeff", T::Float, "0", {}, "aux loss coefficient"},
      {"model.moe_z_loss_coeff", T::Float, "", {}, "router z-loss coefficient"},
      {"model.moe_expert_capacity_factor", T::Float, "", {}, "capacity factor; unset = dropless"},
      {"model.moe_token_drop_policy",
       T::String,
       "probs",
       {"probs", "position"},
       "which tokens a full expert drops"},
      {"model.moe_pad_expert_input_to_capacity",
       T::Bool,
       "false",
       {},
       "pad every expert to its capacity"},
      {"model.moe_router_force_load_balancing",
       T::Bool,
       "false",
       {},
       "uniform routing (needed by meta mode)"},
      {"model.moe_token_dispatcher_type",
       T::String,
       "allgather",
       {"allgather", "alltoall", "flex"},
       "token dispatcher"},
      {"model.moe_flex_dispatcher_backend",
       T::String,
       "deepep",
       {"deepep", "hybridep"},
       "flex dispatcher backend"},
      {"model.moe_shared_expert_overlap", T::Bool, "false", {}, "shared experts on a side stream"},
      {"model.moe_grouped_gemm",
       T::Bool,
       "false",
       {},
       "experts as one grouped GEMM (TEGroupedMLP); false: a GEMM per expert (SequentialMLP)"},
      {"model.mtp_num_layers", T::Int, "", {}, "multi-token prediction layers"},
      {"model.high_priority_a2a_comm_stream",
       T::Bool,
       "false",
       {},
       "the EP-overlap comm stream at CUDA's high priority (its kernels get SMs first)"},
      {"model.ep_overlap_early_attn_memory_release",
       T::Bool,
       "false",
       {},
       "run attention's backward before the mlp forward in an overlapped pair"},
      {"model.tensor_model_parallel_size", T::Int, "1", {}, "TP"},
      {"model.pipeline_model_parallel_size", T::Int, "1", {}, "PP"},
      {"model.virtual_pipeline_model_parallel_size",
       T::Int,
       "",
       {},
       "VPP: model chunks per pipeline rank"},
      {"model.microbatch_group_size_per_vp_stage",
       T::Int,
       "",
       {},
       "micro-batches run together through each virtual stage; unset = "
       "pipeline_model_parallel_size (depth-first)"},
      {"model.context_parallel_size", T::Int, "1", {}, "CP"},
      {"model.expert_model_parallel_size", T::Int, "1", {}, "EP"},
      {"model.expert_tensor_parallel_size", T::Int, "", {}, "ETP; unset = TP"},
      {"model.recompute_granularity", T::String, "", {"full", "selective"}, "activation recompute"},
      {"model.recompute_method", T::String, "", {"uniform", "block"}, "full recompute method"},
      {"model.recompute_num_layers", T::Int, "", {}, "full recompute layers"},
      {"model.recompute_modules", T::StringList, "", recompute_modules,
       "selective recompute modules"},
      {"model.cuda_graph_impl",
       T::String,
       "none",
       {"none", "local", "transformer_engine"},
       "CUDA graphs"},
      {"model.cuda_graph_scope",
       T::StringList,
       "",
       {"attn", "mlp", "moe", "moe_router", "moe_preprocess", "mamba", "full_iteration"},
       "what the CUDA graphs capture; unset = whole layers"},
      {"model.cpu_offloading", T::Bool, "false", {}, "whole-layer activation offload"},
      {"model.fine_grained_activation_offloading",
       T::Bool,
       "false",
       {},
       "module-level activation offload"},
      {"model.offload_modules",
       T::StringList,
       "",
       {"attn_norm", "qkv_linear", "core_attn", "attn_proj", "mlp_norm", "expert_fc1", "moe_act"},
       "modules whose input is offloaded"},
      {"model.offload_tensors",
       T::StringList,
       "",
       {"dispatched_input", "pre_mlp_layernorm_output"},
       "LoongForge tensors to offload"},
      {"model.activation_offload_fraction",
       T::Float,
       "1.0",
       {},
       "share of eligible groups offloaded, by count"},
      {"model.min_offloaded_tensor_size",
       T::Int,
       "1048576",
       {},
       "smallest tensor offloaded, elements"},
      {"model.max_inflight_offloads", T::Int, "", {}, "bound on groups' D2H copies in flight"},
      {"model.delta_offload_bytes_across_pp_ranks",
       T::Int,
       "0",
       {},
       "pipeline rank p keeps p x this many bytes more on the GPU"},
      // --- comm_overlap (CommOverlapConfig) ---
      {"comm_overlap.overlap_moe_expert_parallel_comm",
       T::Bool,
       "false",
       {},
       "the combined 1F1B with EP A2A overlap"},
      {"comm_overlap.delay_wgrad_compute",
       T::Bool,
       "false",
       {},
       "weight gradients after the dgrad, separately"},
      {"comm_overlap.tp_comm_overlap",
       T::Bool,
       "false",
       {},
       "TP comm overlap (TP = 1 here: no effect)"},
      {"comm_overlap.overlap_grad_reduce",
       T::Bool,
       "",
       {},
       "Megatron-Bridge's override of ddp.overlap_grad_reduce"},
      {"comm_overlap.overlap_p2p_comm",
       T::Bool,
       "",
       {},
       "post pipeline receives a step ahead (default: on with VPP, as Bridge)"},
      {"comm_overlap.batch_p2p_comm",
       T::Bool,
       "",
       {},
       "one batch_isend_irecv per call, then a device sync (default: on with PP, no VPP)"},
      // --- train ---
      {"train.global_batch_size", T::Int, "", {}, "sequences per step"},
      {"train.micro_batch_size", T::Int, "1", {}, "sequences per micro-batch"},
      {"train.seq_length", T::Int, "", {}, "tokens per sequence"},
      {"train.train_iters", T::Int, "4", {}, "iterations"},
      // --- ddp ---
      {"ddp.overlap_grad_reduce", T::Bool, "false", {}, "overlap the gradient all-reduce"},
      {"ddp.overlap_param_gather", T::Bool, "false", {}, "overlap the parameter all-gather"},
      {"ddp.use_distributed_optimizer", T::Bool, "false", {}, "shard optimizer state"},
      {"ddp.grad_reduce_in_fp32", T::Bool, "true", {}, "reduce gradients in fp32"},
      // --- optimizer ---
      {"optimizer.optimizer", T::String, "adam", {"adam", "sgd"}, "AdamW (decoupled decay) or SGD"},
      {"optimizer.lr", T::Float, "1e-3", {}, "learning rate"},
      {"optimizer.weight_decay", T::Float, "0.01", {}, "decoupled weight decay"},
      {"optimizer.adam_beta1", T::Float, "0.9", {}, "Adam beta1"},
      {"optimizer.adam_beta2", T::Float, "0.999", {}, "Adam beta2"},
      {"optimizer.adam_eps", T::Float, "1e-8", {}, "Adam epsilon"},
      // --- emulator (NodeEmu) ---
      {"emulator.mode",
       T::String,
       "functional",
       {"functional", "meta"},
       "real numerics, or shapes only"},
      {"emulator.seed", T::Int, "1234", {}, "weights and data"},
      {"emulator.bindpcie",
       T::Bool,
       "false",
       {},
       "bind each rank to its GPU's PCIe-local NUMA node"},
      {"emulator.cuda_device_max_connections", T::Int, "8", {}, "hardware queues per GPU (1..32)"},
      {"emulator.torch_version", T::String, "", {}, "emulated PyTorch version; unset = new enough"},
      {"emulator.te_version",
       T::String,
       "",
       {},
       "emulated TransformerEngine version; unset = new enough"},
      {"emulator.warmup_iterations", T::Int, "1", {}, "iterations left out of the steady mean"},
      {"emulator.pipeline_layout",
       T::IntList,
       "",
       {},
       "layers per virtual stage, in stage order; unset = even"},
      {"emulator.gpus_per_node",
       T::Int,
       "",
       {},
       "use the first N GPUs of each node; unset = all of the topology's"},
      {"emulator.workers_per_device",
       T::Int,
       "0",
       {},
       "worker threads per GPU; 0 = share the cores"},
      {"emulator.thread_budget", T::Int, "0", {}, "worker threads running at once; 0 = the cores"},
      {"emulator.collective_timeout_s",
       T::Float,
       "600",
       {},
       "wall seconds before a stuck collective is reported"},
  };
  return s;
}

std::string last_part(const std::string& key) {
  const auto dot = key.rfind('.');
  return dot == std::string::npos ? key : key.substr(dot + 1);
}

}  // namespace

const std::vector<KeySpec>& recipe_schema() {
  static const std::vector<KeySpec> schema = build();
  return schema;
}

const KeySpec* find_key(const std::string& key) {
  for (const auto& k : recipe_schema())
    if (k.key == key) return &k;
  return nullptr;
}

std::string nearest_key(const std::string& key) {
  std::string best;
  std::size_t best_d = std::string::npos;
  const std::string tail = last_part(key);
  for (const auto& k : recipe_schema()) {
    // A right name in the wrong section costs 1; otherwise the edit distance of the names.
    const std::size_t d =
        std::min(edit_distance(key, k.key), edit_distance(tail, last_part(k.key)) + 1);
    if (d < best_d) {
      best_d = d;
      best = k.key;
    }
  }
  // Farther than a third of the name is no suggestion.
  return best_d <= std::max<std::size_t>(2, tail.size() / 3) ? best : "";
}

}  // namespace nodeemu::emu
